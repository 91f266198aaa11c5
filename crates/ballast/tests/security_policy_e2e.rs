//! SecurityPolicy (issue #11) against real Envoy: client IP allow/deny rules (RBAC) with
//! Gateway, listener, route and rule precedence; JWT authentication (jwt_authn) with keys from
//! a ConfigMap and inline, claims copied to headers; bad input kept out of the served config.
//! External authorization over HTTP and gRPC (the testkit's `ExtAuthzServer`), failing closed
//! and open. Clients connect from different loopback addresses (127.0.0.1, 127.0.0.2); tokens are ES256,
//! signed in the test with [`JwtSigner`].

mod common;

use std::net::{IpAddr, Ipv4Addr};

use ballast_testkit::{AdsMode, Envoy, EnvoyConfig, JwtSigner, Upstream, unix_now, wait_for};
use common::*;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// Gateway `edge` with HTTP listeners `http`, `plain` and `proxied` on three ports.
fn gateway3(http: u16, plain: u16, proxied: u16) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge }}
spec:
  gatewayClassName: ballast
  addresses: [{{ type: IPAddress, value: 127.0.0.1 }}]
  listeners:
  - {{ name: http, port: {http}, protocol: HTTP }}
  - {{ name: plain, port: {plain}, protocol: HTTP }}
  - {{ name: proxied, port: {proxied}, protocol: HTTP }}
"
    )
}

/// An HTTPRoute for `host` on every listener of `edge`, one rule named `main`.
fn named_rule_route(name: &str, host: &str, backend: &str) -> String {
    format!(
        "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{ name: {name} }}
spec:
  parentRefs: [{{ name: edge }}]
  hostnames: [{host}]
  rules:
  - name: main
    backendRefs: [{{ group: ballast.dev, kind: Backend, name: {backend} }}]
"
    )
}

/// GET / from source address `from` (any of 127.0.0.0/8 works on loopback) with a Host and
/// extra header lines; the status (0 on a connection error). Reads only the response head and
/// its `Content-Length` body: waiting for the close would add Envoy's delayed-close second to
/// every local reply.
async fn status_from(from: IpAddr, port: u16, host: &str, headers: &[&str]) -> u16 {
    status_path_from(from, port, host, "/", headers).await
}

/// [`status_from`] for GET `path` (with a query, say).
async fn status_path_from(
    from: IpAddr,
    port: u16,
    host: &str,
    path: &str,
    headers: &[&str],
) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let sock = tokio::net::TcpSocket::new_v4()?;
        sock.bind(std::net::SocketAddr::new(from, 0))?;
        let mut s = sock.connect(loopback(port)).await?;
        let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).await?;
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if body.len() >= len || n == 0 {
                    return anyhow::Ok(text.get(9..12).unwrap_or("0").parse::<u16>()?);
                }
            }
            if n == 0 {
                anyhow::bail!("closed before a response");
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), exchange)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0)
}

/// Client address, port, host, extra header lines, expected status.
type Case<'a> = (IpAddr, u16, &'a str, Vec<&'a str>, u16);

