//! A tiny OpenTelemetry collector for tracing tests: receives OTLP traces over HTTP
//! (`POST /v1/traces`, protobuf) and gRPC (`TraceService/Export`, h2c) on one loopback port
//! and records every span with its resource's `service.name`. Only the fields tests look at
//! are decoded (hand-written prost messages; unknown fields are skipped).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The gRPC method path of OTLP trace export.
pub const OTLP_GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// One received span.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedSpan {
    /// The `service.name` resource attribute of its batch.
    pub service: String,
    pub name: String,
    /// `http` or `grpc`: how it arrived.
    pub transport: &'static str,
}

#[derive(Clone, PartialEq, Message)]
struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    resource_spans: Vec<ResourceSpans>,
}
#[derive(Clone, PartialEq, Message)]
struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    scope_spans: Vec<ScopeSpans>,
}
#[derive(Clone, PartialEq, Message)]
struct Resource {
    #[prost(message, repeated, tag = "1")]
    attributes: Vec<KeyValue>,
}
#[derive(Clone, PartialEq, Message)]
struct KeyValue {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    value: Option<AnyValue>,
}
#[derive(Clone, PartialEq, Message)]
struct AnyValue {
    #[prost(string, tag = "1")]
    string_value: String,
}
#[derive(Clone, PartialEq, Message)]
struct ScopeSpans {
    #[prost(message, repeated, tag = "2")]
    spans: Vec<Span>,
}
#[derive(Clone, PartialEq, Message)]
struct Span {
    #[prost(string, tag = "5")]
    name: String,
}

/// A running receiver on `127.0.0.1:<ephemeral>`; stopped on drop.
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    task: JoinHandle<()>,
}

impl OtlpReceiver {
    pub async fn start() -> Result<OtlpReceiver> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind OTLP receiver on 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let shared = spans.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let spans = shared.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| handle(req, spans.clone()));
                    // HTTP/1.1 (OTLP/HTTP) and h2c prior knowledge (OTLP/gRPC) on one port.
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(OtlpReceiver { addr, spans, task })
    }

    /// The address it listens on (always loopback).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().expect("spans lock").clone()
    }

    /// How many received spans came from `service`.
    pub fn count(&self, service: &str) -> usize {
        self.spans().iter().filter(|s| s.service == service).count()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn record(body: &[u8], transport: &'static str, out: &Mutex<Vec<ReceivedSpan>>) -> bool {
    let Ok(req) = ExportTraceServiceRequest::decode(body) else {
        return false;
    };
    let mut out = out.lock().expect("spans lock");
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref())
            .map(|v| v.string_value.clone())
            .unwrap_or_default();
        for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
            out.push(ReceivedSpan {
                service: service.clone(),
                name: span.name,
                transport,
            });
        }
    }
    true
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn handle(
    req: hyper::Request<hyper::body::Incoming>,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
) -> Result<hyper::Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let response = |status: u16, ctype: &str, body: Body| {
        hyper::Response::builder()
            .status(status)
            .header("content-type", ctype)
            .body(body)
            .expect("valid response")
    };
    Ok(if path == OTLP_GRPC_EXPORT {
        // One length-prefixed message: flag byte, u32 length, protobuf.
        let mut b = body.clone();
        let ok = b.len() >= 5 && {
            b.advance(1);
            let len = b.get_u32() as usize;
            b.len() >= len && record(&b[..len], "grpc", &spans)
        };
        let status = if ok { "0" } else { "3" };
        let mut trailers = hyper::HeaderMap::new();
        trailers.insert("grpc-status", status.parse().expect("ascii"));
        // An empty ExportTraceServiceResponse.
        let frame = Full::new(Bytes::from_static(&[0, 0, 0, 0, 0]))
            .with_trailers(async move { Some(Ok(trailers)) })
            .boxed();
        response(200, "application/grpc", frame)
    } else if path == "/v1/traces" {
        if record(&body, "http", &spans) {
            response(
                200,
                "application/x-protobuf",
                Full::new(Bytes::new()).boxed(),
            )
        } else {
            response(
                400,
                "text/plain",
                Full::new(Bytes::from("bad OTLP")).boxed(),
            )
        }
    } else {
        response(404, "text/plain", Full::new(Bytes::new()).boxed())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn http_export_is_recorded_with_the_service_name() {
        let r = OtlpReceiver::start().await.unwrap();
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: Some(AnyValue {
                            string_value: "svc".into(),
                        }),
                    }],
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span { name: "a".into() }, Span { name: "b".into() }],
                }],
            }],
        };
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let body = req.encode_to_vec();
        let mut c = tokio::net::TcpStream::connect(r.addr()).await.unwrap();
        let head = format!(
            "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        c.write_all(head.as_bytes()).await.unwrap();
        c.write_all(&body).await.unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        let status: u16 = String::from_utf8_lossy(&out[9..12]).parse().unwrap();
        assert_eq!(status, 200);
        assert_eq!(r.count("svc"), 2);
        assert_eq!(r.spans()[1].name, "b");
    }
}
