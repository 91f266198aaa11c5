//! A tiny rate-limit service speaking Envoy's `envoy.service.ratelimit.v3.RateLimitService`
//! (what envoyproxy/ratelimit serves), for end-to-end tests of global rate limits.
//!
//! It counts requests per (domain, descriptor) and answers `OVER_LIMIT` once a descriptor has
//! been asked about more than `limit` times; no time windows, so tests are exact. It can be
//! told to fail (`UNAVAILABLE`), as a broken service would, to test Envoy's failure mode.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

#[derive(Default)]
struct Shared {
    limit: u32,
    failing: AtomicBool,
    /// `domain|key=value,key=value` → times asked.
    counts: Mutex<BTreeMap<String, u64>>,
    calls: Mutex<u64>,
}

struct Svc(Arc<Shared>);

#[tonic::async_trait]
impl RateLimitService for Svc {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        *self.0.calls.lock().unwrap() += 1;
        if self.0.failing.load(Ordering::SeqCst) {
            return Err(tonic::Status::unavailable("told to fail"));
        }
        let req = request.into_inner();
        let hits = u64::from(req.hits_addend.max(1));
        let mut counts = self.0.counts.lock().unwrap();
        let statuses: Vec<DescriptorStatus> = req
            .descriptors
            .iter()
            .map(|d| {
                let entries: Vec<String> = d
                    .entries
                    .iter()
                    .map(|e| format!("{}={}", e.key, e.value))
                    .collect();
                let key = format!("{}|{}", req.domain, entries.join(","));
                let n = counts.entry(key).or_default();
                *n += hits;
                let limit = u64::from(self.0.limit);
                DescriptorStatus {
                    code: if *n > limit {
                        Code::OverLimit
                    } else {
                        Code::Ok
                    } as i32,
                    current_limit: Some(RateLimit {
                        name: String::new(),
                        requests_per_unit: self.0.limit,
                        unit: Unit::Hour as i32,
                    }),
                    limit_remaining: u32::try_from(limit.saturating_sub(*n)).unwrap_or(0),
                    duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
                        seconds: 3600,
                        nanos: 0,
                    }),
                    ..Default::default()
                }
            })
            .collect();
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            ..Default::default()
        }))
    }
}

/// A running rate-limit service on `127.0.0.1:<ephemeral>` (HTTP/2, plaintext); stopped on drop.
pub struct RateLimitServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl RateLimitServer {
    /// Starts a service allowing each descriptor `limit` times, then answering OVER_LIMIT.
    pub async fn start(limit: u32) -> Result<RateLimitServer> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind rate-limit service on 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            limit,
            ..Default::default()
        });
        let svc = RateLimitServiceServer::new(Svc(shared.clone()));
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Ok(RateLimitServer { addr, shared, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Calls received (including failed ones).
    pub fn calls(&self) -> u64 {
        *self.shared.calls.lock().unwrap()
    }

    /// Times each `domain|key=value,...` descriptor was asked about.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.shared.counts.lock().unwrap().clone()
    }

    /// From now on answer every call with `UNAVAILABLE` (`false`: back to counting).
    pub fn set_failing(&self, failing: bool) {
        self.shared.failing.store(failing, Ordering::SeqCst);
    }
}

impl Drop for RateLimitServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
