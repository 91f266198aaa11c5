//! Building the full resource set of one Gateway, reusing whatever is cached and still valid.
//!
//! Every cache entry remembers the objects it was computed from and is only reused when they
//! are unchanged (`Arc` identity or equality), so a stale cache can cost time but never produce
//! wrong resources; which gateways to rebuild is the dependency index's job.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ballast_model::{Backend, ConfigSet, HttpRoute, ObjectKey, Secret};
use ballast_xds::{Resource, XdsResource};
use envoy_types::pb::envoy::config::listener::v3::Listener as EnvoyListener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;

use crate::index::{Deps, routes_naming};
use crate::listener::{certificate_refs, envoy_listener, plan};
use crate::route::{
    Attached, Contributors, PrevHosts, TranslatedRoute, backend_signature, translate_route,
    virtual_hosts,
};
use crate::{GatewayResources, Options, TranslateStats, cluster, encode, secret};

/// Encoded cluster and load assignment of one Backend version.
pub(crate) struct BackendEntry {
    pub backend: Arc<Backend>,
    pub cluster: Arc<Resource>,
    pub load_assignment: Arc<Resource>,
}

pub(crate) struct SecretEntry {
    pub secret: Arc<Secret>,
    pub resource: Arc<Resource>,
}

/// Per-object caches shared by all gateways: a Backend used by a thousand gateways is encoded
/// once and every gateway holds the same `Arc<Resource>`.
#[derive(Default)]
pub(crate) struct Caches {
    pub backends: BTreeMap<ObjectKey, BackendEntry>,
    pub secrets: BTreeMap<ObjectKey, SecretEntry>,
    pub routes: BTreeMap<ObjectKey, Arc<TranslatedRoute>>,
}

