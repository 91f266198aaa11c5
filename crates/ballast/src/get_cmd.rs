//! `ballast get gateways|routes|backends|tlsroutes|tcproutes`: Gateway API status (conditions and reasons) as a
//! kubectl-like table, or YAML/JSON. From the admin API of a running `ballast serve` (its
//! `/debug/sources` status: what is served, last known good included) or, with paths, from
//! config files (what that config would give).

use serde_json::Value;

/// What `ballast get` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Resource {
    #[value(alias = "gateway", alias = "gw")]
    Gateways,
    #[value(alias = "route", alias = "httproutes", alias = "httproute")]
    Routes,
    #[value(alias = "backend")]
    Backends,
    #[value(alias = "tlsroute")]
    Tlsroutes,
    #[value(alias = "tcproute")]
    Tcproutes,
}

impl Resource {
    /// The key of this resource's list in [`ballast_model::status::ConfigStatus`] JSON.
    fn key(self) -> &'static str {
        match self {
            Resource::Gateways => "gateways",
            Resource::Routes => "httpRoutes",
            Resource::Backends => "backends",
            Resource::Tlsroutes => "tlsRoutes",
            Resource::Tcproutes => "tcpRoutes",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Yaml,
    Json,
}

/// Prints `status` (a `ConfigStatus` as JSON) for `what` in `output` form.
pub fn render(status: &Value, what: Resource, output: Output) -> anyhow::Result<String> {
    let list = status
        .get(what.key())
        .cloned()
        .unwrap_or(Value::Array(Vec::new()));
    Ok(match output {
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&list)?),
        Output::Yaml => serde_saphyr::to_string(&list)?,
        Output::Table => table(&list, what),
    })
}

/// `True`, or `False (Reason)` for the first `False` condition of `type_` among `conds`.
fn condition(conds: &[&Value], type_: &str) -> String {
    let mut seen = false;
    for c in conds.iter().filter(|c| c["type"] == type_) {
        seen = true;
        if c["status"] != "True" {
            return format!("False ({})", c["reason"].as_str().unwrap_or("?"));
        }
    }
    if seen { "True".into() } else { "-".into() }
}

fn conds(v: &Value) -> Vec<&Value> {
    v["conditions"].as_array().into_iter().flatten().collect()
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or("").to_owned()
}

