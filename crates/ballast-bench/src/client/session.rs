//! Where every driver runs: the reconnect loop (Envoy's backoff, or an
//! immediate resume when the bench restores the streams it dropped) and, for
//! both ADS variants, the stream itself: connect, open with the initial
//! requests, then per response its replies (a subscription change before the
//! ACK, like Envoy) and the deferred LDS request. The variants differ only in
//! their messages ([`Ads`]).

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ballast_xds::envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::{ClientConfig, GatePermit, SharedState, Subscriptions};
use crate::fleet::FleetShared;

/// A protocol driver: what it keeps across reconnects, and one connection.
pub(crate) trait Driver: Default + Send {
    /// One connection; `Ok` when stopped, `Err` when it must reconnect.
    fn session(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
        stop: &mut watch::Receiver<bool>,
        permit: &mut GatePermit,
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// Runs driver `D` until `stop` turns true, reconnecting on errors.
pub(crate) async fn run<D: Driver>(
    cfg: ClientConfig,
    state: SharedState,
    mut stop: watch::Receiver<bool>,
) {
    let mut client = D::default();
    let mut attempt = 0;
    loop {
        let mut permit = GatePermit::acquire(&cfg).await;
        let r = client.session(&cfg, &state, &mut stop, &mut permit).await;
        drop(permit);
        match r {
            Ok(()) => return,
            Err(e) => {
                let restored = wait_restored(&cfg.shared, &e, &mut stop).await;
                {
                    let mut st = state.lock();
                    st.stats.last_error = (!restored).then_some(e);
                    st.stats.reconnects += 1;
                }
                if restored {
                    attempt = 0;
                    if *stop.borrow() {
                        return;
                    }
                    continue;
                }
                attempt += 1;
                tokio::select! {
                    _ = tokio::time::sleep(backoff(attempt)) => {}
                    _ = stop.changed() => return,
                }
            }
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// Reconnect backoff like Envoy's (jittered, capped): 100 ms doubling to 2 s.
fn backoff(attempt: u32) -> Duration {
    let base = 100u64 << attempt.min(5);
    Duration::from_millis(base.min(2000))
}

/// The error a session returns when the bench drops every stream (W5).
const DROPPED: &str = "stream dropped by the bench";

/// Resolves when the bench drops the fleet's streams (odd stream epoch).
async fn dropped(shared: &FleetShared) {
    let mut rx = shared.streams.subscribe();
    loop {
        if !(*rx.borrow_and_update()).is_multiple_of(2) {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// After a session error: if the bench dropped the stream, waits for the
/// restore and returns true (reconnect at once, no backoff); else false.
async fn wait_restored(
    shared: &FleetShared,
    error: &str,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    if error != DROPPED {
        return false;
    }
    let mut rx = shared.streams.subscribe();
    loop {
        if (*rx.borrow_and_update()).is_multiple_of(2) {
            return true;
        }
        tokio::select! {
            r = rx.changed() => if r.is_err() { return true; },
            _ = stop.changed() => return true,
        }
    }
}

/// A tonic channel configured like Envoy's gRPC client: its own HTTP/2
/// connection with 256 MiB windows (tonic's 64 KiB default makes large pushes
/// several times slower and would measure the client, not the server).
async fn connect(addr: SocketAddr) -> Result<Channel, String> {
    const WINDOW: u32 = 256 * 1024 * 1024;
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .initial_stream_window_size(Some(WINDOW))
        .initial_connection_window_size(Some(WINDOW))
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e}"))
}

pub(crate) type AdsClient = AggregatedDiscoveryServiceClient<Channel>;

/// The largest response a simulated client accepts (Envoy's default is
/// unlimited; tonic's 4 MiB would refuse the large route configurations).
pub(crate) const MAX_RESPONSE: usize = 64 << 20;

/// What to send after a response: a subscription change (first), then the
/// ACK or NACK.
pub(crate) struct Replies<R> {
    pub resubscribe: Option<R>,
    pub ack: R,
}

/// One ADS variant (SotW or Delta): its messages and their framing.
pub(crate) trait Ads: Default + Send {
    type Request: Send + 'static;
    type Response: prost::Message + Send + 'static;
    /// The stream's name in errors.
    const NAME: &'static str;

    /// Opens the stream that sends `requests`.
    fn open(
        channel: Channel,
        requests: ReceiverStream<Self::Request>,
    ) -> impl Future<Output = Result<tonic::Streaming<Self::Response>, tonic::Status>> + Send;
    fn subscriptions(&mut self) -> &mut Subscriptions;
    /// Requests that open (or resume) a stream; `node` goes on the first only.
    fn initial_requests(&mut self, cfg: &ClientConfig, state: &SharedState) -> Vec<Self::Request>;
    /// Applies a response (see [`Subscriptions::apply`]) and says what to send.
    fn respond(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
        resp: &Self::Response,
        bytes: usize,
        at: Instant,
    ) -> Result<Replies<Self::Request>, String>;
    /// The deferred first LDS request.
    fn listeners_request(&self) -> Self::Request;
}

impl<A: Ads> Driver for A {
    async fn session(
        &mut self,
        cfg: &ClientConfig,
        state: &SharedState,
        stop: &mut watch::Receiver<bool>,
        permit: &mut GatePermit,
    ) -> Result<(), String> {
        let channel = connect(cfg.addr).await?;
        state
            .lock()
            .stats
            .connected_at
            .get_or_insert(Instant::now());
        let (tx, rx) = mpsc::channel::<A::Request>(16);
        for req in self.initial_requests(cfg, state) {
            tx.send(req).await.map_err(|e| e.to_string())?;
        }
        let mut stream = A::open(channel, ReceiverStream::new(rx))
            .await
            .map_err(|s| format!("{}: {s}", A::NAME))?;
        loop {
            let resp = tokio::select! {
                m = stream.message() => m.map_err(|s| format!("{} stream: {s}", A::NAME))?,
                _ = stop.changed() => return Ok(()),
                _ = dropped(&cfg.shared) => return Err(DROPPED.into()),
            };
            let Some(resp) = resp else {
                return Err(format!("{} stream closed by server", A::NAME));
            };
            let at = Instant::now();
            let bytes = prost::Message::encoded_len(&resp);
            let replies = self.respond(cfg, state, &resp, bytes, at)?;
            // Like Envoy: subscriptions that follow from this response go out
            // before its ACK (the dependent type is resumed inside the update).
            if let Some(r) = replies.resubscribe {
                tx.send(r).await.map_err(|e| e.to_string())?;
            }
            tx.send(replies.ack).await.map_err(|e| e.to_string())?;
            let due = self.subscriptions().listeners_due(&state.lock());
            if due {
                tx.send(self.listeners_request())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            permit.release_when_loaded(&state.lock());
        }
    }
}
