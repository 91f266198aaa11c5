//! Kubernetes `v1` `Service` and `discovery.k8s.io/v1` `EndpointSlice` as backends.
//!
//! A backendRef without `group`/`kind` means a core Service (Gateway API). Ballast does not run
//! kube-proxy: a Service's endpoints are the ones its EndpointSlices (labelled
//! `kubernetes.io/service-name`) list, so `kubectl get svc,endpointslices -o yaml` exports (and a
//! future Kubernetes source) feed Ballast the same objects a cluster has. Each Service port
//! becomes one derived [`Backend`] (see [`service_backends`]), which the translator serves like any
//! other Backend: EDS cluster, endpoint changes are EDS-only updates. An `ExternalName` Service
//! becomes, per port, a DNS Backend resolving `externalName` (see [`external_name_backends`]).
//!
//! Export noise (`status`, and the Service spec fields that only kube-proxy uses) is accepted and
//! ignored, field by field: an unknown field is still an error.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;

use super::{
    Backend, BackendSpec, DnsSettings, Endpoint, EndpointAddress, HealthStatus, LoadBalancer,
    Metadata, ObjectKey, Source, object_kind, upstream_protocol,
};
use crate::spanned::{Pos, Spanned};

/// The label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Any value, accepted and ignored (fields Kubernetes sets that mean nothing to Ballast).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ignored;

impl<'de> Deserialize<'de> for Ignored {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Ignored)
    }
}

#[derive(Clone, Debug)]
pub struct Service {
    pub metadata: Metadata,
    pub spec: ServiceSpec,
    pub source: Source,
}
object_kind!(Service, super::Kind::Service);

/// `ServiceSpec`: the fields Ballast uses, and the rest of Kubernetes' accepted and ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(default)]
    pub ports: Vec<ServicePort>,
    /// `ClusterIP` (default), `NodePort`, `LoadBalancer` (all served from EndpointSlices) or
    /// `ExternalName`.
    #[serde(default, rename = "type")]
    pub type_: Option<Spanned<String>>,
    /// The DNS name of an `ExternalName` Service.
    #[serde(default)]
    pub external_name: Option<Spanned<String>>,
    #[serde(default)]
    pub selector: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "clusterIP")]
    pub cluster_ip: Ignored,
    #[serde(default, rename = "clusterIPs")]
    pub cluster_ips: Ignored,
    #[serde(default, rename = "externalIPs")]
    pub external_ips: Ignored,
    #[serde(default)]
    pub session_affinity: Ignored,
    #[serde(default)]
    pub session_affinity_config: Ignored,
    #[serde(default, rename = "loadBalancerIP")]
    pub load_balancer_ip: Ignored,
    #[serde(default)]
    pub load_balancer_source_ranges: Ignored,
    #[serde(default)]
    pub load_balancer_class: Ignored,
    #[serde(default)]
    pub allocate_load_balancer_node_ports: Ignored,
    #[serde(default)]
    pub external_traffic_policy: Ignored,
    #[serde(default)]
    pub internal_traffic_policy: Ignored,
    #[serde(default)]
    pub health_check_node_port: Ignored,
    #[serde(default)]
    pub publish_not_ready_addresses: Ignored,
    #[serde(default)]
    pub ip_families: Ignored,
    #[serde(default)]
    pub ip_family_policy: Ignored,
    #[serde(default)]
    pub traffic_distribution: Ignored,
}

