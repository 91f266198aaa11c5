//! A minimal one-shot HTTP/1.1 GET, used for Envoy's admin API.
//!
//! Admin calls are rare and must never share state with the [`crate::Traffic`] clients under test, so each
//! call opens its own connection with hyper's low-level `client::conn` API: no pool, no hidden retries, and
//! a hard timeout so a wedged Envoy fails the test instead of hanging it.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;

/// How long one admin request may take, connect to last body byte.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// `GET http://{addr}{path_and_query}` on a fresh connection; returns the status code and body as text.
pub async fn http_get(addr: SocketAddr, path_and_query: &str) -> Result<(u16, String)> {
    tokio::time::timeout(ADMIN_TIMEOUT, get_inner(addr, path_and_query))
        .await
        .with_context(|| {
            format!("GET http://{addr}{path_and_query} timed out after {ADMIN_TIMEOUT:?}")
        })?
        .with_context(|| format!("GET http://{addr}{path_and_query}"))
}

async fn get_inner(addr: SocketAddr, path_and_query: &str) -> Result<(u16, String)> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn_task = tokio::spawn(conn);
    let req = hyper::Request::get(path_and_query)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    conn_task.abort();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `POST http://{addr}{path}` with a JSON body on a fresh connection (e.g. etcd's `/v3/...` JSON
/// gateway); returns the status code and body as text.
pub async fn http_post_json(addr: SocketAddr, path: &str, body: &str) -> Result<(u16, String)> {
    let inner = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let conn_task = tokio::spawn(conn);
        let req = hyper::Request::post(path)
            .header(hyper::header::HOST, addr.to_string())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        conn_task.abort();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(ADMIN_TIMEOUT, inner)
        .await
        .with_context(|| format!("POST http://{addr}{path} timed out after {ADMIN_TIMEOUT:?}"))?
        .with_context(|| format!("POST http://{addr}{path}"))
}

/// `METHOD http://{addr}{path}` with an optional JSON body on a fresh connection (e.g. Ballast's
/// `PUT /catalog/v1/...`); returns the status code and body as text.
pub async fn http_json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String)> {
    let inner = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let conn_task = tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, addr.to_string())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default().to_owned())))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        conn_task.abort();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(ADMIN_TIMEOUT, inner)
        .await
        .with_context(|| format!("{method} http://{addr}{path} timed out after {ADMIN_TIMEOUT:?}"))?
        .with_context(|| format!("{method} http://{addr}{path}"))
}
