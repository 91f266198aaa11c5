//! The live catalog's write side: the admin HTTP registration API and `ballast register`.
//!
//! A registration is a key `<prefix>_catalog/<ns>/<backend>/<id>` holding a JSON
//! [`Registration`], bound to an etcd lease of the registration's TTL. Heartbeats are lease
//! keep-alives; a registrar that stops heartbeating is deregistered by etcd itself when the TTL
//! runs out, and every replica's catalog source (ballast_sources::catalog) drops the endpoint from
//! EDS. Nothing here keeps state: any replica can serve any call.

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::extract::{Json, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use ballast_etcd::{Client, Error as EtcdError};
use ballast_model::ObjectKey;
use ballast_sources::catalog::{CatalogHealth, Registration};
use ballast_sources::etcd_keys;
use serde::Deserialize;
use serde_json::json;

/// Bounds on a registration's TTL: below 2 s heartbeats cannot keep up; etcd caps leases anyway.
const MIN_TTL: Duration = Duration::from_secs(2);
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("{0}")]
    Invalid(String),
    #[error("no registration {0} (expired or deregistered)")]
    NotFound(String),
    #[error(transparent)]
    Etcd(#[from] EtcdError),
}

/// Catalog operations over one etcd client.
#[derive(Clone, Debug)]
pub struct Catalog {
    client: Client,
    prefix: String,
}

/// What `PUT /catalog/v1/register` takes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// `namespace/name` or `name` of the Backend.
    pub backend: String,
    pub address: IpAddr,
    pub port: u16,
    /// e.g. `10s`.
    pub ttl: String,
    /// Default `<address>:<port>`.
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub health: CatalogHealth,
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub zone: Option<String>,
}

fn valid_id(id: &str) -> Result<(), CatalogError> {
    if id.is_empty() || id.contains('/') || id.len() > 253 {
        return Err(CatalogError::Invalid(format!(
            "id {id:?}: 1..253 characters, no '/'"
        )));
    }
    Ok(())
}

fn ttl_secs(ttl: &str) -> Result<i64, CatalogError> {
    let d = ballast_model::parse_duration(ttl)
        .map_err(|e| CatalogError::Invalid(format!("ttl {ttl:?}: {e}")))?;
    if !(MIN_TTL..=MAX_TTL).contains(&d) {
        return Err(CatalogError::Invalid(format!(
            "ttl {ttl:?}: between {MIN_TTL:?} and {MAX_TTL:?}"
        )));
    }
    Ok(d.as_secs_f64().ceil() as i64)
}

