//! TLSRoute and TCPRoute (issue 10) through real Envoy 1.40 and `ballast serve`.
//!
//! - TLS passthrough: two TLSRoutes with different SNI names on one TLS listener; each backend
//!   is a TLS echo server with its own certificate, and the client trusts only the expected
//!   backend's certificate, so a completed handshake proves which backend terminated TLS (Envoy
//!   only forwarded the bytes). An unknown SNI name matches no filter chain: the connection is
//!   closed.
//! - TLS terminate: a TLS listener in mode `Terminate` decrypts with its own certificate
//!   (SDS) and proxies the plain bytes to a TCP echo backend.
//! - A TCPRoute with an unresolvable backendRef: its share of connections is closed, the rest
//!   served.
//! - TCP: plain echo through a TCP listener; moving a TCPRoute to another backend while a loop
//!   opens connections loses none of them (make-before-break: the new cluster is there before
//!   the filter chain naming it), and established connections survive the edit — those of an
//!   unchanged route on another port and those of the moved route (Envoy drains the old filter
//!   chain instead of cutting it).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ballast_testkit::{
    AdsMode, EchoServer, Envoy, EnvoyConfig, tcp_hello, tcp_hello_with, tls_hello, wait_for,
};
use common::*;

fn gateway(listeners: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
{listeners}"
    )
}

fn tls_route(name: &str, host: &str, backend: &str) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {{ name: {name} }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [{host}]
  rules:
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]
"
    )
}

fn tcp_route(name: &str, section: &str, backend: &str) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {{ name: {name} }}
spec:
  parentRefs: [{{ name: edge, sectionName: {section} }}]
  rules:
  - backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]
"
    )
}