impl Service {
    pub fn is_external_name(&self) -> bool {
        self.spec
            .type_
            .as_ref()
            .is_some_and(|t| t.as_str() == "ExternalName")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServicePort {
    /// Required when the Service has several ports; matches the EndpointSlice port name.
    #[serde(default)]
    pub name: Option<String>,
    pub port: Spanned<u32>,
    /// A number or the name of a container port; only used when no EndpointSlice lists the
    /// port (then there are no endpoints anyway), kept for round-tripping.
    #[serde(default)]
    pub target_port: Option<IntOrString>,
    #[serde(default)]
    pub protocol: Option<Spanned<String>>,
    /// `kubernetes.io/h2c`, `grpc`, `kubernetes.io/ws`, ...: selects the upstream protocol.
    #[serde(default)]
    pub app_protocol: Option<Spanned<String>>,
    #[serde(default)]
    pub node_port: Ignored,
}

impl ServicePort {
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    Int(u32),
    String(String),
}

#[derive(Clone, Debug)]
pub struct EndpointSlice {
    pub metadata: Metadata,
    pub spec: EndpointSliceSpec,
    pub source: Source,
}
object_kind!(EndpointSlice, super::Kind::EndpointSlice);

impl EndpointSlice {
    /// The Service this slice belongs to (its `kubernetes.io/service-name` label).
    pub fn service(&self) -> Option<ObjectKey> {
        self.metadata
            .labels
            .get(SERVICE_NAME_LABEL)
            .map(|s| ObjectKey::new(&self.metadata.namespace, s))
    }
}

/// The top-level fields of an EndpointSlice (it has no `spec`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointSliceSpec {
    /// `IPv4`, `IPv6` or `FQDN`.
    pub address_type: Spanned<String>,
    #[serde(default)]
    pub endpoints: Option<Vec<SliceEndpoint>>,
    #[serde(default)]
    pub ports: Option<Vec<SlicePort>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SliceEndpoint {
    pub addresses: Vec<Spanned<String>>,
    #[serde(default)]
    pub conditions: EndpointConditions,
    #[serde(default)]
    pub zone: Option<String>,
    #[serde(default)]
    pub hostname: Ignored,
    #[serde(default)]
    pub node_name: Ignored,
    #[serde(default)]
    pub target_ref: Ignored,
    #[serde(default)]
    pub hints: Ignored,
    #[serde(default)]
    pub deprecated_topology: Ignored,
}

/// Kubernetes endpoint conditions; unset `ready` means ready (the API's documented reading).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConditions {
    #[serde(default)]
    pub ready: Option<bool>,
    #[serde(default)]
    pub serving: Option<bool>,
    #[serde(default)]
    pub terminating: Option<bool>,
}

impl EndpointConditions {
    /// Ready → healthy; not ready but still serving (a terminating pod finishing its work) →
    /// draining (no new requests); otherwise unhealthy.
    pub fn health(self) -> HealthStatus {
        match (self.ready, self.serving) {
            (Some(false), Some(true)) => HealthStatus::Draining,
            (Some(false), _) => HealthStatus::Unhealthy,
            _ => HealthStatus::Healthy,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SlicePort {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub port: Option<u32>,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub app_protocol: Option<String>,
}

/// The name of the Backend derived from port `port` of Service `service`. `:` cannot occur in a
/// Kubernetes name, so it never collides with a Ballast Backend.
pub fn service_backend_name(service: &str, port: u32) -> String {
    format!("{service}:{port}")
}

/// One Backend per port of `service`, with the endpoints of its `slices`: the slice port whose
/// name equals the Service port's name gives the port; conditions give the health; `zone` the
/// locality. Duplicate address:port pairs (a pod listed by two slices while they are rewritten)
/// are kept once. FQDN slices are skipped (DNS backends are not EDS endpoints).
pub fn service_backends<'a>(
    service: &Service,
    slices: impl Iterator<Item = &'a EndpointSlice> + Clone,
) -> Vec<Backend> {
    let mut out = Vec::new();
    if service.is_external_name() {
        return external_name_backends(service);
    }
    for sp in &service.spec.ports {
        let mut endpoints: Vec<Endpoint> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for slice in slices.clone() {
            if !matches!(slice.spec.address_type.as_str(), "IPv4" | "IPv6") {
                continue;
            }
            let Some(port) = slice
                .spec
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref().unwrap_or("") == sp.name())
                .and_then(|p| p.port)
            else {
                continue;
            };
            for e in slice.spec.endpoints.iter().flatten() {
                for a in &e.addresses {
                    let Ok(ip) = a.parse::<IpAddr>() else {
                        continue;
                    };
                    if !seen.insert((ip, port)) {
                        continue;
                    }
                    endpoints.push(Endpoint {
                        address: Spanned::new(ip.into(), a.pos),
                        port: Spanned::new(port, Pos::UNKNOWN),
                        weight: None,
                        zone: e.zone.clone().filter(|z| !z.is_empty()),
                        health: e.conditions.health(),
                    });
                }
            }
        }
        let mut metadata = service.metadata.clone();
        metadata.name = service_backend_name(&service.metadata.name, sp.port.value);
        out.push(Backend {
            metadata,
            spec: BackendSpec {
                endpoints,
                load_balancer: LoadBalancer::default(),
                connect_timeout: None,
                health_check: None,
                // The Service port's appProtocol, else the slice port's; unknown values (any
                // string is valid in Kubernetes) mean HTTP/1.1.
                protocol: sp
                    .app_protocol
                    .clone()
                    .or_else(|| {
                        slices
                            .clone()
                            .find_map(|s| {
                                s.spec.ports.iter().flatten().find_map(|p| {
                                    (p.name.as_deref().unwrap_or("") == sp.name())
                                        .then(|| p.app_protocol.clone())
                                        .flatten()
                                })
                            })
                            .map(|a| Spanned::new(a, Pos::UNKNOWN))
                    })
                    .filter(|a| upstream_protocol(a).is_some()),
                dns: None,
            },
            source: service.source.clone(),
        });
    }
    out
}

/// An `ExternalName` Service: per port, a DNS Backend with the one endpoint
/// `externalName:port` (what a pod reaching the Service's CNAME on that port connects to).
/// Envoy re-resolves the name when its TTL expires, as a pod's resolver would.
fn external_name_backends(service: &Service) -> Vec<Backend> {
    let Some(name) = &service.spec.external_name else {
        return Vec::new(); // invalid (validation says so): nothing to serve
    };
    // Kubernetes allows a trailing dot (an absolute name); Envoy resolves it the same without.
    let host = name
        .value
        .strip_suffix('.')
        .unwrap_or(&name.value)
        .to_owned();
    service
        .spec
        .ports
        .iter()
        .map(|sp| {
            let mut metadata = service.metadata.clone();
            metadata.name = service_backend_name(&service.metadata.name, sp.port.value);
            Backend {
                metadata,
                spec: BackendSpec {
                    endpoints: vec![Endpoint {
                        address: Spanned::new(EndpointAddress::Hostname(host.clone()), name.pos),
                        port: sp.port.clone(),
                        weight: None,
                        zone: None,
                        health: HealthStatus::Healthy,
                    }],
                    load_balancer: LoadBalancer::default(),
                    connect_timeout: None,
                    health_check: None,
                    protocol: sp
                        .app_protocol
                        .clone()
                        .filter(|a| upstream_protocol(a).is_some()),
                    dns: Some(DnsSettings {
                        respect_ttl: true,
                        ..DnsSettings::default()
                    }),
                },
                source: service.source.clone(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::set::{BackendRefResolution, BackendTarget};
    use crate::{ConfigSet, HttpRoute};

    const EXPORT: &str = include_str!("../../testdata/kubectl-export.yaml");

    fn route(ns: &str, refs: &str) -> String {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: r, namespace: {ns} }}\nspec:\n  parentRefs: [{{ name: gw }}]\n  rules:\n  - backendRefs: [{refs}]\n"
        )
    }

    fn backend(ns: &str, name: &str) -> String {
        format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: {name}, namespace: {ns} }}\nspec:\n  endpoints: [{{ address: 10.0.0.1, port: 80 }}]\n"
        )
    }