/// Sends `n` requests per case and returns the cases whose statuses were not all the
/// expected one, with every status seen; also the number of 200s.
async fn run_cases(cases: &[Case<'_>], n: usize) -> (Vec<String>, u64) {
    let mut wrong = Vec::new();
    let mut ok = 0;
    for (from, port, host, headers, want) in cases {
        let mut seen = Vec::new();
        for _ in 0..n {
            let s = status_from(*from, *port, host, headers).await;
            if s == 200 {
                ok += 1;
            }
            seen.push(s);
        }
        if seen.iter().any(|s| s != want) {
            wrong.push(format!(
                "{from} :{port} {host} {headers:?}: want {want}, got {seen:?}"
            ));
        }
    }
    (wrong, ok)
}

const IP_POLICIES: &str = "apiVersion: ballast.dev/v1alpha1
kind: SecurityPolicy
metadata: { name: edge-ip }
spec:
  targetRefs:
  - { group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: http }
  authorization:
    defaultAction: Allow
    rules:
    - { name: blocked, action: Deny, principal: { clientCIDRs: [127.0.0.2/32] } }
---
apiVersion: ballast.dev/v1alpha1
kind: SecurityPolicy
metadata: { name: app-ip }
spec:
  targetRefs:
  - { group: gateway.networking.k8s.io, kind: HTTPRoute, name: app, sectionName: main }
  authorization:
    rules:                      # defaultAction: Deny
    - { action: Allow, principal: { clientCIDRs: [\"127.0.0.2\"] } }
---
apiVersion: ballast.dev/v1alpha1
kind: SecurityPolicy
metadata: { name: proxied-ip }
spec:
  targetRefs:
  - { group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: proxied }
  authorization:
    defaultAction: Allow
    rules:
    - { action: Deny, principal: { clientCIDRs: [203.0.113.0/24] } }
---
apiVersion: ballast.dev/v1alpha1
kind: ClientPolicy
metadata: { name: behind-lb }
spec:
  targetRefs:   # one trusted proxy in front of listener proxied
  - { group: gateway.networking.k8s.io, kind: Gateway, name: edge, sectionName: proxied }
  clientIPDetection: { xForwardedFor: { numTrustedHops: 1 } }
";

async fn debug_sources(ballast: &Ballast) -> serde_json::Value {
    let (_, body) = ballast.get("/debug/sources").await.unwrap();
    serde_json::from_str(&body).unwrap()
}

/// The listener policy (deny 127.0.0.2) applies to routes on listener `http`; the rule
/// policy of route `app` (allow only 127.0.0.2) beats it on every listener; listener
/// `plain` without a policy lets everyone through. A spoofed `X-Forwarded-For` does not
/// change the client address (no ClientPolicy trusts it); on listener `proxied`, whose
/// ClientPolicy trusts one hop, the rules match the last `X-Forwarded-For` entry. Every status is counted: each
/// case's requests all get the expected status, and only the 200s reach the backend. A
/// broken edit (bad CIDR) is reported by file:line:col and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_rules_allow_deny_and_most_specific_wins() {
    let up = Upstream::start("app").await.unwrap();
    let (p1, p2, p3) = (
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
        ballast_testkit::free_port(),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        gateway3(p1, p2, p3)
            + &named_rule_route("app", "app.example.com", "app")
            + &named_rule_route("open", "open.example.com", "app")
            + &backend("app", &[up.addr()]),
    )
    .unwrap();
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(&policy_file, IP_POLICIES).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-ip",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    wait_for(T, POLL, || async {
        match (
            status_from(A, p1, "open.example.com", &[]).await,
            status_from(B, p1, "open.example.com", &[]).await,
        ) {
            (200, 403) => Ok(()),
            s => anyhow::bail!("open from A, B: {s:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));

    let spoof = || vec!["X-Forwarded-For: 127.0.0.1"];
    let cases: &[Case<'_>] = &[
        (A, p1, "open.example.com", vec![], 200),
        (B, p1, "open.example.com", vec![], 403),
        (B, p1, "open.example.com", spoof(), 403),
        (B, p1, "app.example.com", vec![], 200),
        (A, p1, "app.example.com", vec![], 403),
        (A, p1, "app.example.com", spoof(), 403),
        (A, p2, "app.example.com", vec![], 403),
        (B, p2, "app.example.com", vec![], 200),
        (A, p2, "open.example.com", vec![], 200),
        (B, p2, "open.example.com", vec![], 200),
        // Behind one trusted proxy the client is the last X-Forwarded-For entry.
        (
            A,
            p3,
            "open.example.com",
            vec!["X-Forwarded-For: 203.0.113.9"],
            403,
        ),
        (
            A,
            p3,
            "open.example.com",
            vec!["X-Forwarded-For: 203.0.113.9, 198.51.100.1"],
            200,
        ),
        (
            A,
            p3,
            "open.example.com",
            vec!["X-Forwarded-For: 198.51.100.1, 203.0.113.9"],
            403,
        ),
        (A, p3, "open.example.com", vec![], 200),
    ];
    let check = || async {
        let before = up.hits();
        let (wrong, ok) = run_cases(cases, 10).await;
        assert!(wrong.is_empty(), "{wrong:#?}\n{}", envoy.log_tail(30));
        assert_eq!(
            up.hits() - before,
            ok,
            "only allowed requests reach the backend"
        );
        assert_eq!(ok, 70);
    };
    check().await;

    let v = debug_sources(&ballast).await;
    let policies = &v["status"]["securityPolicies"];
    let text = policies.to_string();
    assert!(
        text.contains("\"name\":\"app-ip\"") && text.contains("\"sectionName\":\"main\""),
        "{text}"
    );
    for p in policies.as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["conditions"][0]["status"], "True", "{p}");
        }
    }

    // A broken edit: denying 127.0.0.1 with an invalid CIDR. Nothing changes.
    let broken = IP_POLICIES.replace(
        "clientCIDRs: [127.0.0.2/32]",
        "clientCIDRs: [127.0.0.1/32, 127.0.0.300/32]",
    );
    write_atomic(&policy_file, &broken);
    let errors = wait_for(T, POLL, || async {
        let v = debug_sources(&ballast).await;
        let errors = v["sources"][0]["errors"].to_string();
        if errors.contains("policy.yaml:") {
            Ok(errors)
        } else {
            anyhow::bail!("no error yet")
        }
    })
    .await
    .unwrap();
    assert!(
        errors.contains("policy.yaml:10:")
            && errors.contains("clientCIDRs[1]")
            && errors.contains("127.0.0.300"),
        "{errors}"
    );
    check().await;
}

fn indent(text: &str, by: usize) -> String {
    text.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(by)))
        .collect()
}

