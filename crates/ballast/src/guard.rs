//! The blast-radius guard (invariant 9, docs/architecture.md): a new snapshot
//! that would remove more than a configured share of a gateway's listeners,
//! routes or clusters is held for a settle period and published only if the
//! source still says so.
//!
//! A mass deletion is more often an accident (a half-synced directory, a bad
//! template, a truncated file) than an intent; holding it costs a few seconds
//! when it is intended and saves an outage when it is not.

use std::collections::BTreeSet;
use std::time::Duration;

use ballast_xds::ResourceType;
use ballast_xds::Snapshot;
use prost::Message;

#[derive(Clone, Debug)]
pub struct GuardConfig {
    pub enabled: bool,
    /// Share (0..=1) of a kind that may be removed in one publish.
    pub max_removal: f64,
    pub settle: Duration,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            enabled: true,
            max_removal: 0.5,
            settle: Duration::from_secs(10),
        }
    }
}

/// The identities the guard counts in a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    pub listeners: BTreeSet<String>,
    pub clusters: BTreeSet<String>,
    /// Routes by (route configuration, virtual host, route name or encoded match), and the
    /// routes of TLS/TCP listeners (their `tcp_proxy` filter chains) by (`listener:{name}`,
    /// filter chain name, empty): removing every TLSRoute of a listener is as much a mass
    /// deletion as removing every HTTPRoute.
    pub routes: BTreeSet<(String, String, Vec<u8>)>,
}

impl Inventory {
    pub fn of(snapshot: &Snapshot) -> Inventory {
        let names = |ty| {
            snapshot
                .resources(ty)
                .keys()
                .map(|k| k.to_string())
                .collect::<BTreeSet<_>>()
        };
        let mut routes = BTreeSet::new();
        for (name, res) in snapshot.resources(ResourceType::RouteConfiguration).iter() {
            let Ok(rc) = RouteIds::decode(res.value_bytes()) else {
                continue;
            };
            for vh in rc.virtual_hosts {
                for r in vh.routes {
                    // A named route keeps its identity when its match is edited;
                    // unnamed routes are identified by their (encoded) match.
                    let id = if r.name.is_empty() {
                        r.r#match
                    } else {
                        r.name.into_bytes()
                    };
                    routes.insert((name.to_string(), vh.name.clone(), id));
                }
            }
        }
        for (name, res) in snapshot.resources(ResourceType::Listener).iter() {
            let Ok(l) = ListenerIds::decode(res.value_bytes()) else {
                continue;
            };
            for chain in l.filter_chains {
                if chain.filters.iter().any(|f| f.name == TCP_PROXY) {
                    routes.insert((format!("listener:{name}"), chain.name, Vec::new()));
                }
            }
        }
        Inventory {
            listeners: names(ResourceType::Listener),
            clusters: names(ResourceType::Cluster),
            routes,
        }
    }
}

/// The fields of a `RouteConfiguration` the guard counts (same field numbers):
/// decoding only these skips every route's action, a few times cheaper than a
/// full decode of a large configuration on every publish.
#[derive(Clone, PartialEq, prost::Message)]
struct RouteIds {
    #[prost(message, repeated, tag = "2")]
    virtual_hosts: Vec<HostIds>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct HostIds {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, repeated, tag = "3")]
    routes: Vec<RouteId>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RouteId {
    /// `Route.match`, kept encoded.
    #[prost(bytes = "vec", tag = "1")]
    r#match: Vec<u8>,
    #[prost(string, tag = "14")]
    name: String,
}

const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";