    fn resolve(set: &ConfigSet) -> Vec<BackendRefResolution> {
        let r: &HttpRoute = set.http_routes.values().next().unwrap();
        r.spec.rules[0]
            .backend_refs
            .iter()
            .map(|b| set.resolve_backend(r, b))
            .collect()
    }

    #[test]
    fn kubectl_export_loads_and_derives_backends_per_port() {
        let set = ConfigSet::build([("export.yaml", EXPORT)]).unwrap();
        assert_eq!(set.services.len(), 1);
        assert_eq!(set.endpoint_slices.len(), 1);
        let http = &set.service_backends[&ObjectKey::new("shop", "web:80")];
        let eps: Vec<(String, u32, Option<&str>, HealthStatus)> = http
            .spec
            .endpoints
            .iter()
            .map(|e| {
                (
                    e.address.to_string(),
                    e.port.value,
                    e.zone.as_deref(),
                    e.health,
                )
            })
            .collect();
        assert_eq!(
            eps,
            vec![
                (
                    "10.244.1.5".into(),
                    8080,
                    Some("zone-a"),
                    HealthStatus::Healthy
                ),
                (
                    "10.244.2.9".into(),
                    8080,
                    Some("zone-b"),
                    HealthStatus::Draining
                ),
                (
                    "10.244.2.10".into(),
                    8080,
                    Some("zone-b"),
                    HealthStatus::Unhealthy
                ),
            ]
        );
        let admin = &set.service_backends[&ObjectKey::new("shop", "web:9000")];
        assert!(admin.spec.endpoints.iter().all(|e| e.port.value == 9901));
    }

