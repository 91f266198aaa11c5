//! An upstream HTTP/1.1 server that answers with its own name.
//!
//! Routing tests need to know *where* each request went, not just that it succeeded: every response body
//! (and the `x-upstream` header) is the upstream's name, so a [`crate::TrafficReport`]'s `by_body` shows the
//! split between upstreams directly, and [`Upstream::hits`] counts what arrived here.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

struct Shared {
    name: String,
    hits: AtomicU64,
    status: AtomicU16,
    /// Milliseconds to wait before answering (0: answer at once).
    delay_ms: AtomicU64,
    /// Headers of the last request (lowercase names), for tests of what the proxy forwards.
    last_headers: std::sync::Mutex<Vec<(String, String)>>,
    /// Answer 400 to a missing or syntactically invalid `Host` (as strict servers do).
    strict_host: AtomicBool,
    last_host: Mutex<Option<String>>,
}

/// A running upstream on `127.0.0.1:<ephemeral>`; stopped (listener and every connection closed) by
/// [`Upstream::stop`] or on drop.
pub struct Upstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

impl Upstream {
    /// Starts an upstream named `name`: every request gets `200`, body `name`, header `x-upstream: name`.
    pub async fn start(name: &str) -> Result<Upstream> {
        Self::start_with(name, false).await
    }

    /// Like [`Upstream::start`], but speaking only HTTP/2 with prior knowledge (h2c, as gRPC
    /// servers do): an HTTP/1.1 request fails.
    pub async fn start_h2c(name: &str) -> Result<Upstream> {
        Self::start_with(name, true).await
    }

    /// Like [`Upstream::start`], but on `addr` (a loopback address such as `127.0.0.2:0`): DNS
    /// tests need upstreams that differ only by IP, since a DNS answer carries no port.
    pub async fn start_on(name: &str, addr: SocketAddr) -> Result<Upstream> {
        Self::bind(name, false, addr).await
    }

    async fn start_with(name: &str, h2c: bool) -> Result<Upstream> {
        Self::bind(name, h2c, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    async fn bind(name: &str, h2c: bool, addr: SocketAddr) -> Result<Upstream> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("bind upstream on {addr}"))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            hits: AtomicU64::new(0),
            status: AtomicU16::new(200),
            delay_ms: AtomicU64::new(0),
            last_headers: std::sync::Mutex::new(Vec::new()),
            strict_host: AtomicBool::new(false),
            last_host: Mutex::new(None),
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone(), h2c));
        Ok(Upstream {
            addr,
            shared,
            task: Some(task),
        })
    }

    /// The address it listens on (always loopback).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The name it answers with.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Requests received so far (every request, whatever status was answered).
    pub fn hits(&self) -> u64 {
        self.shared.hits.load(Ordering::SeqCst)
    }

    /// Changes the status code of subsequent responses (e.g. `503` to simulate a failing backend).
    pub fn set_status(&self, status: u16) {
        self.shared.status.store(status, Ordering::SeqCst);
    }

    /// The value of header `name` in the last request received, if it had one; `:path` is the
    /// request target (path and query) as received.
    pub fn last_header(&self, name: &str) -> Option<String> {
        let h = self.shared.last_headers.lock().expect("not poisoned");
        h.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }

    /// Delays subsequent responses by `delay` (a slow backend: requests pile up, so connection
    /// limits and circuit breakers trip).
    pub fn set_delay(&self, delay: std::time::Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Whether to answer `400` to requests whose `Host` is missing or not a valid hostname
    /// (`[a-z0-9.-]` labels, optional `:port`), like strict HTTP servers do: e.g. a health check
    /// sending `Host: default/web`.
    pub fn set_strict_host(&self, strict: bool) {
        self.shared.strict_host.store(strict, Ordering::SeqCst);
    }

    /// The `Host` header of the last request (`None` before any, or if it had none).
    pub fn last_host(&self) -> Option<String> {
        self.shared
            .last_host
            .lock()
            .expect("last_host lock")
            .clone()
    }

    /// Closes the listener and every open connection, and waits until they are closed, so that a
    /// following connection attempt is refused. Idempotent.
    pub async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Owns the listener and, through the `JoinSet`, every connection task: aborting this task drops both,
/// which closes all sockets at once.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, h2c: bool) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let shared = shared.clone();
                        // The request target as `:path` (as HTTP/2 names it), for rewrite tests.
                        let target = req.uri().path_and_query().map_or("", |p| p.as_str()).to_owned();
                        let headers: Vec<(String, String)> = std::iter::once((":path".to_owned(), target))
                            .chain(req.headers().iter().map(|(k, v)| {
                                (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned())
                            }))
                            .collect();
                        async move {
                            *shared.last_headers.lock().expect("not poisoned") = headers;
                            shared.hits.fetch_add(1, Ordering::SeqCst);
                            let delay = shared.delay_ms.load(Ordering::SeqCst);
                            if delay > 0 {
                                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                            }
                            let host = req
                                .headers()
                                .get(hyper::header::HOST)
                                .and_then(|h| h.to_str().ok())
                                .map(str::to_owned);
                            let valid = host.as_deref().is_some_and(valid_host);
                            *shared.last_host.lock().expect("last_host lock") = host;
                            let status = if !valid && shared.strict_host.load(Ordering::SeqCst) {
                                400
                            } else {
                                shared.status.load(Ordering::SeqCst)
                            };
                            let resp = hyper::Response::builder()
                                .status(status)
                                .header("x-upstream", shared.name.as_str())
                                .header(hyper::header::CONTENT_TYPE, "text/plain")
                                .body(Full::new(Bytes::from(shared.name.clone())))
                                .expect("static response parts are valid");
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    if h2c {
                        let _ = hyper::server::conn::http2::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        )
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .keep_alive(true)
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    }
                });
            }
            // Reap finished connections so the set does not grow over a long test.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// `name[:port]` with `name` made of dot-separated `[A-Za-z0-9-]` labels.
fn valid_host(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (host, None),
    };
    port.is_none_or(|p| p.parse::<u16>().is_ok())
        && !name.is_empty()
        && name
            .split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_with_name_and_counts() {
        let mut up = Upstream::start("alpha").await.unwrap();
        let (status, body) = crate::http_get(up.addr(), "/x").await.unwrap();
        assert_eq!((status, body.as_str()), (200, "alpha"));
        up.set_status(503);
        let (status, body) = crate::http_get(up.addr(), "/y").await.unwrap();
        assert_eq!((status, body.as_str()), (503, "alpha"));
        assert_eq!(up.hits(), 2);
        up.set_status(200);
        up.set_strict_host(true);
        assert!(valid_host("web.default:8080") && !valid_host("default/web"));
        let (status, _) = crate::http_get(up.addr(), "/z").await.unwrap();
        assert_eq!(status, 200, "http_get sends a valid Host");
        up.stop().await;
        assert!(tokio::net::TcpStream::connect(up.addr()).await.is_err());
    }
}
