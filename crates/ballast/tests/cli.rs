//! The CLI (README, "CLI"): `validate`, `translate`, `bootstrap` (accepted by a
//! real Envoy that then gets configured by `ballast serve` on the built-in
//! quickstart config), `status`, and the node → gateway mapping (node.cluster,
//! metadata `ballast.gateway`, an unknown gateway that waits).

mod common;

use std::path::Path;
use std::process::Output;

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, EnvoyOptions, Upstream, wait_for, wait_until};
use common::*;
use serde_json::{Value, json};

fn ballast_cmd(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(args)
        .output()
        .expect("run ballast")
}

async fn ballast_async(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(args)
        .output()
        .await
        .expect("run ballast")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// GET `path` with a Host header through a gateway; (status, body).
async fn gw_get(
    addr: std::net::SocketAddr,
    host: &str,
    path: &str,
) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out)).await??;
    let text = String::from_utf8_lossy(&out).to_string();
    let code = text.get(9..12).unwrap_or("0").parse()?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((code, body))
}

#[test]
fn validate_good_config_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let up = loopback(8080);
    std::fs::write(dir.path().join("all.yaml"), many_routes(10000, 3, &[up])).unwrap();
    let out = ballast_cmd(&["validate", path(dir.path())]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("1 gateway(s), 3 route(s), 3 backend(s), 0 secret(s): ok"),
        "{text}"
    );
}

#[test]
fn validate_broken_config_prints_every_error_with_position() {
    let dir = tempfile::tempdir().unwrap();
    // Two documents with an error each.
    std::fs::write(
        dir.path().join("a.yaml"),
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: { name: edge }
spec:
  gatewayClassName: ballast
  listeners:
  - { name: http, port: 99999, protocol: HTTP }
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: web }
spec:
  parentRefs: [{ name: edge }]
  rules:
  - matches: [{ path: { type: RegularExpression, value: "/(" } }]
    backendRefs: [{ group: ballast.dev, kind: Backend, name: web }]
"#,
    )
    .unwrap();
    // In a subdirectory: an invalid duration.
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(
        dir.path().join("sub/b.yaml"),
        "apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: web }
spec:
  connectTimeout: 1parsec
  endpoints:
  - { address: 127.0.0.1, port: 8080 }
",
    )
    .unwrap();
    // An unknown field is an error, not ignored.
    std::fs::write(
        dir.path().join("c.yml"),
        "apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: { name: other }
spec:
  endpoints:
  - { address: 127.0.0.1, port: 8080, colour: blue }
",
    )
    .unwrap();
    let out = ballast_cmd(&["validate", path(dir.path())]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let d = path(dir.path());
    for expected in [
        format!("{d}/a.yaml:7:25: Gateway default/edge: spec.listeners[0].port:"),
        format!("{d}/a.yaml:15:57: HTTPRoute default/web: spec.rules[0].matches[0].path.value:"),
        format!("{d}/sub/b.yaml:5:19: Backend default/web: spec.connectTimeout:"),
        format!("{d}/c.yml:6:39: Backend default/other: spec.endpoints[0].colour: unknown field"),
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(&expected)),
            "missing `{expected}` in:\n{text}"
        );
    }
    assert!(text.contains("4 error(s)"), "{text}");

    // The same files passed one by one give the same errors.
    let out2 = ballast_cmd(&[
        "validate",
        &format!("{d}/a.yaml"),
        &format!("{d}/sub/b.yaml"),
        &format!("{d}/c.yml"),
    ]);
    assert_eq!(out2.status.code(), Some(1));
    let mut l1: Vec<_> = text.lines().collect();
    let mut l2: Vec<_> = std::str::from_utf8(&out2.stdout).unwrap().lines().collect();
    l1.sort();
    l2.sort();
    assert_eq!(l1, l2);

    // A path that does not exist is an error too.
    let out = ballast_cmd(&["validate", &format!("{d}/missing.yaml")]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
}