fn table(list: &Value, what: Resource) -> String {
    let items: Vec<&Value> = list.as_array().into_iter().flatten().collect();
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut notes = Vec::new();
    match what {
        Resource::Gateways => {
            rows.push(
                [
                    "NAMESPACE",
                    "NAME",
                    "LISTENERS",
                    "ACCEPTED",
                    "PROGRAMMED",
                    "ROUTES",
                ]
                .map(String::from)
                .to_vec(),
            );
            for g in items {
                let listeners: Vec<&Value> =
                    g["listeners"].as_array().into_iter().flatten().collect();
                // A gateway is only as good as its worst listener.
                let mut all: Vec<&Value> = conds(g);
                for l in &listeners {
                    all.extend(conds(l));
                    for c in conds(l).into_iter().filter(|c| c["status"] != "True") {
                        notes.push(format!(
                            "{}/{} listener {}: {}={} {}: {}",
                            s(&g["namespace"]),
                            s(&g["name"]),
                            s(&l["name"]),
                            s(&c["type"]),
                            s(&c["status"]),
                            s(&c["reason"]),
                            s(&c["message"])
                        ));
                    }
                }
                let routes: u64 = listeners
                    .iter()
                    .filter_map(|l| l["attachedRoutes"].as_u64())
                    .sum();
                rows.push(vec![
                    s(&g["namespace"]),
                    s(&g["name"]),
                    listeners.len().to_string(),
                    condition(&all, "Accepted"),
                    condition(&all, "Programmed"),
                    routes.to_string(),
                ]);
            }
        }
        Resource::Routes | Resource::Tlsroutes | Resource::Tcproutes => {
            rows.push(
                ["NAMESPACE", "NAME", "PARENTS", "ACCEPTED", "RESOLVEDREFS"]
                    .map(String::from)
                    .to_vec(),
            );
            for r in items {
                let parents: Vec<&Value> = r["parents"].as_array().into_iter().flatten().collect();
                let mut all = Vec::new();
                for p in &parents {
                    all.extend(conds(p));
                    for c in conds(p).into_iter().filter(|c| c["status"] != "True") {
                        notes.push(format!(
                            "{}/{} parent {}/{}: {}={} {}: {}",
                            s(&r["namespace"]),
                            s(&r["name"]),
                            s(&p["parentRef"]["namespace"]),
                            s(&p["parentRef"]["name"]),
                            s(&c["type"]),
                            s(&c["status"]),
                            s(&c["reason"]),
                            s(&c["message"])
                        ));
                    }
                }
                rows.push(vec![
                    s(&r["namespace"]),
                    s(&r["name"]),
                    parents
                        .iter()
                        .map(|p| {
                            format!(
                                "{}/{}",
                                s(&p["parentRef"]["namespace"]),
                                s(&p["parentRef"]["name"])
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(","),
                    condition(&all, "Accepted"),
                    condition(&all, "ResolvedRefs"),
                ]);
            }
        }
        Resource::Backends => {
            rows.push(
                [
                    "NAMESPACE",
                    "NAME",
                    "ENDPOINTS",
                    "ACCEPTED",
                    "PROGRAMMED",
                    "ROUTES",
                ]
                .map(String::from)
                .to_vec(),
            );
            for b in items {
                let all = conds(b);
                let routes: Vec<String> = b["routes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(s)
                    .collect();
                rows.push(vec![
                    s(&b["namespace"]),
                    s(&b["name"]),
                    b["endpoints"].as_u64().unwrap_or(0).to_string(),
                    condition(&all, "Accepted"),
                    condition(&all, "Programmed"),
                    if routes.is_empty() {
                        "-".into()
                    } else {
                        routes.join(",")
                    },
                ]);
            }
        }
    }
    let mut out = crate::status_cmd::columns(&rows);
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(files: &[(&str, &str)]) -> Value {
        let set = ballast_model::ConfigSet::build(files.iter().copied()).unwrap();
        serde_json::to_value(ballast_model::status::compute(&set)).unwrap()
    }

    const CONFIG: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: edge }
spec:
  gatewayClassName: ballast
  listeners:
  - { name: http, port: 8080, protocol: HTTP, allowedRoutes: { namespaces: { from: All } } }
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: web, namespace: apps }
spec:
  parentRefs: [{ name: edge, namespace: default }]
  rules: [{ backendRefs: [{ name: web, namespace: backends }] }]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: lost }
spec:
  parentRefs: [{ name: nope }]
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: web, namespace: backends }
spec: { endpoints: [{ address: 127.0.0.1, port: 80 }, { address: 127.0.0.2, port: 80 }] }
";

    #[test]
    fn tables_show_conditions_with_reasons() {
        let v = status(&[("c.yaml", CONFIG)]);
        let routes = render(&v, Resource::Routes, Output::Table).unwrap();
        let lines: Vec<&str> = routes.lines().collect();
        assert_eq!(
            lines[..3],
            [
                "NAMESPACE  NAME  PARENTS       ACCEPTED                  RESOLVEDREFS",
                "apps       web   default/edge  True                      False (RefNotPermitted)",
                "default    lost  default/nope  False (NoMatchingParent)  True",
            ],
            "{routes}"
        );
        assert!(
            lines[3].starts_with("apps/web parent default/edge: ResolvedRefs=False RefNotPermitted: rules[0].backendRefs[0]: Backend backends/web is in another namespace"),
            "{routes}"
        );
        let gws = render(&v, Resource::Gateways, Output::Table).unwrap();
        assert_eq!(
            gws.lines().collect::<Vec<_>>(),
            [
                "NAMESPACE  NAME  LISTENERS  ACCEPTED  PROGRAMMED  ROUTES",
                "default    edge  1          True      True        1",
            ]
        );
        let backends = render(&v, Resource::Backends, Output::Table).unwrap();
        assert_eq!(
            backends.lines().nth(1).unwrap(),
            "backends   web   2          True      False (NotReferenced)  -",
            "{backends}"
        );
    }

    /// TLSRoutes and TCPRoutes have their own lists (`ballast get tlsroutes|tcproutes`).
    #[test]
    fn tls_and_tcp_routes_have_their_own_tables() {
        let config = "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: edge }
spec:
  gatewayClassName: ballast
  listeners:
  - { name: tls, port: 8443, protocol: TLS, tls: { mode: Passthrough } }
  - { name: tcp, port: 9000, protocol: TCP }
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: { name: sni }
spec:
  parentRefs: [{ name: edge }]
  hostnames: [a.example]
  rules: [{ backendRefs: [{ name: db, port: 5432 }] }]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: { name: raw }
spec:
  parentRefs: [{ name: edge, sectionName: tls }]
  rules: [{ backendRefs: [{ name: db, port: 5432 }] }]
";
        let v = status(&[("c.yaml", config)]);
        let tls = render(&v, Resource::Tlsroutes, Output::Table).unwrap();
        assert_eq!(
            tls.lines().nth(1).unwrap(),
            "default    sni   default/edge  True      False (BackendNotFound)",
            "{tls}"
        );
        let tcp = render(&v, Resource::Tcproutes, Output::Table).unwrap();
        assert_eq!(
            tcp.lines().nth(1).unwrap(),
            "default    raw   default/edge  False (NotAllowedByListeners)  False (BackendNotFound)",
            "{tcp}"
        );
        let gws = render(&v, Resource::Gateways, Output::Table).unwrap();
        assert!(gws.lines().nth(1).unwrap().ends_with("        1"), "{gws}");
    }

    #[test]
    fn yaml_and_json_are_the_status_objects() {
        let v = status(&[("c.yaml", CONFIG)]);
        let yaml = render(&v, Resource::Routes, Output::Yaml).unwrap();
        assert!(yaml.contains("reason: RefNotPermitted"), "{yaml}");
        assert!(yaml.contains("source: c.yaml:9:1"), "{yaml}");
        let json: Value =
            serde_json::from_str(&render(&v, Resource::Backends, Output::Json).unwrap()).unwrap();
        assert_eq!(json[0]["endpoints"], 2);
    }
}