    #[test]
    fn unknown_spec_field_is_still_an_error() {
        let bad = EXPORT.replace("sessionAffinity: None", "sessionAfinity: None");
        let errs = ConfigSet::build([("export.yaml", bad)]).unwrap_err();
        assert!(errs[0].to_string().contains("sessionAfinity"), "{errs:?}");
    }

    #[test]
    fn bare_ref_prefers_service_then_falls_back_to_backend_with_warning() {
        // A Service and a Backend both named web: the bare ref means the Service.
        let both = ConfigSet::build([
            ("export.yaml", EXPORT.to_owned()),
            ("b.yaml", backend("shop", "web")),
            ("r.yaml", route("shop", "{ name: web, port: 80 }")),
        ])
        .unwrap();
        match &resolve(&both)[0] {
            BackendRefResolution::Resolved(b) => assert_eq!(b.metadata.name, "web:80"),
            other => panic!("{other:?}"),
        }
        // Only a Backend: still resolves (deprecated shorthand), and status says how to fix it.
        let only_backend = ConfigSet::build([
            ("b.yaml", backend("shop", "web")),
            ("r.yaml", route("shop", "{ name: web, port: 80 }")),
        ])
        .unwrap();
        match &resolve(&only_backend)[0] {
            BackendRefResolution::Resolved(b) => assert_eq!(b.metadata.name, "web"),
            other => panic!("{other:?}"),
        }
        let problems = crate::status::compute(&only_backend).problems();
        assert!(
            problems
                .iter()
                .any(|p| p.contains("Add `group: ballast.dev` and `kind: Backend`")),
            "{problems:?}"
        );
        // The explicit form: no warning.
        let explicit = ConfigSet::build([
            ("b.yaml", backend("shop", "web")),
            (
                "r.yaml",
                route(
                    "shop",
                    "{ group: ballast.dev, kind: Backend, name: web, port: 80 }",
                ),
            ),
        ])
        .unwrap();
        let problems = crate::status::compute(&explicit).problems();
        assert!(
            problems.iter().all(|p| !p.contains("backendRefs")),
            "{problems:?}"
        );
        let r = explicit.http_routes.values().next().unwrap();
        assert_eq!(
            explicit.backend_target("shop", &r.spec.rules[0].backend_refs[0]),
            BackendTarget::Backend {
                key: ObjectKey::new("shop", "web"),
                shorthand: false
            }
        );
    }

