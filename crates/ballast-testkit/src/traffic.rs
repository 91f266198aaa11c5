//! Continuous HTTP traffic that counts every outcome.
//!
//! The headline proofs of Ballast are "zero non-2xx while X happens" (control plane killed, xDS connection
//! cut, clusters swapped). [`Traffic`] runs K concurrent keep-alive client loops against an Envoy listener
//! and counts every response by status and body, and every connection-level error as a failure too — a
//! refused connection is as much an outage as a `503`. Loops are always bounded (a maximum duration, and
//! optionally a maximum request count) so a forgotten `stop` cannot hang a test, and they pause briefly
//! between requests so a 2-core CI machine still has room for Envoy and the control plane.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Distinct response bodies kept in [`TrafficReport::by_body`]; the rest are counted under `"<other>"`.
const MAX_DISTINCT_BODIES: usize = 32;
/// Bodies are truncated to this many characters before counting.
const MAX_BODY_KEY: usize = 80;
/// Failures (non-2xx or errors) described in [`TrafficReport::failure_samples`].
const MAX_FAILURE_SAMPLES: usize = 20;

/// What to send, how hard, and for how long at most.
#[derive(Clone, Debug)]
pub struct TrafficConfig {
    /// Where to connect (typically an Envoy listener); requests go to `http://{target}{path}`.
    pub target: SocketAddr,
    /// `(Host header, path)` pairs, used round-robin across all loops. Must not be empty.
    pub requests: Vec<(String, String)>,
    /// Number of concurrent client loops, each with its own keep-alive connection pool.
    pub concurrency: usize,
    /// Sleep between two requests of one loop, so traffic does not hog the CPU. Default 2 ms.
    pub pause: Duration,
    /// Stop after this many requests in total (all loops together). Default: unbounded by count.
    pub max_requests: Option<u64>,
    /// Hard bound on how long the loops run even if nobody calls [`Traffic::stop`]. Default 120 s.
    pub max_duration: Duration,
    /// One request (connect + response + body) taking longer than this counts as an error. Default 5 s.
    pub request_timeout: Duration,
    /// Reuse connections (default true, like real clients). With `false` every request opens a new
    /// connection: slower, but immune to the benign race where Envoy closes an idle keep-alive connection
    /// (e.g. while draining a replaced listener) just as the next request is written, which hyper reports
    /// as an error ("connection closed before message completed").
    pub keep_alive: bool,
}

impl TrafficConfig {
    /// Traffic to `target` with one `(host, path)`; 2 loops, 2 ms pause, at most 120 s.
    pub fn new(target: SocketAddr, host: &str, path: &str) -> TrafficConfig {
        Self::with_requests(target, vec![(host.to_owned(), path.to_owned())])
    }

    /// Traffic to `target` cycling over `(host, path)` pairs; 2 loops, 2 ms pause, at most 120 s.
    pub fn with_requests(target: SocketAddr, requests: Vec<(String, String)>) -> TrafficConfig {
        TrafficConfig {
            target,
            requests,
            concurrency: 2,
            pause: Duration::from_millis(2),
            max_requests: None,
            max_duration: Duration::from_secs(120),
            request_timeout: Duration::from_secs(5),
            keep_alive: true,
        }
    }

    /// Sets [`TrafficConfig::concurrency`].
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Sets [`TrafficConfig::pause`].
    pub fn pause(mut self, d: Duration) -> Self {
        self.pause = d;
        self
    }

    /// Sets [`TrafficConfig::max_requests`].
    pub fn max_requests(mut self, n: u64) -> Self {
        self.max_requests = Some(n);
        self
    }

    /// Sets [`TrafficConfig::max_duration`].
    pub fn max_duration(mut self, d: Duration) -> Self {
        self.max_duration = d;
        self
    }

    /// Sets [`TrafficConfig::keep_alive`].
    pub fn keep_alive(mut self, on: bool) -> Self {
        self.keep_alive = on;
        self
    }

    /// Sets [`TrafficConfig::request_timeout`].
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }
}

/// Counts of everything that happened. `total == ok_2xx + non_2xx + errors`.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct TrafficReport {
    /// Requests attempted and finished (successfully or not).
    pub total: u64,
    /// Responses with a 2xx status.
    pub ok_2xx: u64,
    /// Responses with any other status.
    pub non_2xx: u64,
    /// Requests that got no response: connect refused/reset, timeouts, protocol errors.
    pub errors: u64,
    /// Responses per status code.
    pub by_status: BTreeMap<u16, u64>,
    /// Responses per body (truncated; bounded number of distinct keys) — with [`crate::Upstream`]s this is
    /// the per-upstream split.
    pub by_body: BTreeMap<String, u64>,
    /// The first few failures (non-2xx and errors), with request number, time since start and target.
    pub failure_samples: Vec<String>,
}

