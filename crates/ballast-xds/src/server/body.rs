//! gRPC streaming without tonic's per-stream codec buffers.
//!
//! tonic's encoder writes each message into a per-stream `BytesMut` and
//! splits it off; the allocation of the largest message ever sent stays alive
//! for the life of the stream (hundreds of KiB per idle proxy on a large
//! config). [`ResponseBody`] instead yields each response as a chain of chunks
//! around the resources' shared bytes ([`super::codec::Chunks`]), created only
//! as the transport asks for them, and ends with the `grpc-status` trailers.
//! [`RequestStream`] decodes requests and frees its buffer whenever it is
//! empty, so an idle stream holds no buffer at all.

use std::future::Future;
use std::hash::RandomState;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use http::HeaderMap;
use http_body::{Body, Frame};
use parking_lot::Mutex;
use tonic::Status;

use super::codec::{ChunkedMessage, Chunks, WritePos};
use super::limits::{self, Limits, NameCount};
use crate::events::XdsObserver;
use crate::protocol::delta_request::DeltaRequest;
use crate::protocol::sotw_request::SotwRequest;

/// The future serving one stream: it puts its responses in the stream's
/// [`Outbox`] and ends with the stream's status.
pub(crate) type StreamFuture = Pin<Box<dyn Future<Output = Result<(), Status>> + Send>>;

/// The one response a stream's future has made and its body not yet taken.
/// Shared by the two: the body polls the future, so the future never waits
/// on anything but the body taking the message.
pub(crate) struct Outbox<R>(Arc<Mutex<Option<Box<R>>>>);

impl<R> Outbox<R> {
    pub(crate) fn new() -> Self {
        Outbox(Arc::new(Mutex::new(None)))
    }

    /// The same outbox, for the body.
    pub(crate) fn share(&self) -> Self {
        Outbox(self.0.clone())
    }

    /// Puts `msg` in the outbox once the previous message was taken. A full
    /// outbox needs no waker: the body polls the future again as soon as it
    /// took the message, and only then (see [`ResponseBody`]).
    pub(crate) fn put(&self, msg: Box<R>) -> impl Future<Output = ()> + Send + '_
    where
        R: Send,
    {
        let mut msg = Some(msg);
        std::future::poll_fn(move |_| {
            let mut slot = self.0.lock();
            if slot.is_some() {
                return Poll::Pending;
            }
            *slot = msg.take();
            Poll::Ready(())
        })
    }

    fn take(&self) -> Option<Box<R>> {
        self.0.lock().take()
    }

    fn is_full(&self) -> bool {
        self.0.lock().is_some()
    }
}

/// The response body of one streaming call. It drives the stream: when the
/// transport asks for a frame (it does when the stream has send capacity),
/// the body yields the chunks of the message being written, else takes the
/// message in the outbox, else polls the stream's future, whose own waits
/// (requests, publishes, timers, drain) wake the transport's stream task.
/// So a stream is one task, hyper's. The future's end becomes the trailers
/// (`grpc-status: 0`, or its error); dropping the body (the client went
/// away) drops the future and everything the stream holds.
pub(crate) struct ResponseBody<R> {
    stream: Option<StreamFuture>,
    outbox: Option<Outbox<R>>,
    current: Option<Writing<R>>,
    /// The future's result, once it ended: the trailers to send.
    end: Option<Result<(), Status>>,
    done: bool,
}

/// The message being written.
struct Writing<R> {
    msg: Box<R>,
    pos: WritePos,
    chunks: Chunks,
    complete: bool,
}

impl<R: ChunkedMessage> Writing<R> {
    fn new(msg: Box<R>) -> Self {
        Writing {
            chunks: Chunks::new(msg.encoded_len()),
            msg,
            pos: WritePos::default(),
            complete: false,
        }
    }
}

impl<R: ChunkedMessage> ResponseBody<R> {
    /// The body of a stream served by `stream`, which puts its responses in
    /// `outbox`.
    pub(crate) fn new(stream: StreamFuture, outbox: Outbox<R>) -> Self {
        ResponseBody {
            stream: Some(stream),
            outbox: Some(outbox),
            current: None,
            end: None,
            done: false,
        }
    }

    /// The body of a unary call: `msg`, then `grpc-status: 0`.
    pub(crate) fn once(msg: Box<R>) -> Self {
        ResponseBody {
            stream: None,
            outbox: None,
            current: Some(Writing::new(msg)),
            end: Some(Ok(())),
            done: false,
        }
    }
}

fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(2);
    if status.add_header(&mut map).is_err() {
        // A message that cannot be a header value: keep the code.
        let _ = Status::new(status.code(), "").add_header(&mut map);
    }
    map
}

impl<R: ChunkedMessage + Send + Unpin> Body for ResponseBody<R> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(cur) = &mut this.current {
                if let Some(chunk) = cur.chunks.pop() {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                if cur.complete {
                    this.current = None;
                } else {
                    cur.complete = cur.msg.write_chunks(&mut cur.pos, &mut cur.chunks);
                }
                continue;
            }
            if let Some(msg) = this.outbox.as_ref().and_then(Outbox::take) {
                this.current = Some(Writing::new(msg));
                continue;
            }
            if let Some(stream) = &mut this.stream {
                match stream.as_mut().poll(cx) {
                    Poll::Ready(end) => {
                        // Dropped at once: the stream's permit, registry
                        // entry and waits go with it. A message it put
                        // before ending is still in the outbox.
                        this.stream = None;
                        this.end = Some(end);
                    }
                    // It put a message and waits for it to be taken.
                    Poll::Pending if this.outbox.as_ref().is_some_and(Outbox::is_full) => {}
                    Poll::Pending => return Poll::Pending,
                }
                continue;
            }
            this.done = true;
            let status = match this.end.take() {
                Some(Err(status)) => status,
                _ => Status::ok(""),
            };
            return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

type BoxBody = Pin<Box<dyn Body<Data = Bytes, Error = Status> + Send>>;

/// A request message as decoded from the wire.
pub(crate) trait WireRequest: Sized + NameCount {
    /// Decodes one message; `hasher` is the stream's own (see
    /// [`SotwRequest`]).
    fn decode_wire(raw: Bytes, hasher: &RandomState) -> Result<Self, prost::DecodeError>;
}

impl WireRequest for DiscoveryRequest {
    fn decode_wire(raw: Bytes, _: &RandomState) -> Result<Self, prost::DecodeError> {
        prost::Message::decode(raw)
    }
}

impl WireRequest for DeltaRequest {
    fn decode_wire(raw: Bytes, _: &RandomState) -> Result<Self, prost::DecodeError> {
        DeltaRequest::decode(raw)
    }
}

impl WireRequest for SotwRequest {
    fn decode_wire(raw: Bytes, hasher: &RandomState) -> Result<Self, prost::DecodeError> {
        SotwRequest::decode(raw, hasher)
    }
}

/// Length-prefixed gRPC messages decoded from a request body (prost, or
/// [`SotwRequest`] / [`DeltaRequest`] for ADS streams), within the server's limits on size and
/// names per request.
pub(crate) struct RequestStream<T> {
    body: BoxBody,
    buf: BytesMut,
    max: usize,
    max_names: usize,
    observer: Arc<dyn XdsObserver>,
    /// The stream's node once known, for reports.
    node: Option<Arc<str>>,
    ended: bool,
    /// Keys the hash of SotW names lists (random per stream).
    hasher: RandomState,
    _t: PhantomData<fn() -> T>,
}

impl<T: WireRequest> RequestStream<T> {
    pub(crate) fn new<B>(body: B, limits: &Limits, observer: Arc<dyn XdsObserver>) -> Self
    where
        B: Body + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let body = MapBody(Box::pin(body));
        RequestStream {
            body: Box::pin(body),
            buf: BytesMut::new(),
            max: limits.max_request_bytes,
            max_names: limits.max_resource_names,
            observer,
            node: None,
            ended: false,
            hasher: RandomState::new(),
            _t: PhantomData,
        }
    }

    /// Names the stream's node in later limit reports.
    pub(crate) fn set_node(&mut self, node: Arc<str>) {
        self.node = Some(node);
    }

