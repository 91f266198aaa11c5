//! [`GatewayResources`]: the Envoy resources of one Gateway, ready to become a snapshot.

use std::sync::Arc;

use ballast_model::ObjectKey;
use ballast_xds::{Resource, ResourceType, Snapshot, SnapshotChange, SnapshotError};

/// The full resource set of one Gateway, per type sorted by name. Resources are shared
/// (`Arc`) with the translator's caches and with other gateways using the same Backend or
/// Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayResources {
    pub gateway: ObjectKey,
    pub secrets: Vec<Arc<Resource>>,
    pub clusters: Vec<Arc<Resource>>,
    pub load_assignments: Vec<Arc<Resource>>,
    pub listeners: Vec<Arc<Resource>>,
    pub route_configs: Vec<Arc<Resource>>,
    /// VHDS virtual hosts (`{route configuration}/{host}`), for transports that
    /// split route configurations ([`crate::XdsTransport::splits_routes`]);
    /// empty otherwise.
    pub virtual_hosts: Vec<Arc<Resource>>,
}

impl GatewayResources {
    /// No resources (yet) for `gateway`.
    pub fn empty(gateway: ObjectKey) -> Self {
        GatewayResources {
            gateway,
            secrets: Vec::new(),
            clusters: Vec::new(),
            load_assignments: Vec::new(),
            listeners: Vec::new(),
            route_configs: Vec::new(),
            virtual_hosts: Vec::new(),
        }
    }

    /// Every list, in make-before-break type order (SDS, CDS, EDS, LDS, RDS, VHDS).
    pub fn by_type(&self) -> [(ResourceType, &[Arc<Resource>]); 6] {
        [
            (ResourceType::Secret, &self.secrets),
            (ResourceType::Cluster, &self.clusters),
            (ResourceType::ClusterLoadAssignment, &self.load_assignments),
            (ResourceType::Listener, &self.listeners),
            (ResourceType::RouteConfiguration, &self.route_configs),
            (ResourceType::VirtualHost, &self.virtual_hosts),
        ]
    }

    /// All resources, in [`Self::by_type`] order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Resource>> {
        self.secrets
            .iter()
            .chain(&self.clusters)
            .chain(&self.load_assignments)
            .chain(&self.listeners)
            .chain(&self.route_configs)
            .chain(&self.virtual_hosts)
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn sort(&mut self) {
        for list in [
            &mut self.secrets,
            &mut self.clusters,
            &mut self.load_assignments,
            &mut self.listeners,
            &mut self.route_configs,
            &mut self.virtual_hosts,
        ] {
            list.sort_by(|a, b| a.name().cmp(b.name()));
        }
    }

    /// A consistent snapshot of these resources (the builder checks every reference), sharing
    /// unchanged resources with `prev`.
    pub fn snapshot(&self, prev: Option<Arc<Snapshot>>) -> Result<Snapshot, SnapshotError> {
        let mut b = Snapshot::builder();
        if let Some(prev) = prev {
            b = b.reuse_from(prev);
        }
        for r in self.iter() {
            b.add(r.clone());
        }
        b.build()
    }

    /// [`Self::snapshot`] without the reference checks, for the resources of
    /// a non-ADS transport: their EDS/RDS/SDS references name another stream
    /// (`api_config_source`), so the builder sees no reference to check. The
    /// same gateway's ADS translation (identical but for the config sources)
    /// is the one checked.
    pub fn snapshot_unchecked(
        &self,
        prev: Option<Arc<Snapshot>>,
    ) -> Result<Snapshot, SnapshotError> {
        let mut b = Snapshot::builder();
        if let Some(prev) = prev {
            b = b.reuse_from(prev);
        }
        for r in self.iter() {
            b.add(r.clone());
        }
        b.build_unchecked()
    }

    /// The resource of type `ty` named `name`.
    pub fn find(&self, ty: ResourceType, name: &str) -> Option<&Arc<Resource>> {
        let (_, list) = self.by_type().into_iter().find(|(t, _)| *t == ty)?;
        let i = list.binary_search_by(|r| r.name().cmp(name)).ok()?;
        Some(&list[i])
    }

    /// The snapshot [`Self::snapshot`] (`check`) or [`Self::snapshot_unchecked`] gives, from
    /// `prev`, a snapshot of an earlier version of these resources, and the resources that
    /// may differ since ([`crate::ResourcePatch::touched`]): costs what was touched, not
    /// every resource of the Gateway.
    pub fn snapshot_patched(
        &self,
        prev: &Arc<Snapshot>,
        touched: &[(ResourceType, Arc<str>)],
        check: bool,
    ) -> Result<Snapshot, SnapshotError> {
        let changes = touched.iter().map(|(ty, name)| match self.find(*ty, name) {
            Some(r) => SnapshotChange::Put(r.clone()),
            None => SnapshotChange::Remove(*ty, name.clone()),
        });
        Snapshot::patched(prev, changes, check)
    }

    /// The resources as `---`-separated proto-JSON documents (JSON is YAML), each with its
    /// `@type`, in [`Self::by_type`] order, for `ballast translate`. Private keys are redacted.
    pub fn to_yaml(&self) -> String {
        let mut out = String::new();
        for r in self.iter() {
            let url = r.ty().type_url();
            let full_name = url.rsplit('/').next().unwrap_or(url);
            let mut doc = match ballast_xds::json::bytes_to_json(full_name, &r.value_bytes()) {
                Ok(serde_json::Value::Object(m)) => m,
                Ok(other) => {
                    let mut m = serde_json::Map::new();
                    m.insert("value".into(), other);
                    m
                }
                Err(e) => {
                    let mut m = serde_json::Map::new();
                    m.insert("name".into(), r.name().into());
                    m.insert("error".into(), e.to_string().into());
                    m
                }
            };
            if r.ty() == ResourceType::Secret
                && let Some(key) = doc
                    .get_mut("tlsCertificate")
                    .and_then(|t| t.get_mut("privateKey"))
            {
                *key = serde_json::json!({ "inlineString": "[redacted]" });
            }
            doc.insert("@type".into(), url.into());
            out.push_str("---\n");
            out.push_str(
                &serde_json::to_string_pretty(&serde_json::Value::Object(doc))
                    .expect("JSON values serialize"),
            );
            out.push('\n');
        }
        out
    }
}
