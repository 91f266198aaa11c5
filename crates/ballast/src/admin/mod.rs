//! Admin HTTP (README, "Admin HTTP"): health, readiness, metrics and debug views.
//! Loopback by default; read-only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ballast_sources::SourceState;
use ballast_xds::{ResourceType, XdsServer};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub mod auth;

use crate::metrics::{ClientHolds, Metrics};
use crate::serve::pipeline::PipelineStatus;

#[derive(Clone)]
pub struct AdminState {
    pub server: XdsServer,
    pub status: watch::Receiver<PipelineStatus>,
    pub source: watch::Receiver<SourceState>,
    pub metrics: Arc<Metrics>,
    /// Cancelled when the process begins to stop: readiness fails at once so
    /// load balancers and orchestrators stop sending new work here.
    pub stopping: CancellationToken,
    /// Proxies whose first push the resume guard holds.
    pub client_holds: ClientHolds,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/debug/proxies", get(proxies))
        .route("/debug/config_dump", get(config_dump))
        .route("/debug/sources", get(sources))
        .route("/debug/pipeline", get(pipeline))
        .with_state(state)
}

fn json_response(status: StatusCode, v: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string_pretty(&v).unwrap_or_default() + "\n",
    )
        .into_response()
}

fn time(t: Option<SystemTime>) -> Value {
    t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map(|d| json!(d.as_secs_f64()))
        .unwrap_or(Value::Null)
}

async fn readyz(State(s): State<AdminState>) -> Response {
    if s.stopping.is_cancelled() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response();
    }
    let ready = s.status.borrow().ready;
    if ready {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        let src = s.source.borrow();
        let why = if !src.synced {
            match &src.last_error {
                Some(e) => format!(
                    "source {} has not synced: {} error(s), first: {}\n",
                    src.name,
                    e.len(),
                    e.first().map(|e| e.to_string()).unwrap_or_default()
                ),
                None => match &src.store_error {
                    Some(e) => format!("source {} has not synced: {e}\n", src.name),
                    None => format!("source {} has not finished its initial sync\n", src.name),
                },
            }
        } else {
            "translating the initial config\n".to_string()
        };
        (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
    }
}