/// Kinds Ballast does not implement are warnings (exit 0); with an error too, every error and
/// every warning is printed and the exit code is 1 (for CI).
#[test]
fn validate_warns_about_skipped_kinds_and_still_fails_on_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.yaml"),
        many_routes(10000, 2, &[loopback(8080)]),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("grant.yaml"),
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: { name: g, namespace: backends }\nspec: { podSelector: {} }\n---\napiVersion: gateway.networking.k8s.io/v1alpha2\nkind: UDPRoute\nmetadata: { name: udp }\nspec: {}\n",
    )
    .unwrap();
    let d = path(dir.path());
    let out = ballast_cmd(&["validate", d]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for expected in [
        format!(
            "warning: {d}/grant.yaml:1:1: skipped NetworkPolicy backends/g (networking.k8s.io/v1): kind not implemented by Ballast"
        ),
        format!(
            "warning: {d}/grant.yaml:6:1: skipped UDPRoute default/udp (gateway.networking.k8s.io/v1alpha2): kind not implemented by Ballast"
        ),
        "1 gateway(s), 2 route(s), 2 backend(s), 0 secret(s): ok".to_owned(),
    ] {
        assert!(
            text.lines().any(|l| l == expected),
            "missing `{expected}` in:\n{text}"
        );
    }
    std::fs::write(
        dir.path().join("bad.yaml"),
        "apiVersion: ballast.dev/v1alpha1\nkind: Backend\nmetadata: { name: bad }\nspec: { endpoints: [{ address: 127.0.0.1, port: 0 }] }\n---\nkind: [\n",
    )
    .unwrap();
    let out = ballast_cmd(&["validate", d]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains(&format!("{d}/bad.yaml:4:")), "{text}");
    assert!(text.contains(&format!("{d}/bad.yaml:6:")), "{text}");
    assert!(
        text.contains("warning: ") && text.contains("skipped UDPRoute"),
        "{text}"
    );
    assert!(text.contains("2 error(s)"), "{text}");
}