fn same<T: PartialEq>(a: &Arc<T>, b: &Arc<T>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

impl Caches {
    pub fn route(
        &mut self,
        config: &ConfigSet,
        route: &Arc<HttpRoute>,
        stats: &mut TranslateStats,
    ) -> Arc<TranslatedRoute> {
        let key = route.key();
        if let Some(t) = self.routes.get(&key)
            && same(&t.route, route)
            && t.signature == backend_signature(config, route)
        {
            stats.routes_reused += 1;
            return t.clone();
        }
        stats.routes_translated += 1;
        let t = Arc::new(translate_route(config, route));
        self.routes.insert(key, t.clone());
        t
    }

    /// The encoded resources of `backend`, re-encoding only the parts that changed.
    pub fn backend(&mut self, backend: &Arc<Backend>, stats: &mut TranslateStats) -> &BackendEntry {
        let key = backend.key();
        let entry = match self.backends.remove(&key) {
            Some(e) if same(&e.backend, backend) => {
                stats.resources_reused += 2;
                e
            }
            Some(e) => {
                let cluster = if cluster::same_cluster(&e.backend, backend) {
                    stats.resources_reused += 1;
                    e.cluster
                } else {
                    stats.resources_encoded += 1;
                    encode(&cluster::cluster(backend))
                };
                let load_assignment = if e.backend.spec.endpoints == backend.spec.endpoints {
                    stats.resources_reused += 1;
                    e.load_assignment
                } else {
                    stats.resources_encoded += 1;
                    encode(&cluster::load_assignment(backend))
                };
                BackendEntry {
                    backend: backend.clone(),
                    cluster,
                    load_assignment,
                }
            }
            None => {
                stats.resources_encoded += 2;
                BackendEntry {
                    backend: backend.clone(),
                    cluster: encode(&cluster::cluster(backend)),
                    load_assignment: encode(&cluster::load_assignment(backend)),
                }
            }
        };
        self.backends.entry(key).or_insert(entry)
    }

    pub fn secret(&mut self, s: &Arc<Secret>, stats: &mut TranslateStats) -> Arc<Resource> {
        let key = s.key();
        if let Some(e) = self.secrets.get(&key)
            && same(&e.secret, s)
        {
            stats.resources_reused += 1;
            return e.resource.clone();
        }
        stats.resources_encoded += 1;
        let resource = encode(&secret::secret(s));
        self.secrets.insert(
            key,
            SecretEntry {
                secret: s.clone(),
                resource: resource.clone(),
            },
        );
        resource
    }
}

/// The listener and route configuration messages of a Gateway with their encodings, so a
/// rebuild that produces an identical message reuses the encoded resource.
#[derive(Default)]
pub(crate) struct Encoded {
    listeners: BTreeMap<String, (EnvoyListener, Arc<Resource>)>,
    route_configs: BTreeMap<String, RouteConfigState>,
}

/// A route configuration as last built, with what each virtual host was built from.
pub(crate) struct RouteConfigState {
    message: RouteConfiguration,
    contributors: Contributors,
    resource: Arc<Resource>,
}

fn encode_reusing<M: XdsResource + PartialEq + Clone>(
    prev: Option<&BTreeMap<String, (M, Arc<Resource>)>>,
    next: &mut BTreeMap<String, (M, Arc<Resource>)>,
    msg: M,
    stats: &mut TranslateStats,
) -> Arc<Resource> {
    let name = msg.resource_name().to_owned();
    let resource = match prev.and_then(|p| p.get(&name)) {
        Some((old, r)) if *old == msg => {
            stats.resources_reused += 1;
            r.clone()
        }
        _ => {
            stats.resources_encoded += 1;
            encode(&msg)
        }
    };
    next.insert(name, (msg, resource.clone()));
    resource
}

pub(crate) struct Built {
    pub resources: GatewayResources,
    pub deps: Deps,
    pub encoded: Encoded,
}

/// Translates one Gateway; `None` if it does not exist.
pub(crate) fn build_gateway(
    config: &ConfigSet,
    key: &ObjectKey,
    options: &Options,
    caches: &mut Caches,
    prev: Option<Encoded>,
    stats: &mut TranslateStats,
) -> Option<Built> {
    let mut prev = prev;
    let gw = config.gateways.get(key)?;
    stats.gateways_translated += 1;
    let attachments = config.attached_routes(key);
    let translated: Vec<Arc<TranslatedRoute>> = attachments
        .iter()
        .map(|a| caches.route(config, &a.route, stats))
        .collect();

    let mut deps = Deps {
        routes: routes_naming(config, key).collect(),
        backends: BTreeSet::new(),
        secrets: certificate_refs(gw).collect(),
    };
    for t in &translated {
        deps.backends.extend(t.backend_refs.iter().cloned());
    }

    let mut encoded = Encoded::default();
    let mut resources = GatewayResources::empty(key.clone());
    let mut used_backends = BTreeSet::new();
    let mut used_secrets = BTreeSet::new();
    for port in plan(config, gw) {
        for chain in &port.chains {
            let names: Vec<&str> = chain.listeners.iter().map(|l| l.name.as_str()).collect();
            let attached: Vec<Attached> = attachments
                .iter()
                .zip(&translated)
                .filter(|(a, _)| names.contains(&a.listener.as_str()))
                .map(|(a, t)| Attached {
                    listener: &a.listener,
                    hostnames: &a.hostnames,
                    translated: t,
                })
                .collect();
            let old = prev
                .as_mut()
                .and_then(|p| p.route_configs.remove(&chain.route_config));
            let (old_hosts, old_resource) = match old {
                Some(o) => (
                    Some(PrevHosts {
                        vhosts: o.message.virtual_hosts,
                        contributors: o.contributors,
                    }),
                    Some(o.resource),
                ),
                None => (None, None),
            };
            let hosts = virtual_hosts(&chain.listeners, &attached, old_hosts);
            used_backends.extend(hosts.clusters);
            used_secrets.extend(chain.certificates.iter().cloned());
            let message = RouteConfiguration {
                name: chain.route_config.clone(),
                virtual_hosts: hosts.vhosts,
                ..Default::default()
            };
            let resource = match old_resource {
                Some(r) if hosts.unchanged => {
                    stats.resources_reused += 1;
                    r
                }
                _ => {
                    stats.resources_encoded += 1;
                    encode(&message)
                }
            };
            resources.route_configs.push(resource.clone());
            encoded.route_configs.insert(
                chain.route_config.clone(),
                RouteConfigState {
                    message,
                    contributors: hosts.contributors,
                    resource,
                },
            );
        }
        let l = envoy_listener(gw, &port, options);
        let r = encode_reusing(
            prev.as_ref().map(|p| &p.listeners),
            &mut encoded.listeners,
            l,
            stats,
        );
        resources.listeners.push(r);
    }
    for b in &used_backends {
        // Used backends resolved when their routes were translated against this config.
        if let Some(backend) = config.backends.get(b) {
            let e = caches.backend(backend, stats);
            resources.clusters.push(e.cluster.clone());
            resources.load_assignments.push(e.load_assignment.clone());
        }
    }
    for s in &used_secrets {
        if let Some(secret) = config.secrets.get(s) {
            resources.secrets.push(caches.secret(secret, stats));
        }
    }
    resources.sort();
    Some(Built {
        resources,
        deps,
        encoded,
    })
}
