//! `ballast serve --etcd`: flags, building the etcd source, and where the guard's state lives
//! in etcd (docs/operations.md, "etcd").

use std::path::PathBuf;

use anyhow::Context;
use ballast_etcd::{Client, ClientOptions, TlsOptions};
use ballast_sources::{EtcdSource, EtcdSourceOptions};

/// `ballast serve` flags for the etcd source.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EtcdArgs {
    /// etcd client URL (http:// or https://). Repeatable: every member of
    /// the cluster; the client fails over between them. Combinable with --config.
    #[arg(long = "etcd", value_name = "URL")]
    pub endpoints: Vec<String>,
    /// Key prefix of the config objects (one object per key, YAML or JSON).
    #[arg(long, default_value = ballast_sources::etcd::DEFAULT_PREFIX, value_name = "PREFIX")]
    pub etcd_prefix: String,
    /// CA bundle (PEM) that signed etcd's server certificates (https:// endpoints).
    #[arg(long, value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's --client-cert-auth.
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// Client key (PEM) for --etcd-cert.
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// Lease TTL of the leader election for singleton work (status write-back): a leader that
    /// dies is replaced after this long.
    #[arg(long, default_value = "10s", value_parser = crate::duration, value_name = "DURATION")]
    pub leader_ttl: std::time::Duration,
    /// This replica's name in the leader election (default: host/pid@admin-addr).
    #[arg(long, value_name = "NAME")]
    pub leader_identity: Option<String>,
}

impl EtcdArgs {
    pub fn enabled(&self) -> bool {
        !self.endpoints.is_empty()
    }

    fn client_options(&self) -> anyhow::Result<ClientOptions> {
        let mut opts = ClientOptions::default();
        if let Some(ca) = &self.etcd_ca {
            opts.tls = Some(
                TlsOptions::from_files(ca, self.etcd_cert.as_deref(), self.etcd_key.as_deref())
                    .context("loading the etcd TLS files")?,
            );
        } else if self.etcd_cert.is_some() {
            anyhow::bail!("--etcd-cert needs --etcd-ca (the CA that signed etcd's certificate)");
        }
        Ok(opts)
    }

    /// The source (and its client, shared with the guard state). Needs the runtime.
    pub fn source(&self) -> anyhow::Result<EtcdSource> {
        let mut opts = EtcdSourceOptions::new(self.endpoints.clone(), self.etcd_prefix.clone());
        opts.client = self.client_options()?;
        EtcdSource::new(opts).context("invalid --etcd")
    }

    /// The key holding the guard's restart baseline: bookkeeping under the prefix (keys
    /// `<prefix>_...` are never read as config).
    pub fn guard_state_key(&self) -> String {
        format!("{}_state/guard", self.etcd_prefix)
    }
}

/// The guard's state in etcd: the client and the key.
#[derive(Clone, Debug)]
pub struct EtcdState {
    pub client: Client,
    pub key: String,
}