/// The fields of a `Listener` the guard counts: filter chain names and filter names.
#[derive(Clone, PartialEq, prost::Message)]
struct ListenerIds {
    #[prost(message, repeated, tag = "3")]
    filter_chains: Vec<ChainIds>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ChainIds {
    #[prost(message, repeated, tag = "3")]
    filters: Vec<FilterName>,
    #[prost(string, tag = "7")]
    name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct FilterName {
    #[prost(string, tag = "1")]
    name: String,
}

/// What would be removed, per kind, as (removed, of total).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    pub listeners: (usize, usize),
    pub routes: (usize, usize),
    pub clusters: (usize, usize),
}

impl Removal {
    pub fn between(current: &Inventory, next: &Inventory) -> Removal {
        fn count<T: Ord>(cur: &BTreeSet<T>, next: &BTreeSet<T>) -> (usize, usize) {
            (cur.difference(next).count(), cur.len())
        }
        Removal {
            listeners: count(&current.listeners, &next.listeners),
            routes: count(&current.routes, &next.routes),
            clusters: count(&current.clusters, &next.clusters),
        }
    }

    /// The first kind whose removed share exceeds `max`, described for status and logs.
    pub fn exceeds(&self, max: f64) -> Option<String> {
        for (kind, (removed, total)) in [
            ("listeners", self.listeners),
            ("routes", self.routes),
            ("clusters", self.clusters),
        ] {
            if total > 0 && removed as f64 / total as f64 > max {
                return Some(format!(
                    "would remove {removed} of {total} {kind} ({:.0}% > {:.0}%)",
                    100.0 * removed as f64 / total as f64,
                    100.0 * max
                ));
            }
        }
        None
    }
}

/// Decides whether a new snapshot may be published now.
pub fn judge(cfg: &GuardConfig, current: Option<&Inventory>, next: &Inventory) -> Option<String> {
    if !cfg.enabled {
        return None;
    }
    let current = current?;
    Removal::between(current, next).exceeds(cfg.max_removal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(listeners: usize, clusters: usize, routes: usize) -> Inventory {
        Inventory {
            listeners: (0..listeners).map(|i| format!("l{i}")).collect(),
            clusters: (0..clusters).map(|i| format!("c{i}")).collect(),
            routes: (0..routes)
                .map(|i| ("rc".to_string(), format!("vh{i}"), vec![]))
                .collect(),
        }
    }

    #[test]
    fn holds_large_removals_only() {
        let cfg = GuardConfig::default();
        let cur = inv(2, 10, 100);
        assert_eq!(
            judge(&cfg, Some(&cur), &inv(2, 10, 60)),
            None,
            "40% is allowed"
        );
        let held = judge(&cfg, Some(&cur), &inv(2, 10, 20)).unwrap();
        assert!(held.contains("80 of 100 routes"), "{held}");
        assert!(judge(&cfg, Some(&cur), &inv(0, 10, 100)).is_some());
        assert!(judge(&cfg, Some(&cur), &inv(2, 4, 100)).is_some());
        // Additions and first publishes are never held.
        assert_eq!(judge(&cfg, Some(&cur), &inv(5, 50, 500)), None);
        assert_eq!(judge(&cfg, None, &inv(0, 0, 0)), None);
    }

    #[test]
    fn replacing_most_routes_counts_as_removal() {
        let cur = inv(1, 1, 10);
        let mut next = inv(1, 1, 0);
        next.routes = (100..110)
            .map(|i| ("rc".to_string(), format!("vh{i}"), vec![]))
            .collect();
        assert!(judge(&GuardConfig::default(), Some(&cur), &next).is_some());
    }

    #[test]
    fn disabled_guard_never_holds() {
        let cfg = GuardConfig {
            enabled: false,
            ..GuardConfig::default()
        };
        assert_eq!(judge(&cfg, Some(&inv(5, 5, 5)), &inv(0, 0, 0)), None);
    }
}

#[cfg(test)]
mod inventory_tests {
    use super::*;
    use ballast_xds::envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
    use ballast_xds::envoy_types::pb::envoy::config::route::v3::{
        Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route::Action,
        route_action::ClusterSpecifier,
    };

    fn snap(routes: &[(&str, &str)]) -> Snapshot {
        let rc = RouteConfiguration {
            name: "rc".into(),
            virtual_hosts: vec![VirtualHost {
                name: "vh".into(),
                domains: vec!["*".into()],
                routes: routes
                    .iter()
                    .map(|(name, prefix)| Route {
                        name: name.to_string(),
                        r#match: Some(RouteMatch {
                            path_specifier: Some(PathSpecifier::Prefix(prefix.to_string())),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        Snapshot::builder()
            .with(&rc)
            .unwrap()
            .build_unchecked()
            .unwrap()
    }

    /// The guard reads only names and matches; what it reads equals a full
    /// decode, whatever else the routes carry.
    #[test]
    fn route_ids_equal_those_of_a_full_decode() {
        let route = |name: &str, prefix: &str, cluster: &str| Route {
            name: name.into(),
            r#match: Some(RouteMatch {
                path_specifier: Some(PathSpecifier::Prefix(prefix.into())),
                ..Default::default()
            }),
            action: Some(Action::Route(RouteAction {
                cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
                ..Default::default()
            })),
            ..Default::default()
        };
        let rc = RouteConfiguration {
            name: "rc".into(),
            virtual_hosts: vec![
                VirtualHost {
                    name: "a".into(),
                    domains: vec!["a".into()],
                    routes: vec![route("r1", "/x", "c1"), route("", "/y", "c2")],
                    ..Default::default()
                },
                VirtualHost {
                    name: "b".into(),
                    domains: vec!["b".into()],
                    routes: vec![route("", "/z", "c3")],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let full: Vec<(String, Vec<u8>)> = rc
            .virtual_hosts
            .iter()
            .flat_map(|vh| {
                vh.routes.iter().map(|r| {
                    let id = if r.name.is_empty() {
                        r.r#match
                            .as_ref()
                            .map(|m| m.encode_to_vec())
                            .unwrap_or_default()
                    } else {
                        r.name.clone().into_bytes()
                    };
                    (vh.name.clone(), id)
                })
            })
            .collect();
        let lean: Vec<(String, Vec<u8>)> = RouteIds::decode(rc.encode_to_vec().as_slice())
            .unwrap()
            .virtual_hosts
            .into_iter()
            .flat_map(|vh| {
                let host = vh.name;
                vh.routes.into_iter().map(move |r| {
                    let id = if r.name.is_empty() {
                        r.r#match
                    } else {
                        r.name.into_bytes()
                    };
                    (host.clone(), id)
                })
            })
            .collect();
        assert_eq!(lean, full);
    }

    #[test]
    fn editing_a_named_routes_match_is_not_a_removal() {
        let cfg = GuardConfig::default();
        let before = Inventory::of(&snap(&[("r1", "/a")]));
        assert_eq!(
            judge(&cfg, Some(&before), &Inventory::of(&snap(&[("r1", "/b")]))),
            None
        );
        // Unnamed routes are identified by their match.
        let before = Inventory::of(&snap(&[("", "/a")]));
        assert!(judge(&cfg, Some(&before), &Inventory::of(&snap(&[("", "/b")]))).is_some());
        // Deleting the only route is held.
        let before = Inventory::of(&snap(&[("r1", "/a"), ("r2", "/b")]));
        assert!(judge(&cfg, Some(&before), &Inventory::of(&snap(&[("r3", "/c")]))).is_some());
    }
}

#[cfg(test)]
mod l4_tests {
    use super::*;

    /// A TLS passthrough listener with `n` TLSRoutes, translated and snapshotted.
    fn snapshot(n: usize) -> Snapshot {
        let mut yaml = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: c\n  listeners:\n  - { name: tls, port: 8443, protocol: TLS, tls: { mode: Passthrough } }\n---\napiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: b }\nspec: { endpoints: [{ address: 127.0.0.1, port: 7001 }] }\n".to_owned();
        for i in 0..n {
            yaml.push_str(&format!(
                "---\napiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\nmetadata: {{ name: r{i} }}\nspec:\n  parentRefs: [{{ name: edge }}]\n  hostnames: [h{i}.example]\n  rules: [{{ backendRefs: [{{ group: ballast.dev, kind: Backend, name: b }}] }}]\n"
            ));
        }
        let set = ballast_model::ConfigSet::build([("c.yaml", yaml)]).unwrap();
        ballast_translate::translate_gateway(
            &set,
            &ballast_model::ObjectKey::new("default", "edge"),
            &ballast_translate::Options::default(),
        )
        .unwrap()
        .snapshot(None)
        .unwrap()
    }

    /// TLS/TCP routes live in listener filter chains, not route configurations: the guard
    /// counts each `tcp_proxy` chain as a route, so removing most TLSRoutes of a listener
    /// (its listener stays) is held like removing most HTTPRoutes.
    #[test]
    fn tcp_proxy_filter_chains_count_as_routes() {
        let cfg = GuardConfig::default();
        let four = Inventory::of(&snapshot(4));
        assert_eq!(four.listeners.len(), 1);
        assert_eq!(four.routes.len(), 4, "{:?}", four.routes);
        assert!(four.routes.contains(&(
            "listener:default/edge/8443".into(),
            "default/edge/8443/tls/default/r0".into(),
            vec![]
        )));
        let held = judge(&cfg, Some(&four), &Inventory::of(&snapshot(1))).unwrap();
        assert!(held.contains("3 of 4 routes"), "{held}");
        let held = judge(&cfg, Some(&four), &Inventory::of(&snapshot(0))).unwrap();
        assert!(held.contains("4 of 4 routes"), "{held}");
        assert_eq!(judge(&cfg, Some(&four), &Inventory::of(&snapshot(2))), None);
        // The closing chain of a listener without routes is not a route.
        assert!(Inventory::of(&snapshot(0)).routes.is_empty());
    }
}

#[cfg(test)]
mod http3_tests {
    use super::*;

    /// One HTTPS port whose ClientPolicy may turn HTTP/3 on, translated and snapshotted.
    fn snapshot(http3: bool) -> Snapshot {
        let mut yaml = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: edge }\nspec:\n  gatewayClassName: c\n  listeners:\n  - { name: s, port: 443, protocol: HTTPS, hostname: s.example, tls: { certificateRefs: [{ name: s }] } }\n---\napiVersion: v1\nkind: Secret\nmetadata: { name: s }\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: \"-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----\\n\"\n  tls.key: \"-----BEGIN PRIVATE KEY-----\\nMIGH\\n-----END PRIVATE KEY-----\\n\"\n---\napiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: b }\nspec: { endpoints: [{ address: 127.0.0.1, port: 7001 }] }\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: { name: r }\nspec:\n  parentRefs: [{ name: edge }]\n  rules: [{ backendRefs: [{ group: ballast.dev, kind: Backend, name: b }] }]\n".to_owned();
        if http3 {
            yaml.push_str("---\napiVersion: ballast.dev/v1alpha1\nkind: ClientPolicy\nmetadata: { name: h3 }\nspec:\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]\n  http3: {}\n");
        }
        let set = ballast_model::ConfigSet::build([("c.yaml", yaml)]).unwrap();
        ballast_translate::translate_gateway(
            &set,
            &ballast_model::ObjectKey::new("default", "edge"),
            &ballast_translate::Options::default(),
        )
        .unwrap()
        .snapshot(None)
        .unwrap()
    }

    /// The QUIC listener of an HTTPS port is one more listener sharing the TCP one's routes:
    /// turning HTTP/3 on or off moves no route, and off removes 1 of 2 listeners, which the
    /// default guard (more than 50%) lets through while a stricter one holds it.
    #[test]
    fn the_http3_listener_counts_once_and_shares_routes() {
        let (on, off) = (
            Inventory::of(&snapshot(true)),
            Inventory::of(&snapshot(false)),
        );
        assert_eq!(
            on.listeners.iter().collect::<Vec<_>>(),
            ["default/edge/443", "default/edge/443/udp"]
        );
        assert_eq!(on.routes, off.routes);
        assert_eq!(on.clusters, off.clusters);
        let cfg = GuardConfig::default();
        assert_eq!(judge(&cfg, Some(&off), &on), None);
        assert_eq!(judge(&cfg, Some(&on), &off), None);
        let strict = GuardConfig {
            max_removal: 0.3,
            ..GuardConfig::default()
        };
        let held = judge(&strict, Some(&on), &off).unwrap();
        assert!(held.contains("1 of 2 listeners"), "{held}");
    }
}