/// Parses `ballast translate` output: `---`-separated JSON documents.
fn documents(text: &str) -> Vec<Value> {
    text.split("\n---\n")
        .map(|d| d.trim().trim_start_matches("---").trim())
        .filter(|d| !d.is_empty())
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

#[test]
fn translate_prints_resources_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    let ups = [loopback(8080), loopback(8081)];
    let config = many_routes(10080, 3, &ups);
    std::fs::write(dir.path().join("all.yaml"), &config).unwrap();
    let d = path(dir.path());
    let run = || {
        let out = ballast_cmd(&["translate", d, "--gateway", "edge"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let first = run();
    assert_eq!(first, run(), "byte-identical on every run");
    let text = String::from_utf8(first.clone()).unwrap();
    let docs = documents(&text);
    let mut by_type: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for doc in &docs {
        let ty = doc["@type"].as_str().expect("each document has @type");
        let name = doc["name"]
            .as_str()
            .or(doc["clusterName"].as_str())
            .expect("named");
        by_type
            .entry(ty.rsplit('.').next().unwrap().to_string())
            .or_default()
            .push(name.to_string());
    }
    let names = |t: &str| by_type.get(t).cloned().unwrap_or_default();
    assert_eq!(
        names("Cluster"),
        ["default/b0", "default/b1", "default/b2"],
        "{text}"
    );
    assert_eq!(
        names("ClusterLoadAssignment"),
        ["default/b0", "default/b1", "default/b2"]
    );
    assert_eq!(names("Listener"), ["default/edge/10080"]);
    assert_eq!(names("RouteConfiguration"), ["default/edge/10080"]);
    let rc = docs
        .iter()
        .find(|d| d["@type"].as_str().unwrap().ends_with("RouteConfiguration"))
        .unwrap();
    let mut domains: Vec<String> = rc["virtualHosts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|vh| vh["domains"].as_array().unwrap().clone())
        .map(|d| d.as_str().unwrap().to_string())
        .collect();
    domains.sort();
    assert_eq!(
        domains,
        ["h0.example.com", "h1.example.com", "h2.example.com"]
    );

    // The same objects in other files, in another order: the same output.
    let dir2 = tempfile::tempdir().unwrap();
    let docs_text: Vec<&str> = config.split("---\n").collect();
    for (i, doc) in docs_text.iter().rev().enumerate() {
        std::fs::write(dir2.path().join(format!("f{i}.yaml")), doc).unwrap();
    }
    let out = ballast_cmd(&["translate", path(dir2.path()), "--gateway", "default/edge"]);
    assert_eq!(out.stdout, first, "output depends only on the objects");

    // An unknown gateway is an error.
    let out = ballast_cmd(&["translate", d, "--gateway", "nope"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no Gateway default/nope"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The quickstart as the README tells it, on free ports: `ballast serve` (no
/// --config), `ballast bootstrap --gateway quickstart`, Envoy started with that
/// bootstrap as is (but for its admin port), `curl <gateway>/healthz`,
/// `ballast status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_is_accepted_by_envoy_and_configured_by_quickstart() {
    let gw_port = ballast_testkit::free_port();
    let ballast = Ballast::start(
        free_addr(),
        free_addr(),
        &["--quickstart-port", &gw_port.to_string()],
    )
    .unwrap();
    ballast.wait_ready().await.unwrap();
    let out = ballast_async(&[
        "bootstrap",
        "--gateway",
        "quickstart",
        "--xds-addr",
        &ballast.xds.to_string(),
        "--envoy-admin-port",
        "0",
    ])
    .await;
    assert_eq!(out.status.code(), Some(0));
    let yaml = stdout(&out);
    assert!(yaml.contains("cluster: default/quickstart"), "{yaml}");
    let envoy = Envoy::start_with(&yaml, &EnvoyOptions::default())
        .await
        .unwrap();
    let gw = loopback(gw_port);
    // Through Envoy to ballast's own admin server.
    wait_until(T, POLL, || async {
        matches!(gw_get(gw, "localhost", "/healthz").await, Ok((200, body)) if body == "ok\n")
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));

    // `ballast status`: the node, its gateway, every type it uses SYNCED.
    let table = wait_for(T, POLL, || async {
        let out = ballast_async(&["status", "--admin-addr", &ballast.admin.to_string()]).await;
        anyhow::ensure!(out.status.success(), "status failed");
        let t = stdout(&out);
        let row = t
            .lines()
            .find(|l| l.starts_with("envoy-default-quickstart "))
            .unwrap_or_default();
        let cols: Vec<&str> = row.split_whitespace().collect();
        if cols
            == [
                "envoy-default-quickstart",
                "default/quickstart",
                "yes",
                "-",
                "SYNCED",
                "SYNCED",
                "SYNCED",
                "SYNCED",
            ]
        {
            Ok(t)
        } else {
            anyhow::bail!("not synced yet: {t}")
        }
    })
    .await
    .unwrap();
    assert!(
        table.starts_with("NODE") && table.contains("CONNECTED") && table.contains("RDS"),
        "{table}"
    );
    let out = ballast_async(&[
        "status",
        "--admin-addr",
        &ballast.admin.to_string(),
        "--json",
    ])
    .await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["proxies"][0]["node"], "envoy-default-quickstart");
    assert_eq!(v["proxies"][0]["gateway"], "default/quickstart");

    // Status of a server that is not running: a clear error, non-zero exit.
    let out = ballast_async(&["status", "--admin-addr", &free_addr().to_string()]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is `ballast serve` running?"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn namespaced(
    ns: &str,
    gw: &str,
    port: u16,
    host: &str,
    backend_addr: std::net::SocketAddr,
) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: {gw}, namespace: {ns} }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: http, port: {port}, protocol: HTTP }}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {gw}-route, namespace: {ns} }}
spec:
  parentRefs: [{{ name: {gw} }}]
  hostnames: [{host}]
  rules:
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: {gw}-backend }}]
---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {gw}-backend, namespace: {ns} }}
spec:
  endpoints:
  - {{ address: {}, port: {} }}
",
        backend_addr.ip(),
        backend_addr.port()
    )
}