fn jwt_config(port: u16, jwks_cm: &str, inline: &str) -> (String, String) {
    let main = gateway(port)
        + &named_rule_route("api", "api.example.com", "app")
        + &named_rule_route("open", "open.example.com", "app");
    let policy = format!(
        "apiVersion: ballast.dev/v1alpha1
kind: SecurityPolicy
metadata: {{ name: api-jwt }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: api }}]
  jwt:
    providers:
    - name: main
      issuer: https://issuer.test
      audiences: [ballast]
      localJWKS: {{ type: ValueRef, valueRef: {{ kind: ConfigMap, name: jwks }} }}
      claimToHeaders: [{{ claim: sub, header: x-user }}]
    - name: partner
      issuer: https://partner.test
      localJWKS:
        inline: '{inline}'
---
apiVersion: v1
kind: ConfigMap
metadata: {{ name: jwks }}
data:
{jwks_cm}"
    );
    (main, policy)
}

/// `jwt` on route `api` (providers from a ConfigMap and inline): no token 401, a valid token
/// 200 with its `sub` in `x-user` at the backend (a client-sent `x-user` is replaced),
/// expired / wrong issuer / unknown key 401, wrong audience 403 (Envoy's choice), and route `open` without a
/// policy 200 without token. Removing the ConfigMap key fails closed for that provider only
/// and is reported as `ResolvedRefs=False` with the reference's file:line:col.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_authenticates_and_forwards_claims() {
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let main_key = JwtSigner::generate("main-1");
    let partner_key = JwtSigner::generate("partner-1");
    let stranger = JwtSigner::generate("main-1"); // same kid, other key
    let dir = tempfile::tempdir().unwrap();
    let cm = format!("  jwks: |\n{}", indent(&main_key.jwks(), 4));
    let (main, policy) = jwt_config(port, &cm, &partner_key.jwks());
    std::fs::write(
        dir.path().join("config.yaml"),
        main + &backend("app", &[up.addr()]),
    )
    .unwrap();
    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(&policy_file, &policy).unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-jwt",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let now = unix_now();
    let claims = |iss: &str, aud: &str, exp: u64| serde_json::json!({ "iss": iss, "aud": aud, "sub": "alice", "iat": now - 10, "exp": exp });
    let valid = main_key.sign(&claims("https://issuer.test", "ballast", now + 3600));
    let bearer = |t: &str| format!("Authorization: Bearer {t}");
    let good = bearer(&valid);
    wait_for(T, POLL, || async {
        match (
            status_from(A, port, "api.example.com", &[]).await,
            status_from(A, port, "api.example.com", &[&good]).await,
        ) {
            (401, 200) => Ok(()),
            s => anyhow::bail!("api without, with token: {s:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));

    // Beyond Envoy's default 60 s clock skew allowance.
    let expired = bearer(&main_key.sign(&claims("https://issuer.test", "ballast", now - 600)));
    let wrong_iss = bearer(&main_key.sign(&claims("https://evil.test", "ballast", now + 3600)));
    let wrong_aud = bearer(&main_key.sign(&claims("https://issuer.test", "other", now + 3600)));
    let unknown = bearer(&stranger.sign(&claims("https://issuer.test", "ballast", now + 3600)));
    let partner = bearer(&partner_key.sign(&claims("https://partner.test", "any", now + 3600)));
    let spoofed_user = vec![good.as_str(), "x-user: mallory"];
    let cases: Vec<Case<'_>> = vec![
        (A, port, "api.example.com", vec![], 401),
        (A, port, "api.example.com", vec![good.as_str()], 200),
        (A, port, "api.example.com", spoofed_user.clone(), 200),
        (A, port, "api.example.com", vec![expired.as_str()], 401),
        (A, port, "api.example.com", vec![wrong_iss.as_str()], 401),
        // Envoy: a verified token for another audience is forbidden, not unauthenticated.
        (A, port, "api.example.com", vec![wrong_aud.as_str()], 403),
        (A, port, "api.example.com", vec![unknown.as_str()], 401),
        (A, port, "api.example.com", vec![partner.as_str()], 200),
        (A, port, "open.example.com", vec![], 200),
    ];
    let before = up.hits();
    let (wrong, ok) = run_cases(&cases, 5).await;
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", envoy.log_tail(30));
    assert_eq!(
        up.hits() - before,
        ok,
        "only authenticated requests reach the backend"
    );
    assert_eq!(ok, 20);
    // The last api request was the partner's; check the claim header with alice's token.
    assert_eq!(
        status_from(A, port, "api.example.com", &spoofed_user).await,
        200
    );
    assert_eq!(up.last_header("x-user").as_deref(), Some("alice"));

    // The ConfigMap loses its key: tokens of that provider fail (closed), the inline one works.
    let (_, policy2) = jwt_config(port, "  other: x\n", &partner_key.jwks());
    write_atomic(&policy_file, &policy2);
    wait_for(T, POLL, || async {
        match status_from(A, port, "api.example.com", &[&good]).await {
            401 => Ok(()),
            s => anyhow::bail!("still {s}"),
        }
    })
    .await
    .unwrap();
    let (wrong, _) = run_cases(
        &[
            (A, port, "api.example.com", vec![good.as_str()], 401),
            (A, port, "api.example.com", vec![partner.as_str()], 200),
            (A, port, "open.example.com", vec![], 200),
        ],
        5,
    )
    .await;
    assert!(wrong.is_empty(), "{wrong:#?}");
    let v = debug_sources(&ballast).await;
    let p = &v["status"]["securityPolicies"][0]["targets"][0]["conditions"][1];
    assert_eq!(p["type"], "ResolvedRefs", "{p}");
    assert_eq!(p["status"], "False", "{p}");
    let msg = p["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("policy.yaml:11:") && msg.contains("has no key \"jwks\""),
        "{msg}"
    );
}

/// A loopback HTTP server answering each request with `respond(request head)` (a whole
/// HTTP/1.1 response), recording request heads.
struct JsonServer {
    addr: std::net::SocketAddr,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl JsonServer {
    /// Answers every request with `body` as JSON.
    async fn start(body: String) -> JsonServer {
        Self::start_with(move |_| {
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        })
        .await
    }

    async fn start_with(respond: impl Fn(&str) -> String + Send + Sync + 'static) -> JsonServer {
        let respond = std::sync::Arc::new(respond);
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let seen = seen.clone();
                let respond = respond.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).to_string();
                    let resp = respond(&head);
                    seen.lock().unwrap().push(head);
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        JsonServer {
            addr,
            requests,
            task,
        }
    }
}

impl Drop for JsonServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `remoteJWKS`: Envoy fetches the keys from a Backend (a loopback JSON server) with the
/// URL's host and path; a token signed with them gets 200, none 401, another key's 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_jwks_are_fetched_from_a_backend() {
    let up = Upstream::start("app").await.unwrap();
    let key = JwtSigner::generate("remote-1");
    let other = JwtSigner::generate("remote-1");
    let keys = JsonServer::start(key.jwks()).await;
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        gateway(port)
            + &named_rule_route("api", "api.example.com", "app")
            + &backend("app", &[up.addr()])
            + &backend("keys", &[keys.addr])
            + "---
apiVersion: ballast.dev/v1alpha1
kind: SecurityPolicy
metadata: { name: remote }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: api }]
  jwt:
    providers:
    - name: idp
      issuer: https://idp.test
      remoteJWKS:
        uri: http://keys.test/.well-known/jwks.json
        backendRefs: [{ group: ballast.dev, kind: Backend, name: keys }]