    /// The next message, `None` at the end of the stream.
    pub(crate) async fn message(&mut self) -> Result<Option<T>, Status> {
        loop {
            if let Some(msg) = self.decode()? {
                return Ok(Some(msg));
            }
            if self.ended {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(Status::internal("request stream ended inside a message"));
            }
            let frame = std::future::poll_fn(|cx| self.body.as_mut().poll_frame(cx)).await;
            match frame {
                None => self.ended = true,
                Some(Err(status)) => return Err(status),
                Some(Ok(frame)) => {
                    if let Ok(mut data) = frame.into_data() {
                        // A frame that starts with a whole message (the
                        // usual request) is decoded in place: no buffer, no
                        // copy, per request of every stream.
                        if self.buf.is_empty()
                            && let Some(len) = self.header(&data)?
                            && data.len() >= 5 + len
                        {
                            let raw = data.slice(5..5 + len);
                            data.advance(5 + len);
                            self.buf.extend_from_slice(&data);
                            return self.finish(raw).map(Some);
                        }
                        // Grows with the bytes that arrived, never with the
                        // length a header declares (a 5-byte header must not
                        // make us allocate megabytes).
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    fn decode(&mut self) -> Result<Option<T>, Status> {
        let Some(len) = self.header(&self.buf)? else {
            return Ok(None);
        };
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        let raw = self.buf.split_to(len).freeze();
        if self.buf.is_empty() {
            // Idle streams hold no buffer.
            self.buf = BytesMut::new();
        }
        self.finish(raw).map(Some)
    }

    /// The length of the message whose gRPC header starts `b`, once the
    /// header is there; refuses compressed and oversized messages.
    fn header(&self, b: &[u8]) -> Result<Option<usize>, Status> {
        if b.len() < 5 {
            return Ok(None);
        }
        let compressed = b[0];
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        if compressed != 0 {
            return Err(Status::unimplemented(
                "compressed requests are not supported",
            ));
        }
        if len > self.max {
            return Err(limits::exceeded(
                &*self.observer,
                self.node.as_ref(),
                limits::name::REQUEST_BYTES,
                "the request message size in bytes",
                len,
                self.max,
                false,
            ));
        }
        Ok(Some(len))
    }

    /// Decodes one message's bytes and checks its names against the limit.
    fn finish(&self, raw: Bytes) -> Result<T, Status> {
        let msg = T::decode_wire(raw, &self.hasher)
            .map_err(|e| Status::internal(format!("cannot decode request: {e}")))?;
        let names = msg.name_count();
        if names > self.max_names {
            return Err(limits::exceeded(
                &*self.observer,
                self.node.as_ref(),
                limits::name::RESOURCE_NAMES,
                "the number of resource names in the request",
                names,
                self.max_names,
                false,
            ));
        }
        Ok(msg)
    }
}

/// The status of a request body's error. tonic's body already gives a
/// `Status`: it is unboxed, not rebuilt — `Status::from_error` walks the
/// source chain and allocates a copy, once per stream a client resets (in a
/// reconnect storm, every stream: 10 % of the server's samples, W5).
fn status_of(e: Box<dyn std::error::Error + Send + Sync>) -> Status {
    match e.downcast::<Status>() {
        Ok(status) => *status,
        Err(e) => Status::from_error(e),
    }
}

/// Adapts any request body to `Bytes` data and `Status` errors.
struct MapBody<B>(Pin<Box<B>>);

impl<B> Body for MapBody<B>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match ready!(self.get_mut().0.as_mut().poll_frame(cx)) {
            None => Poll::Ready(None),
            Some(Err(e)) => Poll::Ready(Some(Err(status_of(e.into())))),
            Some(Ok(frame)) => Poll::Ready(Some(Ok(
                frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::XdsEvent;
    use parking_lot::Mutex;

    struct Empty;
    impl Body for Empty {
        type Data = Bytes;
        type Error = Status;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Pending
        }
    }

    fn stream(limits: &Limits) -> (RequestStream<DiscoveryRequest>, Arc<Mutex<Vec<XdsEvent>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let observer: Arc<dyn XdsObserver> = Arc::new(move |e: &XdsEvent| s.lock().push(e.clone()));
        (RequestStream::new(Empty, limits, observer), seen)
    }

    fn header(len: u32) -> [u8; 5] {
        let l = len.to_be_bytes();
        [0, l[0], l[1], l[2], l[3]]
    }

    /// A body error that is a `Status` stays that status; any other error
    /// becomes one as tonic makes it.
    #[test]
    fn a_body_error_keeps_its_status() {
        let s = status_of(Box::new(Status::cancelled("client reset")));
        assert_eq!(
            (s.code(), s.message()),
            (tonic::Code::Cancelled, "client reset")
        );
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "gone");
        let want = Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "gone",
        )));
        let got = status_of(Box::new(io));
        assert_eq!((got.code(), got.message()), (want.code(), want.message()));
    }

    /// A header declaring a message at the limit allocates nothing up front:
    /// the buffer grows only with the bytes that arrive.
    #[test]
    fn a_declared_length_is_not_reserved_before_the_bytes_arrive() {
        let limits = Limits::default();
        let (mut rs, _) = stream(&limits);
        rs.buf
            .extend_from_slice(&header(limits.max_request_bytes as u32));
        rs.buf.extend_from_slice(b"0123456789");
        assert!(rs.decode().unwrap().is_none());
        assert!(
            rs.buf.capacity() < 64 * 1024,
            "{} bytes reserved for 15 received",
            rs.buf.capacity()
        );
    }

    #[test]
    fn an_oversized_request_is_refused_by_its_header() {
        let (mut rs, seen) = stream(&Limits::default());
        rs.buf.extend_from_slice(&header(u32::MAX));
        let e = rs.decode().unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(
            e.message()
                .contains("is 4294967295, over the request_bytes limit of 4194304"),
            "{e}"
        );
        assert!(matches!(
            &seen.lock()[..],
            [XdsEvent::LimitExceeded {
                limit: "request_bytes",
                value: 4294967295,
                ..
            }]
        ));
    }

    /// Frames as the transport cuts them.
    struct Frames(std::collections::VecDeque<Bytes>);
    impl Body for Frames {
        type Data = Bytes;
        type Error = Status;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    /// However the frames cut the messages — one per frame (decoded in
    /// place), several in one, one across frames — the same requests come
    /// out, in order, and the stream ends cleanly.
    #[tokio::test]
    async fn messages_come_out_whole_however_frames_cut_them() {
        let msgs: Vec<DiscoveryRequest> = (0..4)
            .map(|i| DiscoveryRequest {
                type_url: format!("t{i}"),
                resource_names: (0..i).map(|n| format!("name-{n}")).collect(),
                ..Default::default()
            })
            .collect();
        let mut wire = Vec::new();
        for m in &msgs {
            let body = prost::Message::encode_to_vec(m);
            wire.extend_from_slice(&header(body.len() as u32));
            wire.extend_from_slice(&body);
        }
        let wire = Bytes::from(wire);
        for cut in 1..wire.len() {
            // Frames of `cut` bytes, and the whole stream as one frame.
            for frames in [
                wire.chunks(cut)
                    .map(Bytes::copy_from_slice)
                    .collect::<Vec<_>>(),
                vec![wire.clone()],
            ] {
                let mut rs = RequestStream::<DiscoveryRequest>::new(
                    Frames(frames.into()),
                    &Limits::default(),
                    Arc::new(crate::events::NoopObserver),
                );
                let mut got = Vec::new();
                while let Some(m) = rs.message().await.expect("decodes") {
                    got.push(m);
                }
                assert_eq!(got, msgs, "frames of {cut} bytes");
            }
        }
    }

    #[test]
    fn too_many_names_in_one_request_are_refused() {
        let limits = Limits {
            max_resource_names: 3,
            ..Limits::default()
        };
        let (mut rs, seen) = stream(&limits);
        rs.set_node("n1".into());
        for n in [3, 4] {
            let req = DiscoveryRequest {
                resource_names: (0..n).map(|i| i.to_string()).collect(),
                ..Default::default()
            };
            let body = prost::Message::encode_to_vec(&req);
            rs.buf.extend_from_slice(&header(body.len() as u32));
            rs.buf.extend_from_slice(&body);
        }
        assert_eq!(rs.decode().unwrap().unwrap().resource_names.len(), 3);
        let e = rs.decode().unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("resource_names limit of 3"), "{e}");
        assert!(matches!(
            &seen.lock()[..],
            [XdsEvent::LimitExceeded { limit: "resource_names", value: 4, node: Some(n), .. }] if &**n == "n1"
        ));
    }

    use proptest::strategy::Strategy as _;

    /// What a stream's future does next, in [`a_body_yields_what_its_stream_puts`].
    #[derive(Debug, Clone)]
    enum Step {
        /// Puts a response removing this many names.
        Put(usize),
        /// Waits once for something that wakes it at once (a request, a
        /// publish, a timer).
        Wait,
    }

    fn delta(i: usize, removed: usize) -> crate::protocol::DeltaResponse {
        crate::protocol::DeltaResponse {
            ty: crate::resource::ResourceType::Cluster,
            system_version: format!("v{i}").into(),
            nonce: i.to_string().into(),
            resources: Vec::new(),
            removed: (0..removed)
                .map(|n| format!("name-{n:06}").into())
                .collect(),
        }
    }

    struct Flag(std::sync::atomic::AtomicBool);
    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Returns `Pending` once, waking its task first.
    async fn wait_once() {
        let mut waited = false;
        std::future::poll_fn(|cx| {
            if std::mem::replace(&mut waited, true) {
                Poll::Ready(())
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
        .await
    }

    /// Drives `body` as the transport does: polls until it ends, and after a
    /// `Pending` only once woken (a body that waits with no wake to come
    /// would hang its stream). Returns the data and the trailers' status.
    fn drain_body<R: ChunkedMessage + Send + Unpin>(
        mut body: ResponseBody<R>,
        on_trailers: impl FnOnce(),
    ) -> (Vec<u8>, String) {
        let flag = Arc::new(Flag(std::sync::atomic::AtomicBool::new(false)));
        let waker = std::task::Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut data = Vec::new();
        loop {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Pending => assert!(
                    flag.0.swap(false, std::sync::atomic::Ordering::SeqCst),
                    "the body waits and nothing will wake it"
                ),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(d) => data.extend_from_slice(&d),
                    Err(frame) => {
                        let t = frame.into_trailers().expect("data or trailers");
                        on_trailers();
                        let status = t["grpc-status"].to_str().unwrap().to_string();
                        assert!(body.is_end_stream());
                        assert!(matches!(
                            Pin::new(&mut body).poll_frame(&mut cx),
                            Poll::Ready(None)
                        ));
                        return (data, status);
                    }
                },
                Poll::Ready(other) => panic!("unexpected frame {other:?}"),
            }
        }
    }

    proptest::proptest! {
        /// Whatever the stream's future does — several responses in one
        /// poll, waits between them, large and small ones, ending right after
        /// a put — the body yields every response's bytes, in order, then the
        /// future's status as trailers; the future (and what the stream
        /// holds) is dropped when it ends.
        #[test]
        fn a_body_yields_what_its_stream_puts(
            steps in proptest::collection::vec(
                proptest::prop_oneof![
                    (0usize..3000).prop_map(Step::Put),
                    proptest::strategy::Just(Step::Wait),
                ],
                0..12,
            ),
            fails in proptest::bool::ANY,
        ) {
            let outbox = Outbox::new();
            let put = outbox.share();
            let held = Arc::new(());
            let holder = held.clone();
            let script = steps.clone();
            let stream = async move {
                let _holder = holder;
                for (i, step) in script.into_iter().enumerate() {
                    match step {
                        Step::Put(n) => put.put(Box::new(delta(i, n))).await,
                        Step::Wait => wait_once().await,
                    }
                }
                if fails { Err(Status::unavailable("draining")) } else { Ok(()) }
            };
            let body = ResponseBody::new(Box::pin(stream), outbox);
            let (data, status) = drain_body(body, || {
                assert_eq!(Arc::strong_count(&held), 1, "the future ended but lives on");
            });
            let mut want = Vec::new();
            for (i, step) in steps.iter().enumerate() {
                if let Step::Put(n) = step {
                    let msg = delta(i, *n);
                    let mut raw = Vec::new();
                    super::super::codec::WireMessage::encode_raw(&msg, &mut raw);
                    want.push(0u8);
                    want.extend_from_slice(&(raw.len() as u32).to_be_bytes());
                    want.extend(raw);
                }
            }
            proptest::prop_assert_eq!(data, want);
            let code = if fails { tonic::Code::Unavailable } else { tonic::Code::Ok };
            proptest::prop_assert_eq!(status, (code as i32).to_string());
        }
    }

    /// A client that goes away drops the body: the stream's future, and so
    /// its permit and registry entry, go with it, even mid-response.
    #[test]
    fn dropping_the_body_drops_the_stream() {
        let outbox = Outbox::new();
        let put = outbox.share();
        let held = Arc::new(());
        let holder = held.clone();
        let stream = async move {
            let _holder = holder;
            put.put(Box::new(delta(0, 5000))).await;
            std::future::pending::<()>().await;
            Ok(())
        };
        let mut body = ResponseBody::new(Box::pin(stream), outbox);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(matches!(
            Pin::new(&mut body).poll_frame(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert_eq!(Arc::strong_count(&held), 2);
        drop(body);
        assert_eq!(Arc::strong_count(&held), 1);
    }

    /// A unary call's body: its one message, then `grpc-status: 0`.
    #[test]
    fn a_unary_body_is_one_message_then_ok() {
        let msg = delta(0, 3);
        let mut raw = Vec::new();
        super::super::codec::WireMessage::encode_raw(&msg, &mut raw);
        let (data, status) = drain_body(ResponseBody::once(Box::new(msg)), || {});
        assert_eq!(&data[5..], &raw[..]);
        assert_eq!(status, "0");
    }
}