async fn proxy(ballast: &Ballast, node: &str) -> Value {
    let (_, body) = ballast.get("/debug/proxies").await.unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    v["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["node"] == node)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Node → gateway: `node.cluster` (a bare name means namespace `default`),
/// metadata `ballast.gateway` overriding it, and an unknown gateway whose
/// stream waits (status says why) until the gateway appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_to_gateway_mapping() {
    let up_edge = Upstream::start("edge").await.unwrap();
    let up_meta = Upstream::start("meta").await.unwrap();
    let up_late = Upstream::start("late").await.unwrap();
    let (p_edge, p_meta, p_late) = (
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("gateways.yaml"),
        namespaced(
            "default",
            "edge",
            p_edge,
            "edge.example.com",
            up_edge.addr(),
        ) + &namespaced("prod", "meta", p_meta, "meta.example.com", up_meta.addr()),
    )
    .unwrap();
    let ballast =
        Ballast::start(free_addr(), free_addr(), &["--config", path(dir.path())]).unwrap();
    ballast.wait_ready().await.unwrap();

    // By node.cluster, bare name → default/edge.
    let envoy_edge = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-edge",
        "edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    // By metadata: node.cluster names something else; metadata wins.
    let envoy_meta = Envoy::start(
        &EnvoyConfig::new(
            ballast.xds,
            "envoy-meta",
            "default/edge",
            AdsMode::DeltaGrpc,
        )
        .node_metadata(json!({ "ballast.gateway": "prod/meta" })),
    )
    .await
    .unwrap();
    // Unknown gateway.
    let envoy_late = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-late",
        "default/late",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();

    wait_until(T, POLL, || async {
        matches!(gw_get(loopback(p_edge), "edge.example.com", "/").await, Ok((200, b)) if b == "edge")
    })
    .await
    .unwrap();
    wait_until(T, POLL, || async {
        matches!(gw_get(loopback(p_meta), "meta.example.com", "/").await, Ok((200, b)) if b == "meta")
    })
    .await
    .unwrap();
    // envoy-meta holds prod/meta only, not default/edge (which its node.cluster names).
    let meta = envoy_meta.config_summary(false).await.unwrap();
    assert_eq!(
        meta.listeners.iter().collect::<Vec<_>>(),
        [&format!("prod/meta/{p_meta}")]
    );
    assert_eq!(
        proxy(&ballast, "envoy-edge").await["gateway"],
        "default/edge"
    );
    assert_eq!(proxy(&ballast, "envoy-meta").await["gateway"], "prod/meta");

    // The unknown gateway's stream is open and waiting; status says why.
    let late = wait_for(T, POLL, || async {
        let p = proxy(&ballast, "envoy-late").await;
        anyhow::ensure!(p["connected"] == true, "not connected yet");
        Ok(p)
    })
    .await
    .unwrap();
    assert_eq!(late["gateway"], "default/late");
    assert_eq!(late["gateway_known"], false);
    assert_eq!(late["waiting"], "no gateway default/late in the config");
    let out = ballast_async(&["status", "--admin-addr", &ballast.admin.to_string()]).await;
    assert!(
        stdout(&out).contains("envoy-late: waiting: no gateway default/late in the config"),
        "{}",
        stdout(&out)
    );
    // It received nothing: no dynamic resources, and it is still connected.
    let s = envoy_late.config_summary(false).await.unwrap();
    assert!(s.listeners.is_empty() && s.clusters.is_empty(), "{s:?}");
    assert_eq!(
        envoy_late
            .stat("control_plane.connected_state")
            .await
            .unwrap(),
        Some(1)
    );

    // The gateway appears: the waiting stream is answered.
    write_atomic(
        &dir.path().join("late.yaml"),
        &namespaced(
            "default",
            "late",
            p_late,
            "late.example.com",
            up_late.addr(),
        ),
    );
    wait_until(T, POLL, || async {
        matches!(gw_get(loopback(p_late), "late.example.com", "/").await, Ok((200, b)) if b == "late")
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy_late.log_tail(30)));
    let late = proxy(&ballast, "envoy-late").await;
    assert_eq!(late["waiting"], Value::Null);
    assert_eq!(late["gateway_known"], true);
    // The others were not disturbed.
    assert_eq!(
        gw_get(loopback(p_edge), "edge.example.com", "/")
            .await
            .unwrap(),
        (200, "edge".into())
    );
    drop(envoy_edge);
}
