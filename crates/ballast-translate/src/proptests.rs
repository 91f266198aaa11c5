//! Incremental translation against recomputation from scratch.

use std::collections::BTreeMap;
use std::sync::Arc;

use ballast_model::{ConfigSet, ObjectKey};
use proptest::prelude::*;

use crate::tests::{config, gw};
use crate::{
    DependencyIndex, GatewayResources, Options, Snapshot, Translator, XdsTransport,
    translate_gateway,
};
use ballast_xds::ResourceType;

const CERT: &str = "-----BEGIN CERTIFICATE-----\\nMII{}\\n-----END CERTIFICATE-----\\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\\nMIG{}\\n-----END PRIVATE KEY-----\\n";

type GwSpec = (bool, u8, u8);
type RouteSpec = (bool, u8, u8, Vec<(u8, u32)>, u8);
type BackendSpec = (bool, u8, bool, u8);
type SecretSpec = (bool, bool);
/// A BackendPolicy: present, targets (bitmask over b0..b4), variant.
type PolicySpec = (bool, u8, u8);
/// A RateLimitPolicy: present, targets (bitmask over g0, g1, r0..r2), variant; and whether the
/// gRPC service Backend `rls` exists.
type RateLimitSpec = (Vec<(bool, u8, u8)>, bool);
/// A SecurityPolicy: present, target (Gateway, listener, HTTPRoute), variant.
type SecuritySpec = (bool, u8, u8);

/// A JWKS with one valid P-256 key (public half only).
const JWKS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","x":"GrmKoLISinHtgZRMslA42Z2S4MTNYpi3Z8dRvmywZ9I","y":"lU0Hcj5rL6i0C6hoxxT8L1hdF6W-1cgZBJe9vOk6qXw"}]}"#;

fn render_security(policies: &[SecuritySpec]) -> Vec<String> {
    let mut docs = Vec::new();
    for (i, (present, target, variant)) in policies.iter().enumerate() {
        if !present {
            continue;
        }
        let target = match target % 7 {
            0 => "{ group: gateway.networking.k8s.io, kind: Gateway, name: g0 }",
            1 => "{ group: gateway.networking.k8s.io, kind: Gateway, name: g0, sectionName: http }",
            2 => "{ group: gateway.networking.k8s.io, kind: Gateway, name: g1, sectionName: a }",
            3 => "{ group: gateway.networking.k8s.io, kind: Gateway, name: g0, sectionName: tls }",
            4 => "{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: r0 }",
            5 => "{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: r1 }",
            _ => "{ group: gateway.networking.k8s.io, kind: Gateway, name: g1 }",
        };
        let body = match variant % 7 {
            0 => "  authorization: { defaultAction: Allow, rules: [{ action: Deny, principal: { clientCIDRs: [10.0.0.0/8] } }] }\n".to_owned(),
            1 => format!("  jwt: {{ optional: true, providers: [{{ name: a, issuer: x, localJWKS: {{ inline: '{JWKS}' }}, extractFrom: {{ headers: [{{ name: x-t }}], cookies: [c], params: [p] }} }}] }}\n  authorization: {{ rules: [{{ action: Allow, principal: {{ jwt: {{ provider: a, claims: [{{ name: sub, values: [u] }}], scopes: [s] }} }} }}] }}\n"),
            2 => "  jwt: { providers: [{ name: a, localJWKS: { valueRef: { kind: ConfigMap, name: jwks } } }, { name: b, localJWKS: { valueRef: { kind: ConfigMap, name: jwks, key: other } } }] }\n  authorization: { rules: [{ action: Allow, principal: { clientCIDRs: [192.168.0.0/16] } }] }\n".to_owned(),
            3 => "  jwt: { providers: [{ name: r, remoteJWKS: { uri: http://keys.test/jwks, backendRefs: [{ group: ballast.dev, kind: Backend, name: b0 }] } }] }\n".to_owned(),
            4 => "  extAuth: { headersToExtAuth: [x-a], http: { backendRefs: [{ group: ballast.dev, kind: Backend, name: b1 }], path: /check } }\n".to_owned(),
            5 => "  extAuth: { failOpen: true, grpc: { backendRefs: [{ group: ballast.dev, kind: Backend, name: b0, port: 9001 }] } }\n".to_owned(),
            _ => "  authorization: {}\n".to_owned(),
        };
        docs.push(format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: {{ name: sp{i} }}\nspec:\n  targetRefs: [{target}]\n{body}"
        ));
    }
    if policies.first().is_some_and(|p| p.1 % 2 == 0) {
        docs.push(format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{ name: jwks }}\ndata:\n  jwks: '{JWKS}'\n"
        ));
    }
    docs
}

