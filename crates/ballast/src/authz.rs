//! Node identity → gateway authorization (the policy `ballast serve` plugs
//! into the library's admission hook when mTLS is on).
//!
//! Default rule: a client certificate with URI SAN
//! `spiffe://<trust-domain>/ns/<ns>/gw/<name>` may be served exactly gateway
//! `<ns>/<name>`. An authz file (`--authz-file`) may grant more:
//!
//! ```yaml
//! grants:
//!   - identity: spiffe://ballast.local/ns/ops/sa/edge-fleet   # a URI SAN
//!     gateways: [default/edge, "infra/*"]                      # "ns/*": a whole namespace
//!   - identity: dns:edge-1.example.com                         # a DNS SAN
//!     gateways: [default/edge]
//! admins:                                # may read every node's status over CSDS
//!   - spiffe://ballast.local/admin
//! ```

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use ballast_xds::security::{Access, Admission, AdmissionRequest, PeerIdentity, Rejection};
use serde::Deserialize;

pub const DEFAULT_TRUST_DOMAIN: &str = "ballast.local";

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AuthzFile {
    #[serde(default)]
    grants: Vec<GrantFile>,
    #[serde(default)]
    admins: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantFile {
    identity: String,
    gateways: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Identity {
    Uri(String),
    Dns(String),
}

impl Identity {
    fn parse(s: &str) -> Result<Identity, String> {
        if let Some(d) = s.strip_prefix("dns:") {
            Ok(Identity::Dns(d.to_ascii_lowercase()))
        } else if s.contains("://") {
            Ok(Identity::Uri(s.to_string()))
        } else {
            Err(format!(
                "identity {s:?} is neither a URI SAN (e.g. spiffe://...) nor `dns:NAME`"
            ))
        }
    }
    fn held_by(&self, peer: &PeerIdentity) -> bool {
        match self {
            Identity::Uri(u) => peer.uris.iter().any(|x| x == u),
            Identity::Dns(d) => peer.dns.iter().any(|x| x.eq_ignore_ascii_case(d)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Gateways {
    Exact(String),
    Namespace(String),
}

impl Gateways {
    fn parse(s: &str) -> Result<Gateways, String> {
        match s.split_once('/') {
            Some((ns, "*")) if !ns.is_empty() && !ns.contains('*') => {
                Ok(Gateways::Namespace(ns.to_string()))
            }
            Some((ns, name))
                if !ns.is_empty()
                    && !name.is_empty()
                    && !s.contains('*')
                    && !name.contains('/') =>
            {
                Ok(Gateways::Exact(s.to_string()))
            }
            _ => Err(format!(
                "gateway {s:?} is neither `namespace/name` nor `namespace/*`"
            )),
        }
    }
    fn matches(&self, group: &str) -> bool {
        match self {
            Gateways::Exact(g) => g == group,
            Gateways::Namespace(ns) => group.split_once('/').is_some_and(|(n, _)| n == ns),
        }
    }
}

/// The authorization policy of `ballast serve`.
#[derive(Debug, Clone)]
pub struct Policy {
    trust_domain: String,
    grants: Vec<(Identity, Vec<Gateways>)>,
    admins: Vec<Identity>,
}

impl Policy {
    pub fn new(trust_domain: &str) -> Policy {
        Policy {
            trust_domain: trust_domain.to_string(),
            grants: Vec::new(),
            admins: Vec::new(),
        }
    }

    /// Adds the grants of an authz file; errors name the file and the entry.
    pub fn with_file(mut self, path: &Path) -> anyhow::Result<Policy> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading authz file {}", path.display()))?;
        let file: AuthzFile = serde_saphyr::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        for (i, g) in file.grants.iter().enumerate() {
            let at = |e: String| anyhow::anyhow!("{}: grants[{i}]: {e}", path.display());
            let id = Identity::parse(&g.identity).map_err(at)?;
            if g.gateways.is_empty() {
                return Err(at("`gateways` is empty".into()));
            }
            let gws = g
                .gateways
                .iter()
                .map(|s| Gateways::parse(s))
                .collect::<Result<Vec<_>, _>>()
                .map_err(at)?;
            self.grants.push((id, gws));
        }
        for (i, a) in file.admins.iter().enumerate() {
            let id = Identity::parse(a)
                .map_err(|e| anyhow::anyhow!("{}: admins[{i}]: {e}", path.display()))?;
            self.admins.push(id);
        }
        Ok(self)
    }

    /// The gateway the default SPIFFE rule grants a URI SAN, if any.
    fn spiffe_gateway<'a>(&self, uri: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = uri.strip_prefix("spiffe://")?;
        let (td, path) = rest.split_once('/')?;
        if td != self.trust_domain {
            return None;
        }
        let mut parts = path.split('/');
        match (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) {
            (Some("ns"), Some(ns), Some("gw"), Some(name), None)
                if !ns.is_empty() && !name.is_empty() =>
            {
                Some((ns, name))
            }
            _ => None,
        }
    }

    pub fn decide(&self, req: &AdmissionRequest<'_>) -> Result<(), Rejection> {
        // A grant names a gateway, whatever transport its Envoys use.
        let gateway = crate::grouping::gateway_part(req.group);
        let Some(peer) = req.peer else {
            return Err(Rejection {
                reason: Some("no client certificate".into()),
                ..Rejection::new(None, req.group)
            });
        };
        if req.access == Access::ClientStatus && self.admins.iter().any(|a| a.held_by(peer)) {
            return Ok(());
        }
        let by_spiffe = peer.uris.iter().any(|u| {
            self.spiffe_gateway(u)
                .is_some_and(|(ns, name)| gateway.split_once('/') == Some((ns, name)))
        });
        let by_grant = self
            .grants
            .iter()
            .any(|(id, gws)| id.held_by(peer) && gws.iter().any(|g| g.matches(gateway)));
        if by_spiffe || by_grant {
            Ok(())
        } else {
            Err(Rejection::new(Some(peer), req.group))
        }
    }

    pub fn into_admission(self) -> Admission {
        let p = Arc::new(self);
        Arc::new(move |req: &AdmissionRequest<'_>| p.decide(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_xds::envoy_types::pb::envoy::config::core::v3::Node;

    fn peer(uris: &[&str], dns: &[&str]) -> PeerIdentity {
        PeerIdentity {
            uris: uris.iter().map(|s| s.to_string()).collect(),
            dns: dns.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn ask(p: &Policy, peer: Option<&PeerIdentity>, group: &str, access: Access) -> bool {
        let node = Node::default();
        p.decide(&AdmissionRequest {
            peer,
            node: &node,
            group,
            access,
        })
        .is_ok()
    }

    #[test]
    fn spiffe_rule_grants_exactly_its_gateway() {
        let p = Policy::new("ballast.local");
        let a = peer(&["spiffe://ballast.local/ns/default/gw/a"], &[]);
        assert!(ask(&p, Some(&a), "default/a", Access::Config));
        for other in ["default/b", "other/a", "default/a/x", "default/ab"] {
            assert!(!ask(&p, Some(&a), other, Access::Config), "{other}");
        }
        // Another trust domain, a longer path, or no certificate: nothing.
        let foreign = peer(&["spiffe://evil.example/ns/default/gw/a"], &[]);
        assert!(!ask(&p, Some(&foreign), "default/a", Access::Config));
        let longer = peer(&["spiffe://ballast.local/ns/default/gw/a/x"], &[]);
        assert!(!ask(&p, Some(&longer), "default/a", Access::Config));
        assert!(!ask(&p, None, "default/a", Access::Config));
        let err = p
            .decide(&AdmissionRequest {
                peer: Some(&a),
                node: &Node::default(),
                group: "default/b",
                access: Access::Config,
            })
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "identity spiffe://ballast.local/ns/default/gw/a may not be served default/b"
        );
    }

    #[test]
    fn file_grants_dns_namespaces_and_admins() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("authz.yaml");
        std::fs::write(
            &f,
            "grants:\n  - identity: dns:Edge.example.com\n    gateways: [default/edge]\n  - identity: spiffe://ballast.local/ops\n    gateways: [\"infra/*\"]\nadmins: [spiffe://ballast.local/admin]\n",
        )
        .unwrap();
        let p = Policy::new("ballast.local").with_file(&f).unwrap();
        let dns = peer(&[], &["edge.example.com"]);
        assert!(ask(&p, Some(&dns), "default/edge", Access::Config));
        assert!(!ask(&p, Some(&dns), "default/other", Access::Config));
        let ops = peer(&["spiffe://ballast.local/ops"], &[]);
        assert!(ask(&p, Some(&ops), "infra/x", Access::Config));
        assert!(!ask(&p, Some(&ops), "infra2/x", Access::Config));
        let admin = peer(&["spiffe://ballast.local/admin"], &[]);
        assert!(ask(&p, Some(&admin), "default/edge", Access::ClientStatus));
        assert!(!ask(&p, Some(&admin), "default/edge", Access::Config));
    }

    #[test]
    fn bad_file_names_file_and_entry() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("authz.yaml");
        std::fs::write(
            &f,
            "grants:\n  - identity: edge\n    gateways: [default/edge]\n",
        )
        .unwrap();
        let e = Policy::new("t").with_file(&f).unwrap_err().to_string();
        assert!(
            e.contains("authz.yaml: grants[0]") && e.contains("edge"),
            "{e}"
        );
        std::fs::write(&f, "grants:\n  - identity: dns:x\n    gateways: [\"*\"]\n").unwrap();
        let e = Policy::new("t").with_file(&f).unwrap_err().to_string();
        assert!(
            e.contains("grants[0]") && e.contains("namespace/name"),
            "{e}"
        );
        std::fs::write(&f, "grant: []\n").unwrap();
        let e = Policy::new("t").with_file(&f).unwrap_err().to_string();
        assert!(e.contains("authz.yaml"), "{e}");
    }
}