    #[test]
    fn service_ref_needs_an_existing_port() {
        let set = ConfigSet::build([
            ("export.yaml", EXPORT.to_owned()),
            (
                "r.yaml",
                route(
                    "shop",
                    "{ kind: Service, name: web, port: 81 }, { name: web }, { name: nope, port: 80 }",
                ),
            ),
        ])
        .unwrap();
        assert!(
            resolve(&set)
                .iter()
                .all(|r| *r == BackendRefResolution::NotFound)
        );
        let problems = crate::status::compute(&set).problems().join("\n");
        assert!(
            problems.contains("Service shop/web has no port 81"),
            "{problems}"
        );
        assert!(problems.contains("port is required"), "{problems}");
        assert!(
            problems.contains("Service shop/nope not found"),
            "{problems}"
        );
    }

    #[test]
    fn external_name_services_become_dns_backends() {
        let set = ConfigSet::build([
            (
                "svc.yaml",
                "apiVersion: v1\nkind: Service\nmetadata: { name: ext, namespace: shop }\nspec:\n  type: ExternalName\n  externalName: api.example.com.\n  ports: [{ name: https, port: 443 }, { name: h2, port: 8443, appProtocol: kubernetes.io/h2c }]\n".to_owned(),
            ),
            ("r.yaml", route("shop", "{ name: ext, port: 443 }")),
        ])
        .unwrap();
        let [BackendRefResolution::Resolved(b)] = &resolve(&set)[..] else {
            panic!("{:?}", resolve(&set));
        };
        // One DNS endpoint, the name without its trailing dot, on the Service port; TTL-driven.
        assert_eq!(b.metadata.name, "ext:443");
        assert!(b.spec.is_dns());
        assert_eq!(
            (
                b.spec.endpoints[0].address.to_string(),
                b.spec.endpoints[0].port.value
            ),
            ("api.example.com".to_owned(), 443)
        );
        assert!(b.spec.dns.as_ref().unwrap().respect_ttl);
        let h2 = &set.service_backends[&ObjectKey::new("shop", "ext:8443")];
        assert_eq!(
            h2.spec.upstream_protocol(),
            super::super::UpstreamProtocol::Http2
        );
        let problems = crate::status::compute(&set).problems();
        assert!(
            problems.iter().all(|p| !p.contains("backendRefs")),
            "{problems:?}"
        );
        // A bad name is a positioned error.
        let e = ConfigSet::build([(
            "svc.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: { name: ext }\nspec:\n  type: ExternalName\n  externalName: Bad_Name\n",
        )])
        .unwrap_err();
        assert!(
            e[0].to_string().starts_with("svc.yaml:6:17: ")
                && e[0].to_string().contains("spec.externalName"),
            "{e:?}"
        );
        // ExternalName needs externalName.
        let e = ConfigSet::build([(
            "svc.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: { name: ext }\nspec:\n  type: ExternalName\n",
        )])
        .unwrap_err();
        assert!(e[0].to_string().contains("spec.externalName"), "{e:?}");
    }

    #[test]
    fn derived_backends_follow_inserts_and_removals() {
        let mut set = ConfigSet::build([("export.yaml", EXPORT)]).unwrap();
        let slice_key = ObjectKey::new("shop", "web-x7k2p");
        let http = ObjectKey::new("shop", "web:80");
        let before = set.service_backends[&http].clone();
        set.remove(crate::Kind::EndpointSlice, &slice_key);
        assert!(set.service_backends[&http].spec.endpoints.is_empty());
        let again = ConfigSet::build([("export.yaml", EXPORT)]).unwrap();
        set.insert(again.get(crate::Kind::EndpointSlice, &slice_key).unwrap());
        assert_eq!(set.service_backends[&http], before);
        set.remove(crate::Kind::Service, &ObjectKey::new("shop", "web"));
        assert!(set.service_backends.is_empty());
        // Rebuilding from scratch gives the same set as the incremental updates.
        let mut scratch = ConfigSet::build([("export.yaml", EXPORT)]).unwrap();
        scratch.remove(crate::Kind::Service, &ObjectKey::new("shop", "web"));
        assert_eq!(set, scratch);
    }
}
