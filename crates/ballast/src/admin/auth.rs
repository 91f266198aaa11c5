//! Bearer-token protection of the admin API (required off loopback).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Paths an orchestrator probes without credentials.
pub const OPEN_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// Reads a token file (surrounding whitespace ignored; must not be empty).
pub fn read_token(path: &Path) -> anyhow::Result<String> {
    let t = std::fs::read_to_string(path)
        .with_context(|| format!("reading admin token file {}", path.display()))?;
    let t = t.trim();
    if t.is_empty() {
        bail!("admin token file {} is empty", path.display());
    }
    Ok(t.to_string())
}

/// Equal-time comparison: the time taken does not tell how much matched.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Every path but [`OPEN_PATHS`] (unknown ones too) needs `Authorization: Bearer <token>`.
pub fn require_token(router: Router, token: Arc<str>) -> Router {
    router.layer(axum::middleware::from_fn(
        move |req: Request, next: Next| {
            let token = token.clone();
            async move {
                if OPEN_PATHS.contains(&req.uri().path()) {
                    return next.run(req).await;
                }
                let given = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .unwrap_or("");
                if same(given.trim().as_bytes(), token.as_bytes()) {
                    next.run(req).await
                } else {
                    unauthorized()
                }
            }
        },
    ))
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "admin API: send `Authorization: Bearer <token>` (the content of --admin-token-file)\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparison() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
    }
}