",
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-remote-jwks",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let now = unix_now();
    let claims = serde_json::json!({ "iss": "https://idp.test", "sub": "bob", "exp": now + 3600 });
    let good = format!("Authorization: Bearer {}", key.sign(&claims));
    let bad = format!("Authorization: Bearer {}", other.sign(&claims));
    wait_for(T, POLL, || async {
        match status_from(A, port, "api.example.com", &[&good]).await {
            200 => Ok(()),
            s => anyhow::bail!("status {s}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    let cases: Vec<Case<'_>> = vec![
        (A, port, "api.example.com", vec![good.as_str()], 200),
        (A, port, "api.example.com", vec![], 401),
        (A, port, "api.example.com", vec![bad.as_str()], 401),
    ];
    let before = up.hits();
    let (wrong, ok) = run_cases(&cases, 5).await;
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", envoy.log_tail(30));
    assert_eq!(ok, 5);
    assert_eq!(up.hits() - before, 5);
    let requests = keys.requests.lock().unwrap().clone();
    assert!(!requests.is_empty());
    let first = requests[0].to_ascii_lowercase();
    assert!(
        first.starts_with("get /.well-known/jwks.json ") && first.contains("host: keys.test"),
        "{first}"
    );
}

/// `extAuth`: Envoy asks a loopback authorization service (allow when the request carries
/// `x-allow: yes`, answering `x-authz-user`) before route `api`: allowed requests get 200 and
/// the backend sees the service's `x-authz-user`; others get the service's 403 and never reach
/// the backend; route `open` without a policy is not checked. Every status is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_auth_asks_an_http_service() {
    let up = Upstream::start("app").await.unwrap();
    let authz = JsonServer::start_with(|head| {
        if head.to_ascii_lowercase().contains("\r\nx-allow: yes\r\n") {
            "HTTP/1.1 200 OK\r\nx-authz-user: checked\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
        } else {
            "HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\nConnection: close\r\n\r\ndenied".to_owned()
        }
    })
    .await;
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        gateway(port)
            + &named_rule_route("api", "api.example.com", "app")
            + &named_rule_route("open", "open.example.com", "app")
            + &backend("app", &[up.addr()])
            + &backend("authz", &[authz.addr])
            + "---
apiVersion: ballast.dev/v1alpha1
kind: SecurityPolicy
metadata: { name: ext }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: api }]
  extAuth:
    headersToExtAuth: [x-allow]
    http:
      backendRefs: [{ group: ballast.dev, kind: Backend, name: authz }]
      path: /check
      headersToBackend: [x-authz-user]