impl TrafficReport {
    /// Non-2xx responses plus errors.
    pub fn failures(&self) -> u64 {
        self.non_2xx + self.errors
    }

    /// Panics with the whole report unless at least one request was made and every one got a 2xx.
    pub fn assert_all_ok(&self) {
        assert!(
            self.total > 0 && self.failures() == 0,
            "expected only 2xx responses:\n{self}"
        );
    }

    fn record(&mut self, sample: impl FnOnce() -> String, outcome: Outcome) {
        self.total += 1;
        match outcome {
            Outcome::Response { status, body } => {
                *self.by_status.entry(status).or_default() += 1;
                let mut key: String = body.chars().take(MAX_BODY_KEY).collect();
                if !self.by_body.contains_key(&key) && self.by_body.len() >= MAX_DISTINCT_BODIES {
                    key = "<other>".to_owned();
                }
                if (200..300).contains(&status) {
                    self.ok_2xx += 1;
                } else {
                    self.non_2xx += 1;
                    if self.failure_samples.len() < MAX_FAILURE_SAMPLES {
                        let s = format!("{}: status {status}, body {key:?}", sample());
                        self.failure_samples.push(s);
                    }
                }
                *self.by_body.entry(key).or_default() += 1;
            }
            Outcome::Error(msg) => {
                self.errors += 1;
                if self.failure_samples.len() < MAX_FAILURE_SAMPLES {
                    self.failure_samples
                        .push(format!("{}: error: {msg}", sample()));
                }
            }
        }
    }
}

impl fmt::Display for TrafficReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "traffic: total={} ok_2xx={} non_2xx={} errors={}",
            self.total, self.ok_2xx, self.non_2xx, self.errors
        )?;
        writeln!(f, "  by status: {:?}", self.by_status)?;
        writeln!(f, "  by body:   {:?}", self.by_body)?;
        if !self.failure_samples.is_empty() {
            writeln!(f, "  first failures:")?;
            for s in &self.failure_samples {
                writeln!(f, "    {s}")?;
            }
        }
        Ok(())
    }
}

enum Outcome {
    Response { status: u16, body: String },
    Error(String),
}

/// Running traffic. Stop it with [`Traffic::stop`] (or let it reach its bounds and [`Traffic::wait`]);
/// dropping it aborts the loops.
pub struct Traffic {
    stop_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    report: Arc<Mutex<TrafficReport>>,
}

impl Traffic {
    /// Starts `config.concurrency` loops. Must be called inside a tokio runtime.
    ///
    /// # Panics
    /// If `config.requests` is empty or `config.concurrency` is 0.
    pub fn start(config: TrafficConfig) -> Traffic {
        assert!(
            !config.requests.is_empty(),
            "TrafficConfig.requests is empty"
        );
        assert!(config.concurrency > 0, "TrafficConfig.concurrency is 0");
        let (stop_tx, _) = watch::channel(false);
        let report = Arc::new(Mutex::new(TrafficReport::default()));
        let seq = Arc::new(AtomicU64::new(0));
        let config = Arc::new(config);
        let started = Instant::now();
        let deadline = started + config.max_duration;
        let tasks = (0..config.concurrency)
            .map(|_| {
                tokio::spawn(client_loop(
                    config.clone(),
                    seq.clone(),
                    report.clone(),
                    stop_tx.subscribe(),
                    started,
                    deadline,
                ))
            })
            .collect();
        Traffic {
            stop_tx,
            tasks,
            report,
        }
    }

    /// The counts so far, while traffic keeps running (e.g. to wait until some requests succeeded).
    pub fn report(&self) -> TrafficReport {
        self.report.lock().expect("traffic report lock").clone()
    }

    /// True when every loop has ended (bounds reached).
    pub fn is_finished(&self) -> bool {
        self.tasks.iter().all(|t| t.is_finished())
    }

    /// Stops the loops after their in-flight request (each bounded by the request timeout) and returns the
    /// final counts. In-flight requests are completed and counted, never aborted into fake errors.
    pub async fn stop(mut self) -> TrafficReport {
        let _ = self.stop_tx.send(true);
        self.join().await
    }

    /// Waits until the loops end by themselves (`max_requests` or `max_duration`), then returns the counts.
    pub async fn wait(mut self) -> TrafficReport {
        self.join().await
    }

