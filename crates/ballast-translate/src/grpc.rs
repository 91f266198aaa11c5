//! GRPCRoutes in translation: each becomes its HTTPRoute equivalent
//! ([`ballast_model::GrpcRoute::as_http`]) in a *translation view* of the config, so the
//! incremental machinery (caches, dependency index, virtual host patching, precedence against
//! HTTPRoutes on the same listener) handles both kinds with one code path.
//!
//! In the view:
//! - the route is keyed `{ns}/grpc:{name}` (`:` is not allowed in Kubernetes names, so it never
//!   collides with an HTTPRoute of the same name);
//! - each backendRef to a Backend `b` that is not already `appProtocol: kubernetes.io/h2c`
//!   names `b:h2c` instead, a copy of `b` that speaks HTTP/2 to its endpoints (gRPC needs
//!   HTTP/2 upstream, while the same Backend may serve HTTP/1.1-only HTTPRoutes). A ref to a
//!   missing Backend stays missing (`b:h2c` does not exist either), so it answers 500 as for
//!   HTTPRoutes. RequestMirror targets are rewritten the same way: a mirrored gRPC call must
//!   reach its target over HTTP/2 too.

use std::collections::BTreeMap;
use std::sync::Arc;

use ballast_model::{Backend, ConfigSet, HttpRoute, ObjectKey, UpstreamProtocol};

/// Suffix of the HTTP/2 copy of a Backend.
pub const H2C_SUFFIX: &str = ":h2c";
/// Prefix of a GRPCRoute's name in the view.
pub const ROUTE_PREFIX: &str = "grpc:";

/// The config translation works on: `config` itself when it has no GRPCRoutes (no cost for
/// HTTP-only configs), else a copy with the GRPCRoutes as HTTPRoutes.
pub fn translation_view(config: &Arc<ConfigSet>) -> Arc<ConfigSet> {
    if config.grpc_routes.is_empty() {
        return config.clone();
    }
    let mut view = (**config).clone();
    let mut h2c: BTreeMap<ObjectKey, Arc<Backend>> = BTreeMap::new();
    for (key, g) in &config.grpc_routes {
        let mut route: HttpRoute = (*g.as_http).clone();
        route.metadata.name = format!("{ROUTE_PREFIX}{}", key.name);
        for rule in &mut route.spec.rules {
            let mirrors = rule
                .filters
                .iter_mut()
                .filter_map(|f| f.request_mirror.as_mut().map(|m| &mut m.backend_ref));
            for r in rule.backend_refs.iter_mut().chain(mirrors) {
                if !r.is_backend() {
                    continue;
                }
                let base = ObjectKey::new(r.namespace_or(&key.namespace), r.name.as_str());
                let namespace = base.namespace.clone();
                if config.services.contains_key(&base) {
                    // A Service port speaks HTTP/2 through its `appProtocol` (grpc/h2c).
                    continue;
                }
                match config.backends.get(&base) {
                    Some(b) if b.spec.upstream_protocol() == UpstreamProtocol::Http2 => {}
                    found => {
                        r.name.value = format!("{}{H2C_SUFFIX}", base.name);
                        r.namespace = Some(namespace);
                        if let Some(b) = found {
                            let mut copy = (**b).clone();
                            copy.metadata.name = r.name.value.clone();
                            copy.spec.protocol = Some(ballast_model::Spanned::new(
                                "kubernetes.io/h2c".to_owned(),
                                ballast_model::Pos::UNKNOWN,
                            ));
                            h2c.insert(copy.key(), Arc::new(copy));
                        }
                    }
                }
            }
        }
        view.http_routes.insert(route.key(), Arc::new(route));
    }
    view.backends.extend(h2c);
    view.grpc_routes.clear();
    Arc::new(view)
}