fn render(
    gateways: &[GwSpec],
    routes: &[RouteSpec],
    backends: &[BackendSpec],
    secrets: &[SecretSpec],
    policies: &[PolicySpec],
    rate_limits: &RateLimitSpec,
    security: &[SecuritySpec],
) -> String {
    let mut docs = render_security(security);
    for (i, (present, host, https)) in gateways.iter().enumerate() {
        if !present {
            continue;
        }
        let mut listeners = String::from("  - { name: http, port: 80, protocol: HTTP }\n");
        match host % 4 {
            1 => listeners.push_str(
                "  - { name: wild, port: 80, protocol: HTTP, hostname: \"*.example.com\" }\n",
            ),
            2 => listeners
                .push_str("  - { name: a, port: 80, protocol: HTTP, hostname: a.example.com }\n"),
            3 => listeners.push_str("  - { name: other, port: 81, protocol: HTTP }\n"),
            _ => {}
        }
        if https & 1 == 1 {
            listeners.push_str(&format!(
                "  - {{ name: tls, port: 443, protocol: HTTPS, hostname: \"*.example.com\", tls: {{ certificateRefs: [{{ name: s{} }}] }} }}\n",
                (https >> 1) & 1
            ));
        }
        if https & 4 == 4 {
            listeners.push_str(
                "  - { name: tls-any, port: 443, protocol: HTTPS, tls: { certificateRefs: [{ name: s1 }] } }\n",
            );
        }
        // TLS passthrough and TCP ports for the TLSRoutes / TCPRoutes below.
        if host % 2 == 0 {
            listeners.push_str(
                "  - { name: pass, port: 8443, protocol: TLS, tls: { mode: Passthrough } }\n  - { name: raw, port: 9000, protocol: TCP }\n",
            );
        }
        docs.push(format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: g{i} }}\nspec:\n  gatewayClassName: ballast\n  listeners:\n{listeners}"
        ));
    }
    for (i, (present, parents, hosts, refs, path)) in routes.iter().enumerate() {
        if !present {
            continue;
        }
        let mut parent_refs = Vec::new();
        if parents & 1 == 1 {
            parent_refs.push("{ name: g0 }".to_owned());
        }
        if parents & 2 == 2 {
            parent_refs.push("{ name: g1 }".to_owned());
        }
        if parents & 4 == 4 {
            parent_refs.push("{ name: g0, sectionName: tls }".to_owned());
        }
        let hostnames: Vec<&str> = ["a.example.com", "b.example.com", "\"*.example.com\""]
            .iter()
            .enumerate()
            .filter(|(b, _)| hosts & (1 << b) != 0)
            .map(|(_, h)| *h)
            .collect();
        let backend_refs: Vec<String> = refs
            .iter()
            .map(|(b, w)| format!("{{ name: b{b}, weight: {w} }}"))
            .collect();
        let path = ["/", "/api", "/api/v1"][*path as usize % 3];
        docs.push(format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: r{i} }}\nspec:\n  parentRefs: [{}]\n  hostnames: [{}]\n  rules:\n  - matches: [{{ path: {{ value: {path} }} }}]\n    backendRefs: [{}]\n  - matches: [{{ path: {{ type: Exact, value: /r{i} }} }}]\n    backendRefs: [{{ name: b{i} }}]\n",
            parent_refs.join(", "),
            hostnames.join(", "),
            backend_refs.join(", ")
        ));
        // Odd routes also exist as a TLSRoute (same parents, hostnames, backendRefs) and, from
        // the last backendRef, a TCPRoute, so route edits cover L4 rebuilds next to HTTPRoute
        // patches (even routes).
        if i % 2 == 1 && !refs.is_empty() {
            let l4_parents = parent_refs.join(", ").replace(", sectionName: tls", "");
            docs.push(format!(
                "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TLSRoute\nmetadata: {{ name: t{i} }}\nspec:\n  parentRefs: [{l4_parents}]\n  hostnames: [{}]\n  rules:\n  - backendRefs: [{}]\n",
                hostnames.join(", "),
                backend_refs.join(", ")
            ));
            docs.push(format!(
                "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {{ name: t{i} }}\nspec:\n  parentRefs: [{l4_parents}]\n  rules:\n  - backendRefs: [{}]\n",
                backend_refs[backend_refs.len() - 1]
            ));
        }
    }
    for (i, (present, endpoints, ring, zone)) in backends.iter().enumerate() {
        if !present {
            continue;
        }
        let eps: Vec<String> = (0..*endpoints)
            .map(|e| {
                let hostname_first = *zone == 3 && e == 0;
                let zone = if *zone == 1 && e % 2 == 0 {
                    ", zone: z1"
                } else {
                    ""
                };
                // Variant 3: the first endpoint is a hostname, so the Backend is a DNS cluster
                // (no load assignment) and edits switch Backends between EDS and DNS.
                if hostname_first {
                    format!("{{ address: h{i}.test, port: 80 }}")
                } else {
                    format!("{{ address: 10.0.{i}.{e}, port: 80{zone} }}")
                }
            })
            .collect();
        let policy = if *ring { "RingHash" } else { "RoundRobin" };
        let timeout = if *zone == 2 {
            "  connectTimeout: 2s\n"
        } else {
            ""
        };
        docs.push(format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: b{i} }}\nspec:\n  endpoints: [{}]\n  loadBalancer: {{ policy: {policy} }}\n{timeout}",
            eps.join(", ")
        ));
    }
    for (i, (present, variant)) in secrets.iter().enumerate() {
        if !present {
            continue;
        }
        let v = if *variant { "B" } else { "A" };
        docs.push(format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{ name: s{i} }}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: \"{}\"\n  tls.key: \"{}\"\n",
            CERT.replace("{}", v),
            KEY.replace("{}", v)
        ));
    }
    for (i, (present, targets, variant)) in policies.iter().enumerate() {
        if !present {
            continue;
        }
        let refs: Vec<String> = (0..5)
            .filter(|b| targets & (1 << b) != 0)
            .map(|b| format!("{{ group: ballast.dev, kind: Backend, name: b{b} }}"))
            .collect();
        let body = match variant % 5 {
            0 => "  circuitBreaker: { maxConnections: 7 }\n",
            1 => {
                "  loadBalancer: { type: ConsistentHash, consistentHash: { type: Header, header: { name: x-user } } }\n"
            }
            2 => "  loadBalancer: { type: Maglev }\n",
            3 => "  healthCheck: { passive: { consecutive5XxErrors: 2 } }\n",
            _ => "  loadBalancer: { type: RoundRobin, slowStart: { window: 5s } }\n",
        };
        docs.push(format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: BackendPolicy\nmetadata: {{ name: p{i} }}\nspec:\n  targetRefs: [{}]\n{body}",
            refs.join(", ")
        ));
    }
    for (i, (present, targets, variant)) in rate_limits.0.iter().enumerate() {
        if !present {
            continue;
        }
        let refs: Vec<String> = (0..5)
            .filter(|b| targets & (1 << b) != 0)
            .map(|b| match b {
                0 | 1 => {
                    format!("{{ group: gateway.networking.k8s.io, kind: Gateway, name: g{b} }}")
                }
                _ => format!(
                    "{{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: r{} }}",
                    b - 2
                ),
            })
            .collect();
        let local = "  local: { rules: [{ clientSelectors: [{ headers: [{ name: x-user, type: Distinct }] }], limit: { requests: 5, unit: Hour } }] }\n";
        let global = "  global: { backendRef: { name: rls }, rules: [{ clientSelectors: [{ sourceCIDR: { type: Distinct } }] }] }\n";
        let body = match variant % 3 {
            0 => local.to_owned(),
            1 => global.to_owned(),
            _ => format!("{local}{global}"),
        };
        docs.push(format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{ name: rl{i} }}\nspec:\n  targetRefs: [{}]\n{body}",
            refs.join(", ")
        ));
    }
    if rate_limits.1 {
        docs.push(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: rls }\nspec:\n  protocol: grpc\n  endpoints: [{ address: 10.9.9.9, port: 8081 }]\n"
                .to_owned(),
        );
    }
    docs.join("---\n")
}