async fn start_envoy(ballast: &Ballast, node: &str) -> Envoy {
    Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        node,
        "default/edge",
        AdsMode::DeltaGrpc,
    ))
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_routes_by_sni_passthrough_and_terminate() {
    let alpha = EchoServer::tls("alpha", "alpha.example.com").await.unwrap();
    let beta = EchoServer::tls("beta", "beta.example.com").await.unwrap();
    let plain = EchoServer::tcp("plain").await.unwrap();
    let (port, term_port) = (ballast_testkit::free_port(), ballast_testkit::free_port());
    let dir = tempfile::tempdir().unwrap();
    // The terminating listener's certificate (Envoy presents it).
    let params = rcgen::CertificateParams::new(vec!["term.example.com".to_owned()]).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let term_cert = params.self_signed(&key).unwrap().pem();
    let indent = |pem: &str| {
        pem.lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    let config = gateway(&format!(
        "  - {{ name: tls, port: {port}, protocol: TLS, tls: {{ mode: Passthrough }} }}\n  \
         - {{ name: term, port: {term_port}, protocol: TLS, hostname: term.example.com, tls: {{ mode: Terminate, certificateRefs: [{{ name: term-tls }}] }} }}\n"
    )) + &tls_route("alpha", "alpha.example.com", "alpha")
        + &tls_route("beta", "beta.example.com", "beta")
        + &tls_route("term", "term.example.com", "plain")
        + &backend("alpha", &[alpha.addr()])
        + &backend("beta", &[beta.addr()])
        + &backend("plain", &[plain.addr()])
        + &format!(
            "---\napiVersion: v1\nkind: Secret\nmetadata: {{ name: term-tls }}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
            indent(&term_cert),
            indent(&key.serialize_pem())
        );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = start_envoy(&ballast, "envoy-tls").await;
    let gw = loopback(port);

    let certs = [("alpha.example.com", &alpha), ("beta.example.com", &beta)];
    for (sni, server) in certs {
        wait_for(T, POLL, || async {
            let c = tls_hello(gw, sni, server.cert_pem().unwrap()).await?;
            anyhow::ensure!(c.server == server.name(), "{sni} reached {}", c.server);
            Ok(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));
    }

    // Every connection reaches the backend its SNI names, end to end encrypted by that backend.
    let mut failures = Vec::new();
    for i in 0..20 {
        let (sni, server) = certs[i % 2];
        match tls_hello(gw, sni, server.cert_pem().unwrap()).await {
            Ok(mut c) if c.server == server.name() => {
                if let Err(e) = c.roundtrip(&format!("ping {i}")).await {
                    failures.push(format!("{sni} #{i}: {e:#}"));
                }
            }
            Ok(c) => failures.push(format!("{sni} #{i}: answered by {}", c.server)),
            Err(e) => failures.push(format!("{sni} #{i}: {e:#}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures: {failures:?}",
        failures.len()
    );
    // Envoy did not terminate TLS: the certificate presented for alpha is alpha's own, so a
    // client trusting only beta's certificate fails its handshake (and vice versa).
    assert!(
        tls_hello(gw, "alpha.example.com", beta.cert_pem().unwrap())
            .await
            .is_err()
    );
    assert!(
        tls_hello(gw, "beta.example.com", alpha.cert_pem().unwrap())
            .await
            .is_err()
    );

    // An SNI no route names matches no filter chain: Envoy closes the connection.
    let before = (alpha.accepted(), beta.accepted());
    for _ in 0..3 {
        let r = tls_hello(gw, "gamma.example.com", alpha.cert_pem().unwrap()).await;
        assert!(r.is_err(), "unknown SNI must not be served");
    }
    assert_eq!((alpha.accepted(), beta.accepted()), before);
    let stat = format!("listener.127.0.0.1_{port}.no_filter_chain_match");
    assert_eq!(envoy.stat(&stat).await.unwrap(), Some(3), "{stat}");

    // Terminate: Envoy's own certificate for term.example.com, plain bytes to the backend.
    let term = loopback(term_port);
    wait_for(T, POLL, || async {
        let mut c = tls_hello(term, "term.example.com", &term_cert).await?;
        anyhow::ensure!(c.server == "plain", "reached {}", c.server);
        c.roundtrip("through terminate").await
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));
    for i in 0..10 {
        let mut c = tls_hello(term, "term.example.com", &term_cert)
            .await
            .unwrap();
        assert_eq!(c.server, "plain");
        c.roundtrip(&format!("t{i}")).await.unwrap();
    }

    // Status: every route attaches to the passthrough listener (no hostname of its own), the
    // term route also to the terminating one.
    let (code, body) = ballast.get("/debug/sources").await.unwrap();
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let listeners = &v["status"]["gateways"][0]["listeners"];
    assert_eq!(listeners[0]["attachedRoutes"], 3, "{listeners}");
    assert_eq!(listeners[1]["attachedRoutes"], 1, "{listeners}");
    let routes = v["status"]["tlsRoutes"].as_array().unwrap();
    assert_eq!(routes.len(), 3);
    for r in routes {
        assert_eq!(r["parents"][0]["conditions"][0]["status"], "True", "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_route_echo_and_backend_move_lose_no_connection() {
    let a = EchoServer::tcp("a").await.unwrap();
    let b = EchoServer::tcp("b").await.unwrap();
    let c = EchoServer::tcp("c").await.unwrap();
    let (p_move, p_steady) = (ballast_testkit::free_port(), ballast_testkit::free_port());
    let p_half = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    let config = |mover: &str| {
        gateway(&format!(
            "  - {{ name: moving, port: {p_move}, protocol: TCP }}\n  - {{ name: steady, port: {p_steady}, protocol: TCP }}\n  - {{ name: half, port: {p_half}, protocol: TCP }}\n"
        )) + &tcp_route("mover", "moving", mover)
            + &tcp_route("steady", "steady", "c")
            + &tcp_route("half", "half", "c").replace(
                "name: c }]",
                "name: c }, { group: ballast.dev, kind: Backend, name: missing }]",
            )
            + &backend("a", &[a.addr()])
            + &backend("b", &[b.addr()])
            + &backend("c", &[c.addr()])
    };
    std::fs::write(&file, config("a")).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = start_envoy(&ballast, "envoy-tcp").await;
    let (moving, steady) = (loopback(p_move), loopback(p_steady));
    for (addr, name) in [(moving, "a"), (steady, "c")] {
        wait_for(T, POLL, || async {
            let mut conn = tcp_hello(addr).await?;
            anyhow::ensure!(conn.server == name, "{addr} reached {}", conn.server);
            conn.roundtrip("hello").await
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));
    }

    // A route whose second backendRef does not resolve: Gateway API rejects that share of
    // connections (1:1 weights), the rest reach c.
    let half = loopback(p_half);
    let (mut served, mut closed) = (0, 0);
    for i in 0..40 {
        match tcp_hello(half).await {
            Ok(mut conn) => {
                assert_eq!(conn.server, "c");
                conn.roundtrip(&format!("h{i}")).await.unwrap();
                served += 1;
            }
            Err(_) => closed += 1,
        }
    }
    eprintln!("half: {served} served, {closed} closed");
    assert!(served > 0 && closed > 0, "served {served}, closed {closed}");

    // Established connections: 5 on the route that moves (to a), 5 on the steady one.
    let mut held_moving = Vec::new();
    let mut held_steady = Vec::new();
    for i in 0..5 {
        let mut m = tcp_hello(moving).await.unwrap();
        assert_eq!(m.server, "a");
        m.roundtrip(&format!("m{i}")).await.unwrap();
        held_moving.push(m);
        let mut s = tcp_hello(steady).await.unwrap();
        assert_eq!(s.server, "c");
        s.roundtrip(&format!("s{i}")).await.unwrap();
        held_steady.push(s);
    }

    // A loop of new connections on the moving port, each checked end to end.
    let stop = Arc::new(AtomicBool::new(false));
    let loop_task = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut seen: Vec<String> = Vec::new();
            let mut failures: Vec<String> = Vec::new();
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) && i < 20_000 {
                i += 1;
                match tcp_hello(moving).await {
                    Ok(mut conn) => match conn.roundtrip(&format!("loop {i}")).await {
                        Ok(()) => seen.push(conn.server.clone()),
                        Err(e) => failures.push(format!("#{i} via {}: {e:#}", conn.server)),
                    },
                    Err(e) => failures.push(format!("#{i}: {e:#}")),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (seen, failures)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    write_atomic(&file, &config("b"));
    // New connections reach b once Envoy has the edit.
    wait_for(T, POLL, || async {
        let conn = tcp_hello(moving).await?;
        anyhow::ensure!(conn.server == "b", "still {}", conn.server);
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (seen, failures) = loop_task.await.unwrap();
    let to_a = seen.iter().filter(|s| *s == "a").count();
    let to_b = seen.iter().filter(|s| *s == "b").count();
    eprintln!(
        "loop: {} connections, {to_a} to a, {to_b} to b, {} failed",
        seen.len() + failures.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failed: {failures:?}",
        failures.len()
    );
    assert!(to_a > 0 && to_b > 0, "a {to_a}, b {to_b}");
    assert_eq!(seen.last().map(String::as_str), Some("b"));

    // Established connections stay: the steady route's, and the moved route's to a.
    let mut lost = Vec::new();
    for (i, m) in held_moving.iter_mut().enumerate() {
        if let Err(e) = m.roundtrip(&format!("after m{i}")).await {
            lost.push(format!("moving #{i} (to {}): {e:#}", m.server));
        }
    }
    for (i, s) in held_steady.iter_mut().enumerate() {
        if let Err(e) = s.roundtrip(&format!("after s{i}")).await {
            lost.push(format!("steady #{i}: {e:#}"));
        }
    }
    assert!(lost.is_empty(), "{} established lost: {lost:?}", lost.len());
}

/// A TCP listener behind a PROXY-protocol load balancer (ClientPolicy `enableProxyProtocol`):
/// connections that start with a PROXY header are proxied; the header never reaches the
/// backend (the echo would show it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_listener_reads_proxy_protocol_from_client_policy() {
    let echo = EchoServer::tcp("echo").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = gateway(&format!(
        "  - {{ name: tcp, port: {port}, protocol: TCP }}\n"
    )) + &tcp_route("raw", "tcp", "echo")
        + &backend("echo", &[echo.addr()])
        + "---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: { name: lb }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: tcp }]
  enableProxyProtocol: true
";
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = start_envoy(&ballast, "envoy-pp").await;
    let addr = loopback(port);
    let header = b"PROXY TCP4 192.0.2.7 127.0.0.1 40000 443\r\n";
    wait_for(T, POLL, || async {
        let mut c = tcp_hello_with(addr, header).await?;
        anyhow::ensure!(c.server == "echo", "reached {}", c.server);
        c.roundtrip("after header").await
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));
    for i in 0..10 {
        let mut c = tcp_hello_with(addr, header).await.unwrap();
        c.roundtrip(&format!("pp{i}")).await.unwrap();
    }
    let stats = envoy.stats().await.unwrap();
    let found: u64 = stats
        .iter()
        .filter(|(k, _)| k.contains("proxy_proto") && k.ends_with("v1.found"))
        .map(|(_, v)| *v)
        .sum();
    assert!(found >= 11, "PROXY v1 headers read: {found}");
}

/// Conformance `TCPRouteReferenceGrant`: a TCPRoute's backendRef into another namespace
/// connects once a ReferenceGrant there names TCPRoutes from the route's namespace and that
/// Backend; the same route shape to a Backend the grant does not name gets every connection
/// closed, and that backend accepts none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_route_cross_namespace_backend_needs_a_grant() {
    let echo = EchoServer::tcp("granted").await.unwrap();
    let hidden = EchoServer::tcp("hidden").await.unwrap();
    let (p_ok, p_denied) = (ballast_testkit::free_port(), ballast_testkit::free_port());
    let dir = tempfile::tempdir().unwrap();
    let backend = |name: &str, s: &EchoServer| {
        format!(
            "---
apiVersion: ballast.dev/v1alpha1
kind: Backend
metadata: {{ name: {name}, namespace: other }}
spec:
  endpoints: [{{ address: {}, port: {} }}]
",
            s.addr().ip(),
            s.addr().port()
        )
    };
    let config = gateway(&format!(
        "  - {{ name: ok, port: {p_ok}, protocol: TCP }}\n  - {{ name: denied, port: {p_denied}, protocol: TCP }}\n"
    )) + &tcp_route("to-echo", "ok", "echo")
        .replace("name: echo }", "name: echo, namespace: other }")
        + &tcp_route("to-hidden", "denied", "hidden")
            .replace("name: hidden }", "name: hidden, namespace: other }")
        + "---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: { name: tcp-echo, namespace: other }
spec:
  from: [{ group: gateway.networking.k8s.io, kind: TCPRoute, namespace: default }]
  to: [{ group: ballast.dev, kind: Backend, name: echo }]
" + &backend("echo", &echo)
        + &backend("hidden", &hidden);
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = start_envoy(&ballast, "envoy-tcp-grant").await;
    let ok = loopback(p_ok);
    wait_for(T, POLL, || async {
        let mut conn = tcp_hello(ok).await?;
        anyhow::ensure!(conn.server == "granted", "reached {}", conn.server);
        conn.roundtrip("hello").await
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));
    for i in 0..10 {
        let mut conn = tcp_hello(ok).await.unwrap();
        assert_eq!(conn.server, "granted");
        conn.roundtrip(&format!("m{i}")).await.unwrap();
    }
    // Envoy listens on the denied port too (the route is there, its ref is not permitted).
    let denied = loopback(p_denied);
    for _ in 0..10 {
        assert!(
            tcp_hello(denied).await.is_err(),
            "an ungranted backendRef must not connect"
        );
    }
    assert_eq!(
        hidden.accepted(),
        0,
        "the ungranted backend accepted a connection"
    );
}

/// Conformance `TLSRouteMixedTerminationSameNamespace`: a Passthrough and a Terminate TLS
/// listener on one port, told apart by SNI. `pass.example.com` reaches a TLS backend that
/// presents its own certificate (Envoy only forwards bytes); `term.example.com` is decrypted
/// with the Gateway's certificate and reaches a plain TCP backend. Both listeners are
/// `Accepted`, each with one route attached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_and_terminate_listeners_share_a_port() {
    let pass = EchoServer::tls("pass", "pass.example.com").await.unwrap();
    let plain = EchoServer::tcp("plain").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let params = rcgen::CertificateParams::new(vec!["term.example.com".to_owned()]).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let term_cert = params.self_signed(&key).unwrap().pem();
    let indent = |pem: &str| {
        pem.lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    let config = gateway(&format!(
        "  - {{ name: pass, port: {port}, protocol: TLS, hostname: pass.example.com, tls: {{ mode: Passthrough }} }}\n  \
         - {{ name: term, port: {port}, protocol: TLS, hostname: term.example.com, tls: {{ mode: Terminate, certificateRefs: [{{ name: term-tls }}] }} }}\n"
    )) + &tls_route("pass", "pass.example.com", "pass")
        + &tls_route("term", "term.example.com", "plain")
        + &backend("pass", &[pass.addr()])
        + &backend("plain", &[plain.addr()])
        + &format!(
            "---\napiVersion: v1\nkind: Secret\nmetadata: {{ name: term-tls }}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
            indent(&term_cert),
            indent(&key.serialize_pem())
        );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = start_envoy(&ballast, "envoy-mixed").await;
    let gw = loopback(port);
    wait_for(T, POLL, || async {
        let mut c = tls_hello(gw, "term.example.com", &term_cert).await?;
        anyhow::ensure!(c.server == "plain", "term reached {}", c.server);
        c.roundtrip("warm").await?;
        let mut c = tls_hello(gw, "pass.example.com", pass.cert_pem().unwrap()).await?;
        anyhow::ensure!(c.server == "pass", "pass reached {}", c.server);
        c.roundtrip("warm").await
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));
    let mut failures = Vec::new();
    for i in 0..20 {
        let (sni, cert, want) = if i % 2 == 0 {
            ("pass.example.com", pass.cert_pem().unwrap(), "pass")
        } else {
            ("term.example.com", term_cert.as_str(), "plain")
        };
        match tls_hello(gw, sni, cert).await {
            Ok(mut c) if c.server == want => {
                if let Err(e) = c.roundtrip(&format!("m{i}")).await {
                    failures.push(format!("{sni} #{i}: {e:#}"));
                }
            }
            Ok(c) => failures.push(format!("{sni} #{i}: answered by {}", c.server)),
            Err(e) => failures.push(format!("{sni} #{i}: {e:#}")),
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
    // Each name gets its own listener's treatment: the passthrough name is not terminated
    // with the Gateway's certificate, the terminated name is not the backend's certificate.
    assert!(tls_hello(gw, "pass.example.com", &term_cert).await.is_err());
    assert!(
        tls_hello(gw, "term.example.com", pass.cert_pem().unwrap())
            .await
            .is_err()
    );
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let listeners = &v["status"]["gateways"][0]["listeners"];
    for i in 0..2 {
        assert_eq!(listeners[i]["attachedRoutes"], 1, "{listeners}");
        assert_eq!(
            listeners[i]["conditions"][0]["type"], "Accepted",
            "{listeners}"
        );
        assert_eq!(
            listeners[i]["conditions"][0]["status"], "True",
            "{listeners}"
        );
    }
}

/// Conformance `BackendTLSPolicyTLSRouteTerminate`: a Terminate TLS listener whose TLSRoute
/// backend has a BackendTLSPolicy re-encrypts towards it. The backend is a TLS echo server
/// with a self-signed certificate for `backend.example.com` (the policy's CA and hostname):
/// every connection through the listener echoes, which plain TCP to that server cannot.
/// Without the policy the same route fails (checked first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_listener_re_encrypts_with_backend_tls_policy() {
    let secure = EchoServer::tls("secure", "backend.example.com")
        .await
        .unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let params = rcgen::CertificateParams::new(vec!["term.example.com".to_owned()]).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let term_cert = params.self_signed(&key).unwrap().pem();
    let indent = |pem: &str| {
        pem.lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    };
    let base = gateway(&format!(
        "  - {{ name: term, port: {port}, protocol: TLS, hostname: term.example.com, tls: {{ mode: Terminate, certificateRefs: [{{ name: term-tls }}] }} }}\n"
    )) + &tls_route("term", "term.example.com", "secure")
        + &backend("secure", &[secure.addr()])
        + &format!(
            "---\napiVersion: v1\nkind: Secret\nmetadata: {{ name: term-tls }}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
            indent(&term_cert),
            indent(&key.serialize_pem())
        );
    let policy = format!(
        "---
apiVersion: v1
kind: ConfigMap
metadata: {{ name: backend-ca }}
data:
  ca.crt: |
{}---
apiVersion: gateway.networking.k8s.io/v1alpha3
kind: BackendTLSPolicy
metadata: {{ name: secure-tls }}
spec:
  targetRefs: [{{ group: ballast.dev, kind: Backend, name: secure }}]
  validation:
    caCertificateRefs: [{{ group: \"\", kind: ConfigMap, name: backend-ca }}]
    hostname: backend.example.com
",
        indent(secure.cert_pem().unwrap())
    );
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, &base).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = start_envoy(&ballast, "envoy-term-btls").await;
    let gw = loopback(port);
    // Without the policy Envoy speaks plain TCP to a TLS server: the echo never comes back.
    wait_for(T, POLL, || async {
        let c = tokio::net::TcpStream::connect(gw).await;
        anyhow::ensure!(c.is_ok(), "listener not up yet");
        Ok(())
    })
    .await
    .unwrap();
    assert!(
        tls_hello(gw, "term.example.com", &term_cert).await.is_err(),
        "a TLS backend cannot echo plain bytes"
    );
    write_atomic(&file, &(base.clone() + &policy));
    wait_for(T, POLL, || async {
        let mut c = tls_hello(gw, "term.example.com", &term_cert).await?;
        anyhow::ensure!(c.server == "secure", "reached {}", c.server);
        c.roundtrip("warm").await
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nenvoy log:\n{}", envoy.log_tail(30)));
    for i in 0..10 {
        let mut c = tls_hello(gw, "term.example.com", &term_cert).await.unwrap();
        assert_eq!(c.server, "secure");
        c.roundtrip(&format!("s{i}")).await.unwrap();
    }
}