async fn metrics(State(s): State<AdminState>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

async fn proxies(State(s): State<AdminState>) -> Response {
    let nodes = s.server.registry().nodes();
    let cache = s.server.cache();
    let holds = s.client_holds.lock().clone();
    let gateway_holds: BTreeMap<String, String> = s
        .status
        .borrow()
        .gateways
        .iter()
        .filter_map(|(g, st)| Some((g.clone(), st.held.as_ref()?.reason.clone())))
        .collect();
    let list: Vec<Value> = nodes
        .iter()
        .map(|n| {
            let snapshot = cache.snapshot(&n.group);
            let gateway = crate::grouping::gateway_part(&n.group);
            let types: Vec<Value> = n
                .types
                .iter()
                .map(|t| {
                    json!({
                        "type": t.ty.short_name(),
                        "state": t.state.as_str(),
                        "sent_version": t.sent_version.as_deref(),
                        "acked_version": t.acked_version.as_deref(),
                        "nonce": t.sent_nonce.as_deref(),
                        "resources": t.acked.len(),
                        "wildcard": t.wildcard,
                        "nack": t.nack.as_ref().map(|k| json!({
                            "version": &*k.version, "nonce": &*k.nonce, "message": k.message,
                        })),
                    })
                })
                .collect();
            json!({
                "node": &*n.id,
                "gateway": gateway,
                "group": &*n.group,
                "gateway_known": snapshot.is_some(),
                "waiting": match (&snapshot, gateway_holds.get(gateway), holds.get(&*n.id)) {
                    (None, Some(reason), _) => Some(format!("gateway {gateway} is held by the blast-radius guard: {reason}")),
                    (None, None, _) => Some(format!("no gateway {gateway} in the config")),
                    (Some(_), _, Some(h)) => Some(format!("first push held by the blast-radius guard (the proxy's own report): {}", h.reason)),
                    _ => None,
                },
                "guard_hold": holds.get(&*n.id).map(|h| json!({
                    "origin": "client_report",
                    "reason": h.reason,
                    "since": time(Some(h.since)),
                    "until": time(Some(h.until)),
                })),
                "connected": n.connected,
                "streams": n.streams.iter().map(|(id, k)| json!({"id": id, "kind": k.label()})).collect::<Vec<_>>(),
                "types": types,
            })
        })
        .collect();
    let (recent, denied) = s.server.rejections();
    let rejected: Vec<Value> = recent
        .iter()
        .map(|r| {
            json!({
                "at": time(Some(r.at)),
                "node": r.node,
                "identity": r.rejection.identity,
                "gateway": r.rejection.group,
                "message": r.rejection.to_string(),
            })
        })
        .collect();
    json_response(
        StatusCode::OK,
        json!({ "proxies": list, "rejected": rejected, "denied_total": denied }),
    )
}

#[derive(Deserialize)]
struct DumpQuery {
    gateway: Option<String>,
}

async fn config_dump(State(s): State<AdminState>, Query(q): Query<DumpQuery>) -> Response {
    let Some(gw) = q.gateway else {
        let groups: Vec<String> = s
            .server
            .cache()
            .groups()
            .iter()
            .map(|g| g.to_string())
            .collect();
        return json_response(
            StatusCode::BAD_REQUEST,
            json!({"error": "pass ?gateway=NAME", "gateways": groups}),
        );
    };
    let group = if gw.contains('/') {
        gw.clone()
    } else {
        format!("default/{gw}")
    };
    let Some(snap) = s.server.cache().snapshot(&group) else {
        return json_response(
            StatusCode::NOT_FOUND,
            json!({"error": format!("no snapshot for gateway {group}")}),
        );
    };
    let mut out = BTreeMap::new();
    for ty in ResourceType::ALL {
        let list: Vec<Value> = snap
            .resources(ty)
            .values()
            .map(|r| {
                let full = ty.type_url().rsplit('/').next().unwrap_or_default();
                let mut v =
                    ballast_xds::json::bytes_to_json(full, &r.value_bytes()).unwrap_or(Value::Null);
                if ty == ResourceType::Secret {
                    v = json!({"name": r.name(), "redacted": true});
                }
                json!({"name": r.name(), "version": r.version(), "resource": v})
            })
            .collect();
        out.insert(
            ty.short_name(),
            json!({"version": &**snap.version(ty), "resources": list}),
        );
    }
    json_response(StatusCode::OK, json!({"gateway": group, "config": out}))
}

async fn sources(State(s): State<AdminState>) -> Response {
    let src = s.source.borrow().clone();
    let status = src
        .config
        .as_ref()
        .map(|c| serde_json::to_value(ballast_model::status::compute(c)).unwrap_or(Value::Null));
    let errors: Vec<String> = src
        .last_error
        .as_ref()
        .map(|e| e.iter().map(|e| e.to_string()).collect())
        .unwrap_or_default();
    json_response(
        StatusCode::OK,
        json!({
            "sources": [{
                "name": src.name,
                "synced": src.synced,
                "generation": src.generation,
                "files": src.files,
                "revision": src.revision,
                "stale": src.stale_since.is_some(),
                "stale_since": time(src.stale_since),
                "store_error": src.store_error,
                "revision_regressions": src.revision_regressions,
                "held_apply": src.held_apply.map(|h| json!({
                    "opened": h.opened, "abandoned": h.abandoned,
                })),
                "last_regression": src.last_regression.map(|r| json!({
                    "from": r.from, "to": r.to, "at": time(Some(r.at)),
                })),
                "last_attempt": time(src.last_attempt),
                "last_success": time(src.last_success),
                "errors": errors,
                "rejected": rejected_json(&src.report),
                "held_files": src.report.held_files.iter().map(|f| &**f).collect::<Vec<_>>(),
                "skipped": src.report.skipped.iter().map(|s| json!({
                    "file": &*s.file, "line": s.pos.line, "column": s.pos.column,
                    "apiVersion": s.api_version, "kind": s.kind,
                    "namespace": s.namespace, "name": s.name, "message": s.to_string(),
                })).collect::<Vec<_>>(),
            }],
            "status": status,
        }),
    )
}

/// Per-object errors: what each invalid object's problems are and which version is served
/// instead (`serving`: where its last good version was read; `null`: not served).
fn rejected_json(report: &ballast_model::LoadReport) -> Vec<Value> {
    report
        .rejected
        .iter()
        .map(|r| {
            json!({
                "kind": r.id.kind,
                "namespace": r.id.key.namespace,
                "name": r.id.key.name,
                "serving": r.serving.as_ref().map(|s| s.to_string()),
                "errors": r.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            })
        })
        .collect()
}

async fn pipeline(State(s): State<AdminState>) -> Response {
    let mut v = serde_json::to_value(&*s.status.borrow()).unwrap_or(Value::Null);
    // Per proxy: the resume guard judges each reconnecting proxy's report.
    let holds: Vec<Value> = s
        .client_holds
        .lock()
        .iter()
        .map(|(node, h)| {
            json!({
                "node": node,
                "gateway": h.gateway,
                "origin": "client_report",
                "reason": h.reason,
                "since": time(Some(h.since)),
                "until": time(Some(h.until)),
            })
        })
        .collect();
    v["client_holds"] = Value::Array(holds);
    json_response(StatusCode::OK, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_xds::SnapshotCache;

    fn state(ready: bool) -> AdminState {
        let mut source = SourceState::new("test");
        source.synced = true;
        AdminState {
            server: XdsServer::builder(SnapshotCache::new()).build(),
            status: watch::channel(PipelineStatus {
                ready,
                ..Default::default()
            })
            .1,
            source: watch::channel(source).1,
            metrics: Metrics::new(),
            stopping: CancellationToken::new(),
            client_holds: Default::default(),
        }
    }

    async fn body(r: Response) -> (StatusCode, String) {
        let code = r.status();
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        (code, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A stopping server fails readiness at once, even though it is ready.
    #[tokio::test]
    async fn readyz_fails_as_soon_as_stopping_begins() {
        let s = state(true);
        assert_eq!(body(readyz(State(s.clone())).await).await.0, StatusCode::OK);
        s.stopping.cancel();
        let (code, text) = body(readyz(State(s)).await).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(text, "shutting down\n");
    }
}