type Spec = (
    Vec<GwSpec>,
    Vec<RouteSpec>,
    Vec<BackendSpec>,
    Vec<SecretSpec>,
    Vec<PolicySpec>,
    RateLimitSpec,
    Vec<SecuritySpec>,
);

fn render_spec(s: &Spec) -> String {
    render(&s.0, &s.1, &s.2, &s.3, &s.4, &s.5, &s.6)
}

fn arb_config() -> impl Strategy<Value = String> {
    arb_spec().prop_map(|s| render_spec(&s))
}

/// A base spec followed by single-object edits (one slot of the next random spec copied in),
/// so most steps change one object, as real config edits do.
fn arb_edits() -> impl Strategy<Value = Vec<String>> {
    (
        arb_spec(),
        prop::collection::vec((arb_spec(), 0u8..8, 0usize..5, 0u8..4), 0..10),
    )
        .prop_map(|(base, edits)| {
            let mut cur = base;
            let mut out = vec![render_spec(&cur)];
            for (next, kind, i, extra) in edits {
                match kind {
                    0 => cur.0[i % 2] = next.0[i % 2],
                    1 => cur.1[i] = next.1[i].clone(),
                    2 => {
                        // Mostly endpoint-only edits of an existing backend.
                        if extra < 3 && cur.2[i].0 {
                            cur.2[i].1 = next.2[i].1;
                            cur.2[i].3 = next.2[i].3;
                        } else {
                            cur.2[i] = next.2[i];
                        }
                    }
                    3 => cur.3[i % 2] = next.3[i % 2],
                    4 => cur.4[i % 3] = next.4[i % 3],
                    5 => cur.5.0[i % 2] = next.5.0[i % 2],
                    6 => cur.5.1 = next.5.1,
                    _ => cur.6[i % 3] = next.6[i % 3],
                }
                out.push(render_spec(&cur));
            }
            out
        })
}