    async fn join(&mut self) -> TrafficReport {
        for t in self.tasks.drain(..) {
            if let Err(e) = t.await
                && e.is_panic()
            {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        self.report()
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn client_loop(
    config: Arc<TrafficConfig>,
    seq: Arc<AtomicU64>,
    report: Arc<Mutex<TrafficReport>>,
    mut stop_rx: watch::Receiver<bool>,
    started: Instant,
    deadline: Instant,
) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(config.request_timeout));
    let mut builder = Client::builder(TokioExecutor::new());
    if !config.keep_alive {
        builder.pool_max_idle_per_host(0);
    }
    let client: Client<HttpConnector, Empty<Bytes>> = builder.build(connector);
    loop {
        if *stop_rx.borrow() || Instant::now() >= deadline {
            return;
        }
        let n = seq.fetch_add(1, Ordering::SeqCst);
        if config.max_requests.is_some_and(|max| n >= max) {
            return;
        }
        let (host, path) = &config.requests[(n % config.requests.len() as u64) as usize];
        let outcome = match tokio::time::timeout(
            config.request_timeout,
            one_request(&client, config.target, host, path),
        )
        .await
        {
            Ok(outcome) => outcome,
            Err(_) => Outcome::Error(format!("timed out after {:?}", config.request_timeout)),
        };
        let at = started.elapsed();
        report.lock().expect("traffic report lock").record(
            || format!("#{n} +{:.3}s {host}{path}", at.as_secs_f64()),
            outcome,
        );
        if !config.pause.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(config.pause) => {}
                _ = stop_rx.changed() => {}
            }
        }
    }
}

async fn one_request(
    client: &Client<HttpConnector, Empty<Bytes>>,
    target: SocketAddr,
    host: &str,
    path: &str,
) -> Outcome {
    let req = match hyper::Request::get(format!("http://{target}{path}"))
        .header(hyper::header::HOST, host)
        .body(Empty::new())
    {
        Ok(r) => r,
        Err(e) => return Outcome::Error(format!("bad request: {e}")),
    };
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => return Outcome::Error(error_chain(&e)),
    };
    let status = resp.status().as_u16();
    match resp.into_body().collect().await {
        Ok(b) => Outcome::Response {
            status,
            body: String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        },
        Err(e) => Outcome::Error(format!("status {status}, body: {}", error_chain(&e))),
    }
}

/// hyper's errors say little at the top level ("client error (Connect)"); the cause is in the chain.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Upstream;

    #[tokio::test]
    async fn counts_bodies_statuses_and_max_requests() {
        let a = Upstream::start("a").await.unwrap();
        let report = Traffic::start(
            TrafficConfig::new(a.addr(), "example.com", "/")
                .concurrency(3)
                .max_requests(30),
        )
        .wait()
        .await;
        report.assert_all_ok();
        assert_eq!(report.total, 30);
        assert_eq!(report.by_body.get("a"), Some(&30));
        assert_eq!(report.by_status.get(&200), Some(&30));
        assert_eq!(a.hits(), 30);
    }

    #[tokio::test]
    async fn non_2xx_and_refused_are_failures() {
        let a = Upstream::start("a").await.unwrap();
        a.set_status(503);
        let report = Traffic::start(TrafficConfig::new(a.addr(), "h", "/").max_requests(5))
            .wait()
            .await;
        assert_eq!((report.non_2xx, report.failures()), (5, 5));
        assert!(report.failure_samples[0].contains("503"), "{report}");

        let closed: SocketAddr = ([127, 0, 0, 1], crate::free_port()).into();
        let report = Traffic::start(TrafficConfig::new(closed, "h", "/").max_requests(4))
            .wait()
            .await;
        assert_eq!((report.errors, report.total), (4, 4), "{report}");
        let panicked = std::panic::catch_unwind(|| report.assert_all_ok());
        assert!(panicked.is_err());
    }

    #[tokio::test]
    async fn stop_ends_unbounded_traffic() {
        let a = Upstream::start("a").await.unwrap();
        let t = Traffic::start(TrafficConfig::new(a.addr(), "h", "/"));
        crate::wait_until(Duration::from_secs(30), Duration::from_millis(5), || {
            let r = t.report();
            async move { r.ok_2xx >= 10 }
        })
        .await
        .unwrap();
        let report = t.stop().await;
        report.assert_all_ok();
        assert_eq!(report.total, a.hits());
    }

    #[tokio::test]
    async fn without_keep_alive_still_counts() {
        let a = Upstream::start("a").await.unwrap();
        let report = Traffic::start(
            TrafficConfig::new(a.addr(), "h", "/")
                .keep_alive(false)
                .pause(Duration::ZERO)
                .max_requests(10),
        )
        .wait()
        .await;
        report.assert_all_ok();
        assert_eq!(report.total, 10);
    }
}