",
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-ext-auth",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    wait_for(T, POLL, || async {
        match (
            status_from(A, port, "api.example.com", &["x-allow: yes"]).await,
            status_from(A, port, "api.example.com", &[]).await,
        ) {
            (200, 403) => Ok(()),
            s => anyhow::bail!("allowed, denied: {s:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    let checks_before = authz.requests.lock().unwrap().len();
    let cases: Vec<Case<'_>> = vec![
        (A, port, "api.example.com", vec!["x-allow: yes"], 200),
        (A, port, "api.example.com", vec![], 403),
        (A, port, "api.example.com", vec!["x-allow: no"], 403),
        (A, port, "open.example.com", vec![], 200),
    ];
    let before = up.hits();
    let (wrong, ok) = run_cases(&cases, 5).await;
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", envoy.log_tail(30));
    assert_eq!(ok, 10);
    assert_eq!(
        up.hits() - before,
        10,
        "denied requests never reach the backend"
    );
    let requests = authz.requests.lock().unwrap().clone();
    assert_eq!(
        requests.len() - checks_before,
        15,
        "one check per api request, none for open"
    );
    assert!(
        requests.last().unwrap().starts_with("GET /check/ "),
        "{}",
        requests.last().unwrap()
    );
    assert_eq!(
        status_from(A, port, "api.example.com", &["x-allow: yes"]).await,
        200
    );
    assert_eq!(up.last_header("x-authz-user").as_deref(), Some("checked"));
}

/// A SecurityPolicy named `name` on HTTPRoute `route` with `ext_auth` (YAML lines under
/// `extAuth:`, indented four spaces).
fn ext_auth_policy(name: &str, route: &str, ext_auth: &str) -> String {
    format!(
        "---
apiVersion: ballast.dev/v1alpha1
kind: SecurityPolicy
metadata: {{ name: {name} }}
spec:
  targetRefs: [{{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: {route} }}]
  extAuth:
{ext_auth}"
    )
}

/// Whether connecting to `addr` is refused (nothing listens there any more).
async fn refused(addr: std::net::SocketAddr) -> anyhow::Result<()> {
    match tokio::net::TcpStream::connect(addr).await {
        Err(_) => Ok(()),
        Ok(_) => anyhow::bail!("{addr} still accepts connections"),
    }
}