fn arb_spec() -> impl Strategy<Value = Spec> {
    (
        prop::collection::vec((prop::bool::weighted(0.8), 0u8..4, 0u8..8), 2),
        prop::collection::vec(
            (
                prop::bool::weighted(0.7),
                0u8..8,
                0u8..8,
                prop::collection::vec((0u8..5, 0u32..3), 0..3),
                0u8..3,
            ),
            5,
        ),
        prop::collection::vec(
            (prop::bool::weighted(0.7), 0u8..3, any::<bool>(), 0u8..4),
            5,
        ),
        prop::collection::vec((prop::bool::weighted(0.7), any::<bool>()), 2),
        prop::collection::vec((prop::bool::weighted(0.6), 1u8..32, 0u8..5), 3),
        (
            prop::collection::vec((prop::bool::weighted(0.5), 1u8..32, 0u8..3), 2),
            any::<bool>(),
        ),
        prop::collection::vec((prop::bool::weighted(0.5), 0u8..7, 0u8..7), 3),
    )
}

/// Names and versions of every resource, for comparisons and messages.
fn summary(r: &GatewayResources) -> Vec<(String, String)> {
    r.iter()
        .map(|r| (r.name().to_owned(), r.version().to_owned()))
        .collect()
}

/// Route configurations are assembled from cached virtual-host encodings: their bytes and
/// references must be exactly those of encoding the message with prost.
fn prost_encoded(r: &GatewayResources) -> Result<(), TestCaseError> {
    use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
    use prost::Message;
    for rc in &r.route_configs {
        let msg = RouteConfiguration::decode(rc.value_bytes())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let direct = crate::Resource::new(&msg).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // Maps with several entries are encoded in key order (crate::security); prost
        // re-encodes them in HashMap order, so compare those as messages.
        let multi_entry_maps = msg.virtual_hosts.iter().any(|v| {
            v.typed_per_filter_config.len() > 1
                || v.routes.iter().any(|r| r.typed_per_filter_config.len() > 1)
        });
        if multi_entry_maps {
            let again = RouteConfiguration::decode(direct.value_bytes())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&msg, &again);
            prop_assert_eq!(rc.refs(), direct.refs(), "{}", rc.name());
            continue;
        }
        prop_assert_eq!(rc.any_bytes(), direct.any_bytes(), "{}", rc.name());
        prop_assert_eq!(rc.refs(), direct.refs(), "{}", rc.name());
        prop_assert_eq!(rc.version(), direct.version());
    }
    Ok(())
}