impl Catalog {
    pub fn new(client: Client, prefix: impl Into<String>) -> Self {
        Catalog {
            client,
            prefix: prefix.into(),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Grants a lease of the TTL and writes every registration bound to it. Returns the lease
    /// and the keys.
    pub async fn register(
        &self,
        backend: &ObjectKey,
        ttl: i64,
        regs: &[(String, Registration)],
    ) -> Result<(i64, Vec<String>), CatalogError> {
        for (id, _) in regs {
            valid_id(id)?;
        }
        let lease = self.client.lease_grant(ttl).await?;
        let mut keys = Vec::with_capacity(regs.len());
        for (id, r) in regs {
            let key = etcd_keys::registration_key(&self.prefix, backend, id);
            let value = serde_json::to_vec(r).expect("a registration serializes");
            if let Err(e) = self
                .client
                .put_with_lease(key.clone(), value, lease.id)
                .await
            {
                // Leave nothing half-registered behind.
                let _ = self.client.lease_revoke(lease.id).await;
                return Err(e.into());
            }
            keys.push(key);
        }
        Ok((lease.id, keys))
    }

    async fn lookup(
        &self,
        backend: &ObjectKey,
        id: &str,
    ) -> Result<(String, ballast_etcd::KeyValue), CatalogError> {
        let key = etcd_keys::registration_key(&self.prefix, backend, id);
        match self.client.get(key.clone()).await? {
            Some(kv) => Ok((key, kv)),
            None => Err(CatalogError::NotFound(format!("{backend}/{id}"))),
        }
    }

    /// One heartbeat: refreshes the registration's lease. Returns the TTL.
    pub async fn heartbeat(&self, backend: &ObjectKey, id: &str) -> Result<i64, CatalogError> {
        let (key, kv) = self.lookup(backend, id).await?;
        let mut ka = self
            .client
            .lease_keep_alive(kv.lease)
            .await
            .map_err(|e| match e {
                EtcdError::LeaseNotFound { .. } => CatalogError::NotFound(key.clone()),
                e => e.into(),
            })?;
        ka.keep_alive().await.map_err(|e| match e {
            EtcdError::LeaseNotFound { .. } => CatalogError::NotFound(key),
            e => e.into(),
        })
    }

    /// Changes a registration's health (same lease).
    pub async fn set_health(
        &self,
        backend: &ObjectKey,
        id: &str,
        health: CatalogHealth,
    ) -> Result<(), CatalogError> {
        let (key, kv) = self.lookup(backend, id).await?;
        let mut r: Registration = serde_json::from_slice(&kv.value)
            .map_err(|e| CatalogError::Invalid(format!("stored value of {key}: {e}")))?;
        r.health = health;
        let value = serde_json::to_vec(&r).expect("a registration serializes");
        self.client.put_with_lease(key, value, kv.lease).await?;
        Ok(())
    }

    /// Removes a registration at once (revokes its lease: any other key on it goes too).
    pub async fn deregister(&self, backend: &ObjectKey, id: &str) -> Result<(), CatalogError> {
        let (key, kv) = self.lookup(backend, id).await?;
        if kv.lease != 0 {
            match self.client.lease_revoke(kv.lease).await {
                Ok(()) | Err(EtcdError::LeaseNotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.client.delete(ballast_etcd::KeyRange::key(key)).await?;
        Ok(())
    }
}

impl IntoResponse for CatalogError {
    fn into_response(self) -> Response {
        let status = match &self {
            CatalogError::Invalid(_) => StatusCode::BAD_REQUEST,
            CatalogError::NotFound(_) => StatusCode::NOT_FOUND,
            CatalogError::Etcd(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            CatalogError::Etcd(_) => StatusCode::BAD_GATEWAY,
        };
        (status, Json(json!({ "error": self.to_string() }))).into_response()
    }
}

/// The admin routes (merged into the admin router when `serve --etcd` is given):
/// - `PUT /catalog/v1/register` — JSON [`RegisterRequest`] → `{id, key, lease, ttl}`;
/// - `PUT /catalog/v1/heartbeat/{ns}/{backend}/{id}` → `{ttl}` (404 once expired);
/// - `PUT /catalog/v1/health/{ns}/{backend}/{id}` — `{"health": "passing|warning|critical"}`;
/// - `DELETE /catalog/v1/register/{ns}/{backend}/{id}`.
pub fn router(catalog: Catalog) -> Router {
    Router::new()
        .route("/catalog/v1/register", put(register))
        .route(
            "/catalog/v1/register/{ns}/{backend}/{id}",
            axum::routing::delete(deregister),
        )
        .route("/catalog/v1/heartbeat/{ns}/{backend}/{id}", put(heartbeat))
        .route("/catalog/v1/health/{ns}/{backend}/{id}", put(health))
        .with_state(catalog)
}

async fn register(
    State(c): State<Catalog>,
    Json(req): Json<RegisterRequest>,
) -> Result<Response, CatalogError> {
    let backend = crate::gateway_key(&req.backend);
    let ttl = ttl_secs(&req.ttl)?;
    let id = req
        .id
        .clone()
        .unwrap_or_else(|| format!("{}:{}", req.address, req.port));
    let r = Registration {
        address: req.address,
        port: req.port,
        health: req.health,
        weight: req.weight,
        zone: req.zone,
    };
    let (lease, keys) = c.register(&backend, ttl, &[(id.clone(), r)]).await?;
    Ok(Json(json!({ "id": id, "key": keys[0], "lease": lease, "ttl": ttl })).into_response())
}

async fn heartbeat(
    State(c): State<Catalog>,
    Path((ns, backend, id)): Path<(String, String, String)>,
) -> Result<Response, CatalogError> {
    let ttl = c.heartbeat(&ObjectKey::new(ns, backend), &id).await?;
    Ok(Json(json!({ "ttl": ttl })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthBody {
    health: CatalogHealth,
}

async fn health(
    State(c): State<Catalog>,
    Path((ns, backend, id)): Path<(String, String, String)>,
    Json(body): Json<HealthBody>,
) -> Result<Response, CatalogError> {
    c.set_health(&ObjectKey::new(ns, backend), &id, body.health)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn deregister(
    State(c): State<Catalog>,
    Path((ns, backend, id)): Path<(String, String, String)>,
) -> Result<Response, CatalogError> {
    c.deregister(&ObjectKey::new(ns, backend), &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `ballast register` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct RegisterArgs {
    /// The Backend (`namespace/name` or `name`).
    #[arg(long)]
    pub backend: String,
    #[arg(long)]
    pub address: IpAddr,
    /// Port, or a range `A-B`; repeatable. All ports share one lease.
    #[arg(long = "port", required = true, value_parser = port_range)]
    pub ports: Vec<(u16, u16)>,
    /// Lease TTL: the registration disappears this long after the last heartbeat.
    #[arg(long, default_value = "10s")]
    pub ttl: String,
    /// Registration id (default `<address>:<port>`); only with a single port.
    #[arg(long)]
    pub id: Option<String>,
    #[arg(long, value_enum, default_value = "passing")]
    pub health: HealthArg,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum HealthArg {
    Passing,
    Warning,
    Critical,
}

impl From<HealthArg> for CatalogHealth {
    fn from(h: HealthArg) -> Self {
        match h {
            HealthArg::Passing => CatalogHealth::Passing,
            HealthArg::Warning => CatalogHealth::Warning,
            HealthArg::Critical => CatalogHealth::Critical,
        }
    }
}

fn port_range(s: &str) -> Result<(u16, u16), String> {
    let p = |x: &str| x.trim().parse::<u16>().map_err(|e| format!("{x:?}: {e}"));
    match s.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (p(a)?, p(b)?);
            if a > b || a == 0 {
                return Err(format!("{s:?}: not a range A-B with 0 < A <= B"));
            }
            Ok((a, b))
        }
        None => {
            let a = p(s)?;
            if a == 0 {
                return Err("port 0".into());
            }
            Ok((a, a))
        }
    }
}

/// `ballast register`: registers, heartbeats every TTL/3 while running, deregisters (revokes
/// the lease) on SIGTERM/SIGINT. Killed, its registrations expire after the TTL.
pub fn register_cmd(
    etcd: crate::etcdctl::EtcdArgs,
    args: RegisterArgs,
) -> anyhow::Result<ExitCode> {
    let ports: Vec<u16> = args.ports.iter().flat_map(|&(a, b)| a..=b).collect();
    if args.id.is_some() && ports.len() != 1 {
        anyhow::bail!("--id needs exactly one port");
    }
    let ttl = ttl_secs(&args.ttl)?;
    let backend = crate::gateway_key(&args.backend);
    let regs: Vec<(String, Registration)> = ports
        .iter()
        .map(|&port| {
            let id = args
                .id
                .clone()
                .unwrap_or_else(|| format!("{}:{port}", args.address));
            (
                id,
                Registration {
                    address: args.address,
                    port,
                    health: args.health.into(),
                    weight: None,
                    zone: None,
                },
            )
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let client = etcd.client()?;
        let catalog = Catalog::new(client.clone(), etcd.etcd_prefix.clone());
        let mut lease = register_all(&catalog, &backend, ttl, &regs).await?;
        let every = Duration::from_secs_f64((ttl as f64 / 3.0).max(0.5));
        let mut ka: Option<ballast_etcd::LeaseKeepAlive> = None;
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = tokio::time::sleep(every) => {}
            }
            let beat = async {
                if ka.is_none() {
                    ka = Some(client.lease_keep_alive(lease).await?);
                }
                ka.as_mut().expect("set above").keep_alive().await
            };
            match beat.await {
                Ok(_) => {}
                Err(EtcdError::LeaseNotFound { .. }) => {
                    // Expired (e.g. etcd unreachable for longer than the TTL): register again.
                    tracing::warn!("registration lease expired; registering again");
                    ka = None;
                    match register_all(&catalog, &backend, ttl, &regs).await {
                        Ok(l) => lease = l,
                        Err(e) => tracing::warn!(error = %e, "re-registration failed; retrying"),
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "heartbeat failed; retrying");
                    ka = None;
                }
            }
        }
        match client.lease_revoke(lease).await {
            Ok(()) => println!("deregistered {} endpoint(s)", regs.len()),
            Err(e) => eprintln!("deregistering: {e} (the registrations expire after the TTL)"),
        }
        Ok(ExitCode::SUCCESS)
    })
}

async fn register_all(
    catalog: &Catalog,
    backend: &ObjectKey,
    ttl: i64,
    regs: &[(String, Registration)],
) -> anyhow::Result<i64> {
    let (lease, keys) = catalog.register(backend, ttl, regs).await?;
    println!(
        "registered {} endpoint(s) of {backend} with lease {lease:x} (ttl {ttl}s)",
        keys.len()
    );
    Ok(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_ttls() {
        assert_eq!(port_range("80"), Ok((80, 80)));
        assert_eq!(port_range("20000-20999"), Ok((20000, 20999)));
        assert!(port_range("9-1").is_err());
        assert!(port_range("0").is_err());
        assert_eq!(ttl_secs("10s").unwrap(), 10);
        assert!(
            ttl_secs("1500ms")
                .unwrap_err()
                .to_string()
                .contains("between")
        );
        assert!(valid_id("a/b").is_err());
    }
}