/// `extAuth.grpc` and `failOpen`: routes with a policy each: gRPC (the testkit's
/// `ExtAuthzServer`, allowing `x-allow: yes`) failing closed and failing open, HTTP (a
/// loopback service with the same rule) failing closed and failing open, and one more
/// fail-closed route per service type asking a second service (policies sharing a filter
/// still reach their own service). With the services up every route allows `x-allow: yes`
/// (the backend sees the gRPC service's `x-auth-user`, replacing the client's) and denies the
/// rest with 403, one check per request at the right service. With the first two services
/// stopped (port closed), the fail-closed routes answer 403 whatever the client sends and the
/// fail-open routes 200, marked `x-envoy-auth-failure-mode-allowed: true` at the backend, and
/// no check reaches anyone. Every status is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_auth_grpc_and_fail_open() {
    let up = Upstream::start("app").await.unwrap();
    let mut grpc_authz = ballast_testkit::ExtAuthzServer::start().await.unwrap();
    let grpc_authz_b = ballast_testkit::ExtAuthzServer::start().await.unwrap();
    let http_service = || {
        JsonServer::start_with(|head| {
            if head.to_ascii_lowercase().contains("\r\nx-allow: yes\r\n") {
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
            } else {
                "HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\nConnection: close\r\n\r\ndenied"
                    .to_owned()
            }
        })
    };
    let http_authz = http_service().await;
    let http_authz_b = http_service().await;
    let (grpc_addr, http_addr) = (grpc_authz.addr(), http_authz.addr);
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    let grpc =
        "    grpc: { backendRefs: [{ group: ballast.dev, kind: Backend, name: authz-grpc }] }\n";
    let http = "    headersToExtAuth: [x-allow]\n    http: { backendRefs: [{ group: ballast.dev, kind: Backend, name: authz-http }] }\n";
    let open = "    failOpen: true\n";
    let (grpc_b, http_b) = (
        grpc.replace("authz-grpc", "authz-grpc-b"),
        http.replace("authz-http", "authz-http-b"),
    );
    std::fs::write(
        dir.path().join("config.yaml"),
        gateway(port)
            + &named_rule_route("grpc-closed", "gc.example.com", "app")
            + &named_rule_route("grpc-open", "go.example.com", "app")
            + &named_rule_route("http-closed", "hc.example.com", "app")
            + &named_rule_route("http-open", "ho.example.com", "app")
            + &named_rule_route("grpc-closed-b", "gb.example.com", "app")
            + &named_rule_route("http-closed-b", "hb.example.com", "app")
            + &backend("app", &[up.addr()])
            + &backend("authz-grpc", &[grpc_addr])
            + "  protocol: grpc\n"
            + &backend("authz-http", &[http_addr])
            + &backend("authz-grpc-b", &[grpc_authz_b.addr()])
            + "  protocol: grpc\n"
            + &backend("authz-http-b", &[http_authz_b.addr])
            + &ext_auth_policy("grpc-closed-b", "grpc-closed-b", &grpc_b)
            + &ext_auth_policy("http-closed-b", "http-closed-b", &http_b)
            + &ext_auth_policy("grpc-closed", "grpc-closed", grpc)
            + &ext_auth_policy("grpc-open", "grpc-open", &format!("{open}{grpc}"))
            + &ext_auth_policy("http-closed", "http-closed", http)
            + &ext_auth_policy("http-open", "http-open", &format!("{open}{http}")),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-ext-auth-grpc",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let allow = "x-allow: yes";
    wait_for(T, POLL, || async {
        let mut seen = Vec::new();
        for host in ["gc", "go", "hc", "ho", "gb", "hb"] {
            let host = format!("{host}.example.com");
            seen.push(status_from(A, port, &host, &[allow]).await);
            seen.push(status_from(A, port, &host, &[]).await);
        }
        match seen.as_slice() {
            [200, 403, 200, 403, 200, 403, 200, 403, 200, 403, 200, 403] => Ok(()),
            s => anyhow::bail!("allowed, denied per route: {s:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));

    // Both services up: the policy's service decides, whatever the failure mode.
    let (grpc_before, grpc_b_before, http_before, http_b_before, hits_before) = (
        (grpc_authz.allowed(), grpc_authz.denied()),
        (grpc_authz_b.allowed(), grpc_authz_b.denied()),
        http_authz.requests.lock().unwrap().len(),
        http_authz_b.requests.lock().unwrap().len(),
        up.hits(),
    );
    let mut cases: Vec<Case<'_>> = Vec::new();
    for host in [
        "gc.example.com",
        "go.example.com",
        "hc.example.com",
        "ho.example.com",
        "gb.example.com",
        "hb.example.com",
    ] {
        cases.push((A, port, host, vec![allow], 200));
        cases.push((A, port, host, vec![], 403));
        cases.push((A, port, host, vec!["x-allow: no"], 403));
    }
    let (wrong, ok) = run_cases(&cases, 5).await;
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", envoy.log_tail(30));
    assert_eq!(ok, 30);
    assert_eq!(
        up.hits() - hits_before,
        30,
        "denied requests never reach it"
    );
    assert_eq!(
        (
            grpc_authz.allowed() - grpc_before.0,
            grpc_authz.denied() - grpc_before.1
        ),
        (10, 20),
        "one gRPC check per request of gc and go"
    );
    assert_eq!(
        http_authz.requests.lock().unwrap().len() - http_before,
        30,
        "one HTTP check per request of hc and ho"
    );
    assert_eq!(
        (
            grpc_authz_b.allowed() - grpc_b_before.0,
            grpc_authz_b.denied() - grpc_b_before.1
        ),
        (5, 10),
        "gb's checks go to its own service"
    );
    assert_eq!(
        http_authz_b.requests.lock().unwrap().len() - http_b_before,
        15,
        "hb's checks go to its own service"
    );
    assert_eq!(
        status_from(A, port, "gc.example.com", &[allow, "x-auth-user: mallory"]).await,
        200
    );
    assert_eq!(
        up.last_header("x-auth-user").as_deref(),
        Some("grpc-checked")
    );
    assert_eq!(up.last_header("x-envoy-auth-failure-mode-allowed"), None);

    // The services of gc, go, hc and ho stopped: fail closed answers 403, fail open lets
    // everything through.
    grpc_authz.stop().await.unwrap();
    drop(http_authz);
    for addr in [grpc_addr, http_addr] {
        wait_for(T, POLL, || refused(addr)).await.unwrap();
    }
    let checks_stopped = grpc_authz.checks();
    wait_for(T, POLL, || async {
        match (
            status_from(A, port, "gc.example.com", &[allow]).await,
            status_from(A, port, "go.example.com", &[]).await,
        ) {
            (403, 200) => Ok(()),
            s => anyhow::bail!("grpc-closed allowed, grpc-open denied: {s:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    let hits_before = up.hits();
    let cases: Vec<Case<'_>> = vec![
        (A, port, "gc.example.com", vec![allow], 403),
        (A, port, "gc.example.com", vec![], 403),
        (A, port, "go.example.com", vec![allow], 200),
        (A, port, "go.example.com", vec![], 200),
        (A, port, "hc.example.com", vec![allow], 403),
        (A, port, "hc.example.com", vec![], 403),
        (A, port, "ho.example.com", vec![allow], 200),
        (A, port, "ho.example.com", vec![], 200),
    ];
    let (wrong, ok) = run_cases(&cases, 5).await;
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", envoy.log_tail(30));
    assert_eq!(ok, 20);
    assert_eq!(
        up.hits() - hits_before,
        20,
        "only the fail-open routes reach it"
    );
    assert_eq!(
        grpc_authz.checks(),
        checks_stopped,
        "a stopped service answers nothing"
    );
    assert_eq!(
        up.last_header("x-envoy-auth-failure-mode-allowed")
            .as_deref(),
        Some("true")
    );
    assert_eq!(status_from(A, port, "go.example.com", &[]).await, 200);
    assert_eq!(
        up.last_header("x-envoy-auth-failure-mode-allowed")
            .as_deref(),
        Some("true")
    );
    assert_eq!(up.last_header("x-auth-user"), None);
}

/// An `extAuth.grpc` Backend that does not exist: Envoy still takes the Gateway's config (a
/// route without a policy answers 200) and the policy's route fails closed (403), while the
/// policy reports `ResolvedRefs=False`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_auth_grpc_backend_missing_fails_closed() {
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        gateway(port)
            + &named_rule_route("guarded", "guarded.example.com", "app")
            + &named_rule_route("open", "open.example.com", "app")
            + &backend("app", &[up.addr()])
            + &ext_auth_policy(
                "guarded",
                "guarded",
                "    grpc: { backendRefs: [{ group: ballast.dev, kind: Backend, name: nowhere }] }\n",
            ),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-ext-auth-missing",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    wait_for(T, POLL, || async {
        match status_from(A, port, "open.example.com", &[]).await {
            200 => Ok(()),
            s => anyhow::bail!("open: {s}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));
    let cases: Vec<Case<'_>> = vec![
        (A, port, "guarded.example.com", vec!["x-allow: yes"], 403),
        (A, port, "guarded.example.com", vec![], 403),
        (A, port, "open.example.com", vec![], 200),
    ];
    let before = up.hits();
    let (wrong, ok) = run_cases(&cases, 5).await;
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", envoy.log_tail(30));
    assert_eq!((ok, up.hits() - before), (5, 5));
    let sources = debug_sources(&ballast).await.to_string();
    assert!(sources.contains("nowhere"), "{sources}");
}

/// Four routes with a policy each: `places` reads tokens only from header `x-token`, header
/// `x-auth` after `Token `, cookie `session` and query parameter `jwt`; `opt` makes the token
/// optional; `claims` allows only tokens whose claims match (a Deny rule for `sub: mallory`
/// first, then team `red`, `roles` containing `admin` and scope `write`); `optc` is optional
/// with a claim rule. Every status is counted and only the 200s reach the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_extraction_optional_and_claims() {
    let up = Upstream::start("app").await.unwrap();
    let port = ballast_testkit::free_port();
    let key = JwtSigner::generate("k1");
    let other = JwtSigner::generate("k1"); // same kid, other key
    let jwks = key.jwks();
    let provider = |extra: &str| {
        format!(
            "    providers:\n    - name: idp\n      issuer: https://issuer.test\n      localJWKS: {{ inline: '{jwks}' }}\n{extra}"
        )
    };
    let policy = |name: &str, body: String| {
        format!(
            "---\napiVersion: ballast.dev/v1alpha1\nkind: SecurityPolicy\nmetadata: {{ name: {name} }}\nspec:\n  targetRefs: [{{ group: gateway.networking.k8s.io, kind: HTTPRoute, name: {name} }}]\n{body}"
        )
    };
    let team_rule = "    - action: Allow\n      principal: { jwt: { provider: idp, claims: [{ name: org.team, values: [red] }] } }\n";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        gateway(port)
            + &named_rule_route("places", "places.test", "app")
            + &named_rule_route("opt", "opt.test", "app")
            + &named_rule_route("claims", "claims.test", "app")
            + &named_rule_route("optc", "optc.test", "app")
            + &backend("app", &[up.addr()])
            + &policy(
                "places",
                "  jwt:\n".to_owned()
                    + &provider("      extractFrom:\n        headers: [{ name: x-token }, { name: x-auth, valuePrefix: 'Token ' }]\n        cookies: [session]\n        params: [jwt]\n"),
            )
            + &policy("opt", "  jwt:\n    optional: true\n".to_owned() + &provider(""))
            + &policy(
                "claims",
                "  jwt:\n".to_owned()
                    + &provider("")
                    + "  authorization:\n    rules:\n    - action: Deny\n      principal: { jwt: { provider: idp, claims: [{ name: sub, values: [mallory] }] } }\n    - action: Allow\n      principal:\n        jwt:\n          provider: idp\n          claims:\n          - { name: org.team, values: [red] }\n          - { name: roles, valueType: StringArray, values: [admin] }\n          scopes: [write]\n",
            )
            + &policy(
                "optc",
                "  jwt:\n    optional: true\n".to_owned()
                    + &provider("")
                    + "  authorization:\n    rules:\n"
                    + team_rule,
            ),
    )
    .unwrap();
    let ballast = Ballast::serve_ready(dir.path()).await;
    let envoy = Envoy::start(&EnvoyConfig::new(
        ballast.xds,
        "envoy-jwt-claims",
        "default/edge",
        AdsMode::Grpc,
    ))
    .await
    .unwrap();
    let now = unix_now();
    let token = |signer: &JwtSigner, sub: &str, team: &str, roles: &[&str], scope: &str| {
        signer.sign(&serde_json::json!({
            "iss": "https://issuer.test", "sub": sub, "exp": now + 3600,
            "org": { "team": team }, "roles": roles, "scope": scope,
        }))
    };
    let alice = token(&key, "alice", "red", &["dev", "admin"], "read write");
    let bearer = |t: &str| format!("Authorization: Bearer {t}");
    wait_for(T, POLL, || async {
        match (
            status_from(A, port, "places.test", &[&format!("x-token: {alice}")]).await,
            status_from(A, port, "optc.test", &[]).await,
        ) {
            (200, 403) => Ok(()),
            s => anyhow::bail!("places with x-token, optc without token: {s:?}"),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", envoy.log_tail(30)));

    let bad = token(&other, "alice", "red", &["admin"], "write");
    let bob = token(&key, "bob", "blue", &["admin"], "write");
    let carol = token(&key, "carol", "red", &["dev"], "write");
    let dave = token(&key, "dave", "red", &["admin"], "read");
    let mallory = token(&key, "mallory", "red", &["admin"], "write");
    let (x_token, x_auth, x_auth_bare, cookie, wrong_cookie, x_token_bearer) = (
        format!("x-token: {alice}"),
        format!("x-auth: Token {alice}"),
        format!("x-auth: {alice}"),
        format!("Cookie: theme=dark; session={alice}"),
        format!("Cookie: sid={alice}"),
        format!("x-token: Bearer {alice}"),
    );
    let (alice_b, bad_b, bob_b, carol_b, dave_b, mallory_b) = (
        bearer(&alice),
        bearer(&bad),
        bearer(&bob),
        bearer(&carol),
        bearer(&dave),
        bearer(&mallory),
    );
    // (host, path, headers, expected status)
    let cases: Vec<(&str, String, Vec<&str>, u16)> = vec![
        // Extraction: each configured place works, anywhere else the token is missing.
        ("places.test", "/".into(), vec![&x_token], 200),
        ("places.test", "/".into(), vec![&x_auth], 200),
        ("places.test", "/".into(), vec![&cookie], 200),
        ("places.test", format!("/?a=1&jwt={alice}"), vec![], 200),
        ("places.test", "/".into(), vec![&alice_b], 401),
        (
            "places.test",
            format!("/?access_token={alice}"),
            vec![],
            401,
        ),
        ("places.test", "/".into(), vec![&wrong_cookie], 401),
        ("places.test", "/".into(), vec![&x_auth_bare], 401),
        ("places.test", "/".into(), vec![&x_token_bearer], 401),
        ("places.test", "/".into(), vec![], 401),
        // Optional: none passes, a valid one passes, an invalid one does not.
        ("opt.test", "/".into(), vec![], 200),
        ("opt.test", "/".into(), vec![&alice_b], 200),
        ("opt.test", "/".into(), vec![&bad_b], 401),
        // Claims: all must match; the Deny rule comes first.
        ("claims.test", "/".into(), vec![&alice_b], 200),
        ("claims.test", "/".into(), vec![&bob_b], 403),
        ("claims.test", "/".into(), vec![&carol_b], 403),
        ("claims.test", "/".into(), vec![&dave_b], 403),
        ("claims.test", "/".into(), vec![&mallory_b], 403),
        ("claims.test", "/".into(), vec![], 401),
        ("claims.test", "/".into(), vec![&bad_b], 401),
        // Optional with a claim rule: no token is let in by jwt_authn, then denied by RBAC.
        ("optc.test", "/".into(), vec![], 403),
        ("optc.test", "/".into(), vec![&alice_b], 200),
        ("optc.test", "/".into(), vec![&bob_b], 403),
        ("optc.test", "/".into(), vec![&bad_b], 401),
    ];
    let before = up.hits();
    let mut wrong = Vec::new();
    let mut ok = 0;
    for (host, path, headers, want) in &cases {
        let mut seen = Vec::new();
        for _ in 0..3 {
            let s = status_path_from(A, port, host, path, headers).await;
            ok += u64::from(s == 200);
            seen.push(s);
        }
        if seen.iter().any(|s| s != want) {
            wrong.push(format!(
                "{host}{path} {headers:?}: want {want}, got {seen:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", envoy.log_tail(30));
    assert_eq!(ok, 3 * 8);
    assert_eq!(
        up.hits() - before,
        ok,
        "only allowed requests reach the backend"
    );
}