/// Every type's names, resource versions and set version, for comparing snapshots.
fn snapshot_summary(s: &Snapshot) -> Vec<(String, Vec<(String, String)>)> {
    ResourceType::ALL
        .iter()
        .map(|t| {
            let list = s
                .resources(*t)
                .iter()
                .map(|(n, r)| (n.to_string(), r.version().to_owned()))
                .collect();
            (s.version(*t).to_string(), list)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// After any sequence of configs: the index equals one built from scratch, every gateway's
    /// resources equal a from-scratch translation (same versions), every snapshot is
    /// consistent, and `changed`/`removed` report exactly the gateways that differ.
    ///
    /// Each output's [`crate::ResourcesVersion`] patches the version output before, and the
    /// snapshot derived from the previous one by the patch equals a fresh one (Delta's VHDS
    /// translation, unchecked like the pipeline's, in half the cases).
    #[test]
    fn incremental_equals_from_scratch(configs in arb_edits(), vhds in any::<bool>()) {
        let mut options = Options::default();
        if vhds {
            options.config_sources.transport = XdsTransport::DeltaAds;
        }
        let check = !vhds;
        let mut t = Translator::new(options.clone());
        let mut prev: BTreeMap<ObjectKey, Vec<(String, String)>> = BTreeMap::new();
        // Per gateway: the version last output and the snapshot made of it.
        let mut built: BTreeMap<ObjectKey, (u64, Arc<Snapshot>)> = BTreeMap::new();
        for yaml in &configs {
            let set: Arc<ConfigSet> = Arc::new(config(yaml));
            let out = t.update(&set);
            prop_assert_eq!(t.index(), &DependencyIndex::build(&set));
            let mut now = BTreeMap::new();
            for key in set.gateways.keys() {
                let scratch = translate_gateway(&set, key, &options).unwrap();
                let inc = t.gateway(key).expect("every gateway is translated");
                prop_assert_eq!(summary(&inc), summary(&scratch), "gateway {}", key);
                // Bytes and references too: a patched route configuration is spliced from its
                // previous bytes and keeps a reference list shared between versions.
                for (a, b) in inc.iter().zip(scratch.iter()) {
                    prop_assert_eq!(a.any_bytes(), b.any_bytes(), "{}", a.name());
                    prop_assert_eq!(a.refs(), b.refs(), "{}", a.name());
                }
                prost_encoded(&scratch)?;
                if check {
                    inc.snapshot(None).map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
                now.insert(key.clone(), summary(&scratch));
            }
            prop_assert_eq!(out.versions.keys().collect::<Vec<_>>(), out.changed.keys().collect::<Vec<_>>());
            for (k, r) in &out.changed {
                let v = &out.versions[k];
                let fresh = if check { r.snapshot(None) } else { r.snapshot_unchecked(None) };
                let mut snap = fresh.map_err(|e| TestCaseError::fail(e.to_string()))?;
                if let Some(p) = &v.patch {
                    // Chained like the pipeline's: each from the snapshot patched before.
                    let (base, prev_snap) = built.get(k).expect("a patch follows an output");
                    prop_assert_eq!(p.base, *base, "patches the version output before");
                    let patched = r
                        .snapshot_patched(prev_snap, &p.touched, check)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(snapshot_summary(&patched), snapshot_summary(&snap), "gateway {}", k);
                    snap = patched;
                }
                prop_assert!(built.get(k).is_none_or(|(b, _)| *b < v.version));
                built.insert(k.clone(), (v.version, Arc::new(snap)));
            }
            for k in &out.removed {
                built.remove(k);
            }
            let changed: Vec<&ObjectKey> = now
                .iter()
                .filter(|(k, v)| prev.get(*k) != Some(*v))
                .map(|(k, _)| k)
                .collect();
            prop_assert_eq!(out.changed.keys().collect::<Vec<_>>(), changed);
            for (k, r) in &out.changed {
                prop_assert_eq!(&summary(r), &now[k]);
            }
            let removed: Vec<ObjectKey> =
                prev.keys().filter(|k| !now.contains_key(*k)).cloned().collect();
            prop_assert_eq!(&out.removed, &removed);
            prop_assert_eq!(t.gateways().count(), set.gateways.len());
            prev = now;
        }
    }

    /// Translation is deterministic: the same config parsed twice (fresh `Arc`s) gives
    /// byte-identical resources.
    #[test]
    fn deterministic(yaml in arb_config()) {
        let a = config(&yaml);
        let b = config(&yaml);
        for key in a.gateways.keys() {
            let ra = translate_gateway(&a, key, &Options::default()).unwrap();
            let rb = translate_gateway(&b, key, &Options::default()).unwrap();
            let bytes = |r: &GatewayResources| r.iter().map(|x| x.any_bytes().clone()).collect::<Vec<_>>();
            prop_assert_eq!(bytes(&ra), bytes(&rb));
        }
    }
}

#[test]
fn endpoint_change_reencodes_one_load_assignment_shared_by_gateways() {
    let backend = |port: u32| {
        format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: shared }}\nspec:\n  endpoints: [{{ address: 10.0.0.1, port: {port} }}]\n"
        )
    };
    let base = |port: u32| {
        let mut docs = vec![backend(port)];
        for g in ["g0", "g1"] {
            docs.push(format!("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{ name: {g} }}\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - {{ name: http, port: 80, protocol: HTTP }}\n"));
            docs.push(format!("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{ name: r-{g} }}\nspec:\n  parentRefs: [{{ name: {g} }}]\n  rules:\n  - backendRefs: [{{ name: shared }}]\n"));
        }
        docs.join("---\n")
    };
    let mut t = Translator::new(Options::default());
    let first = t.update(&Arc::new(config(&base(80))));
    assert_eq!(first.changed.len(), 2);
    assert_eq!(first.stats.routes_translated, 2);
    // The backend was encoded once for both gateways.
    assert_eq!(
        first.stats.resources_encoded,
        2 /* cluster + CLA */ + 2 * 2 /* listener + route config per gateway */
    );
    let old_cluster = t.gateway(&gw("g0")).unwrap().clusters[0].clone();

    let out = t.update(&Arc::new(config(&base(81))));
    assert_eq!(out.changed.len(), 2);
    assert_eq!(out.stats.gateways_translated, 0);
    assert_eq!(out.stats.gateways_patched, 2);
    assert_eq!(out.stats.routes_translated, 0);
    assert_eq!(out.stats.resources_encoded, 1, "{:?}", out.stats);
    let g0 = t.gateway(&gw("g0")).unwrap();
    let g1 = t.gateway(&gw("g1")).unwrap();
    assert!(Arc::ptr_eq(
        &g0.load_assignments[0],
        &g1.load_assignments[0]
    ));
    assert!(Arc::ptr_eq(&g0.clusters[0], &old_cluster));
    assert!(Arc::ptr_eq(
        &g0.listeners[0],
        &first.changed[&gw("g0")].listeners[0]
    ));
    assert!(Arc::ptr_eq(
        &g0.route_configs[0],
        &first.changed[&gw("g0")].route_configs[0]
    ));

    // A route change rebuilds only its gateway, re-encoding only its route configuration.
    let edited = base(81).replace(
        "parentRefs: [{ name: g1 }]\n  rules:\n  - backendRefs",
        "parentRefs: [{ name: g1 }]\n  hostnames: [x.example.com]\n  rules:\n  - backendRefs",
    );
    let out = t.update(&Arc::new(config(&edited)));
    assert_eq!(out.changed.keys().collect::<Vec<_>>(), [&gw("g1")]);
    assert_eq!(out.stats.gateways_translated, 1);
    assert_eq!(out.stats.routes_translated, 1);
    assert_eq!(out.stats.resources_encoded, 1, "{:?}", out.stats);
}

