//! A tiny external authorization service speaking Envoy's gRPC
//! `envoy.service.auth.v3.Authorization/Check` (what Envoy's `ext_authz` filter asks with a
//! `grpc_service`), for end-to-end tests of SecurityPolicy `extAuth.grpc`.
//!
//! The rule is fixed so tests are exact: a request carrying `x-allow: yes` is allowed and gets
//! `x-auth-user: grpc-checked` added for the upstream; any other request is denied with 403 and
//! the body `denied by ext_authz`. Every check is counted. [`ExtAuthzServer::stop`] shuts the
//! service down for real (connections closed, port no longer listening), to test what Envoy
//! does when the service cannot be asked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::auth::v3::authorization_server::{
    Authorization, AuthorizationServer,
};
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::{
    CheckRequest, CheckResponse, DeniedHttpResponse, OkHttpResponse,
};
use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode};
use envoy_types::pb::google::rpc::Status;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The request header (and value) that gets a request allowed.
pub const EXT_AUTHZ_ALLOW_HEADER: (&str, &str) = ("x-allow", "yes");
/// The header the service adds to allowed requests, and its value.
pub const EXT_AUTHZ_USER_HEADER: (&str, &str) = ("x-auth-user", "grpc-checked");

#[derive(Default)]
struct Counts {
    allowed: AtomicU64,
    denied: AtomicU64,
}

struct Svc(Arc<Counts>);

/// gRPC status codes used in `CheckResponse.status` (google.rpc.Code).
const OK: i32 = 0;
const PERMISSION_DENIED: i32 = 7;

#[tonic::async_trait]
impl Authorization for Svc {
    async fn check(
        &self,
        request: tonic::Request<CheckRequest>,
    ) -> Result<tonic::Response<CheckResponse>, tonic::Status> {
        let req = request.into_inner();
        // Envoy sends request headers with lower-case names in `headers`.
        let allow = req
            .attributes
            .as_ref()
            .and_then(|a| a.request.as_ref())
            .and_then(|r| r.http.as_ref())
            .and_then(|h| h.headers.get(EXT_AUTHZ_ALLOW_HEADER.0))
            .is_some_and(|v| v == EXT_AUTHZ_ALLOW_HEADER.1);
        let response = if allow {
            self.0.allowed.fetch_add(1, Ordering::SeqCst);
            CheckResponse {
                status: Some(Status {
                    code: OK,
                    ..Default::default()
                }),
                http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                    headers: vec![HeaderValueOption {
                        header: Some(HeaderValue {
                            key: EXT_AUTHZ_USER_HEADER.0.into(),
                            value: EXT_AUTHZ_USER_HEADER.1.into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                })),
                ..Default::default()
            }
        } else {
            self.0.denied.fetch_add(1, Ordering::SeqCst);
            CheckResponse {
                status: Some(Status {
                    code: PERMISSION_DENIED,
                    message: "x-allow: yes missing".into(),
                    ..Default::default()
                }),
                http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                    status: Some(HttpStatus {
                        code: StatusCode::Forbidden as i32,
                    }),
                    body: "denied by ext_authz".into(),
                    ..Default::default()
                })),
                ..Default::default()
            }
        };
        Ok(tonic::Response::new(response))
    }
}

/// A running ext_authz service on `127.0.0.1:<ephemeral>` (HTTP/2, plaintext); stopped on
/// [`stop`](Self::stop) or drop.
pub struct ExtAuthzServer {
    addr: SocketAddr,
    counts: Arc<Counts>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl ExtAuthzServer {
    pub async fn start() -> Result<ExtAuthzServer> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind ext_authz service on 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let svc = AuthorizationServer::new(Svc(counts.clone()));
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            // With a shutdown signal tonic closes every connection (GOAWAY) and returns once
            // they are gone; without one, aborting would leave connection tasks serving.
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = rx.await;
                    },
                )
                .await;
        });
        Ok(ExtAuthzServer {
            addr,
            counts,
            shutdown: Some(tx),
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Checks answered so far (allowed + denied).
    pub fn checks(&self) -> u64 {
        self.allowed() + self.denied()
    }

    pub fn allowed(&self) -> u64 {
        self.counts.allowed.load(Ordering::SeqCst)
    }

    pub fn denied(&self) -> u64 {
        self.counts.denied.load(Ordering::SeqCst)
    }

    /// Stops listening and closes every connection (waits at most 10 s for clients to let go
    /// of them); afterwards connecting to [`addr`](Self::addr) is refused.
    pub async fn stop(&mut self) -> Result<()> {
        let Some(tx) = self.shutdown.take() else {
            return Ok(()); // already stopped
        };
        let _ = tx.send(());
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .context("ext_authz service connections still open 10 s after shutdown")?
            .context("ext_authz service task")?;
        Ok(())
    }
}

impl Drop for ExtAuthzServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.task.abort();
    }
}
