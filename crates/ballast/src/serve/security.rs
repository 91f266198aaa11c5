//! Security flags of `ballast serve` and the start-up rules they enforce:
//! TLS/mTLS on the xDS port, node-identity authorization, no plaintext
//! secrets off loopback, and the admin token off loopback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use ballast_xds::security::{Admission, TlsFiles, TlsReloader};

use crate::authz::{DEFAULT_TRUST_DOMAIN, Policy};

#[derive(clap::Args, Debug, Clone, Default)]
pub struct SecurityFlags {
    /// Serve xDS over TLS with this certificate chain (PEM); re-read when it changes.
    #[arg(long, value_name = "FILE", requires = "xds_tls_key")]
    pub xds_tls_cert: Option<PathBuf>,
    /// The private key of --xds-tls-cert (PEM); re-read when it changes.
    #[arg(long, value_name = "FILE", requires = "xds_tls_cert")]
    pub xds_tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA bundle (mTLS), and serve
    /// each client only the gateways its certificate's identity may see.
    #[arg(long, value_name = "FILE", requires = "xds_tls_cert")]
    pub xds_client_ca: Option<PathBuf>,
    /// SPIFFE trust domain: URI SAN spiffe://<domain>/ns/<ns>/gw/<name> may be
    /// served gateway <ns>/<name>.
    #[arg(long, default_value = DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// YAML granting identities more gateways (DNS SANs, whole namespaces) or
    /// CSDS admin rights; needs --xds-client-ca.
    #[arg(long, value_name = "FILE", requires = "xds_client_ca")]
    pub authz_file: Option<PathBuf>,
    /// Serve a config with TLS secrets on a non-loopback xDS address without
    /// mTLS (anyone reaching the port can read the private keys).
    #[arg(long)]
    pub insecure_plaintext_xds: bool,
    /// Bearer token (file content) the admin API requires for everything but
    /// /healthz and /readyz; required when --admin-addr is not loopback.
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
}

/// What the flags turn into.
#[derive(Default)]
pub struct Prepared {
    pub tls: Option<Arc<TlsReloader>>,
    pub admission: Option<Admission>,
    pub admin_token: Option<Arc<str>>,
}

/// Validates the flags against the addresses and the config, and loads the
/// certificates and policy; every refusal says why and what to do.
pub fn prepare(
    flags: &SecurityFlags,
    xds_addr: SocketAddr,
    admin_addr: SocketAddr,
    configs: &[PathBuf],
) -> anyhow::Result<Prepared> {
    let mut out = Prepared::default();
    if let (Some(cert), Some(key)) = (&flags.xds_tls_cert, &flags.xds_tls_key) {
        let tls = TlsReloader::new(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: flags.xds_client_ca.clone(),
        })
        .context("loading the xDS TLS files")?;
        out.tls = Some(Arc::new(tls));
    }
    if flags.xds_client_ca.is_some() {
        let mut policy = Policy::new(&flags.trust_domain);
        if let Some(f) = &flags.authz_file {
            policy = policy.with_file(f)?;
        }
        out.admission = Some(policy.into_admission());
    }
    if !xds_addr.ip().is_loopback()
        && flags.xds_client_ca.is_none()
        && !flags.insecure_plaintext_xds
    {
        let secrets = count_secrets(configs)?;
        if let Some((n, first)) = secrets {
            bail!(
                "refusing to serve xDS on {xds_addr} without mTLS: the config has {n} TLS secret(s) (e.g. {first}) \
                 and any client that reaches this address could ask for their private keys over SDS. \
                 Pass --xds-tls-cert/--xds-tls-key/--xds-client-ca (see `ballast certs`), bind --xds-addr to loopback, \
                 or accept the risk with --insecure-plaintext-xds"
            );
        }
    }
    match &flags.admin_token_file {
        Some(f) => out.admin_token = Some(crate::admin::auth::read_token(f)?.into()),
        None if !admin_addr.ip().is_loopback() => bail!(
            "refusing to serve the admin API on {admin_addr} without a token: /debug/* shows every gateway's \
             config and connected proxies. Pass --admin-token-file FILE (clients send `Authorization: Bearer <token>`), \
             or bind --admin-addr to loopback"
        ),
        None => {}
    }
    Ok(out)
}

/// (count, first name) of the TLS secrets in the config; a config that does
/// not load is refused too (it cannot be shown to hold none).
fn count_secrets(configs: &[PathBuf]) -> anyhow::Result<Option<(usize, String)>> {
    if configs.is_empty() {
        return Ok(None); // the built-in quickstart has no secrets
    }
    let config = ballast_sources::load_paths(configs).map_err(|errs| {
        anyhow::anyhow!(
            "refusing to serve xDS off loopback without mTLS: cannot tell whether the config holds TLS secrets, it does not load ({} error(s), first: {})",
            errs.len(),
            errs.first().map(|e| e.to_string()).unwrap_or_default()
        )
    })?;
    Ok(config
        .secrets
        .keys()
        .next()
        .map(|k| (config.secrets.len(), k.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn admin_off_loopback_needs_a_token() {
        let f = SecurityFlags::default();
        assert!(prepare(&f, addr("127.0.0.1:1"), addr("127.0.0.1:2"), &[]).is_ok());
        let e = prepare(&f, addr("127.0.0.1:1"), addr("0.0.0.0:2"), &[])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--admin-token-file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("token");
        std::fs::write(&t, "s3cret\n").unwrap();
        let f = SecurityFlags {
            admin_token_file: Some(t),
            ..Default::default()
        };
        let p = prepare(&f, addr("127.0.0.1:1"), addr("0.0.0.0:2"), &[]).unwrap();
        assert_eq!(p.admin_token.as_deref(), Some("s3cret"));
    }
}