/// A BackendPolicy edit re-encodes only the clusters it targets and patches the gateways using
/// them (no route work); a hash-key change re-translates the routes to get the new
/// `hash_policy`.
#[test]
fn policy_edit_reencodes_only_targeted_clusters() {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
    use envoy_types::pb::envoy::config::route::v3::route::Action;
    use envoy_types::pb::envoy::config::route::v3::route_action::hash_policy::PolicySpecifier;
    use prost::Message;
    let base = |policy: &str| {
        let mut docs = vec![
            "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: { name: g0 }\nspec:\n  gatewayClassName: ballast\n  listeners:\n  - { name: http, port: 80, protocol: HTTP }\n".to_owned(),
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: { name: r }\nspec:\n  parentRefs: [{ name: g0 }]\n  rules:\n  - matches: [{ path: { value: /a } }]\n    backendRefs: [{ name: a }]\n  - backendRefs: [{ name: b }]\n".to_owned(),
        ];
        for b in ["a", "b"] {
            docs.push(format!("apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: {{ name: {b} }}\nspec:\n  endpoints: [{{ address: 10.0.0.1, port: 80 }}]\n"));
        }
        docs.push(format!("apiVersion: ballast.dev/v1alpha1\nkind: BackendPolicy\nmetadata: {{ name: p }}\nspec:\n  targetRefs: [{{ group: ballast.dev, kind: Backend, name: a }}]\n{policy}"));
        docs.join("---\n")
    };
    let cluster = |t: &Translator, name: &str| {
        let g = t.gateway(&gw("g0")).unwrap();
        let r = g
            .clusters
            .iter()
            .find(|c| c.name() == name)
            .unwrap()
            .clone();
        (Cluster::decode(r.value_bytes()).unwrap(), r)
    };
    let mut t = Translator::new(Options::default());
    t.update(&Arc::new(config(&base(
        "  circuitBreaker: { maxConnections: 7, maxPendingRequests: 1 }\n  healthCheck: { passive: { consecutive5XxErrors: 2, baseEjectionTime: 60s } }\n",
    ))));
    let (a, _) = cluster(&t, "default/a");
    let th = &a.circuit_breakers.as_ref().unwrap().thresholds[0];
    assert_eq!(th.max_connections.as_ref().unwrap().value, 7);
    assert_eq!(th.max_pending_requests.as_ref().unwrap().value, 1);
    let od = a.outlier_detection.as_ref().unwrap();
    assert_eq!(od.consecutive_5xx.as_ref().unwrap().value, 2);
    assert_eq!(od.base_ejection_time.as_ref().unwrap().seconds, 60);
    let (b, b_res) = cluster(&t, "default/b");
    assert!(b.circuit_breakers.is_none() && b.outlier_detection.is_none());

    // Editing the policy: one cluster re-encoded, the gateway patched, nothing else.
    let out = t.update(&Arc::new(config(&base(
        "  circuitBreaker: { maxConnections: 8 }\n",
    ))));
    assert_eq!(out.changed.len(), 1);
    assert_eq!(out.stats.gateways_translated, 0, "{:?}", out.stats);
    assert_eq!(out.stats.routes_translated, 0);
    assert_eq!(out.stats.resources_encoded, 1, "{:?}", out.stats);
    assert!(Arc::ptr_eq(&cluster(&t, "default/b").1, &b_res));

    // Switching to header hashing re-translates the route: its /a route hashes on x-user.
    let out = t.update(&Arc::new(config(&base(
        "  loadBalancer: { type: ConsistentHash, consistentHash: { type: Header, header: { name: X-User } } }\n",
    ))));
    assert_eq!(out.stats.routes_translated, 1, "{:?}", out.stats);
    let g = t.gateway(&gw("g0")).unwrap();
    let rc = RouteConfiguration::decode(g.route_configs[0].value_bytes()).unwrap();
    let hashes: Vec<Option<String>> = rc.virtual_hosts[0]
        .routes
        .iter()
        .map(|r| match &r.action {
            Some(Action::Route(a)) => a.hash_policy.first().map(|h| match &h.policy_specifier {
                Some(PolicySpecifier::Header(h)) => h.header_name.clone(),
                other => format!("{other:?}"),
            }),
            _ => None,
        })
        .collect();
    assert_eq!(
        hashes,
        vec![Some("x-user".to_owned()), None],
        "route to a hashes, to b not"
    );
    assert_eq!(cluster(&t, "default/a").0.lb_policy, 2 /* RING_HASH */);

    // Removing the policy restores the plain cluster.
    let plain = base("").replace(
        "---\napiVersion: ballast.dev/v1alpha1\nkind: BackendPolicy",
        "---\napiVersion: v1\nkind: ConfigMapIgnored",
    );
    t.update(&Arc::new(config(&plain)));
    let (a, _) = cluster(&t, "default/a");
    assert!(a.circuit_breakers.is_none() && a.lb_policy == 0);
}
