//! `ballast status`: the connected proxies and their per-type sync state, as a
//! table, from the admin API.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

/// GET `path` from the admin server (plain HTTP/1.0; no client dependency),
/// with a bearer token when the admin API requires one.
pub fn admin_get_with(addr: SocketAddr, path: &str, token: Option<&str>) -> anyhow::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).with_context(|| {
        format!("connecting to the admin server at {addr} (is `ballast serve` running?)")
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("{path}: {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_string())
}

pub fn render(proxies: &Value) -> String {
    let types = ["SDS", "CDS", "EDS", "LDS", "RDS"];
    let mut rows = vec![{
        let mut h = vec!["NODE".to_string(), "GATEWAY".into(), "CONNECTED".into()];
        h.extend(types.iter().map(|t| t.to_string()));
        h
    }];
    let mut notes = Vec::new();
    for p in proxies["proxies"].as_array().into_iter().flatten() {
        let node = p["node"].as_str().unwrap_or("?").to_string();
        let mut row = vec![
            node.clone(),
            p["gateway"].as_str().unwrap_or("?").to_string(),
            if p["connected"].as_bool() == Some(true) {
                "yes".into()
            } else {
                "no (grace)".into()
            },
        ];
        // VHDS (Delta Envoys' virtual hosts) has no column, but its NACKs are listed.
        for t in types.iter().copied().chain(["VHDS"]) {
            let st = p["types"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["type"] == t));
            if t != "VHDS" {
                row.push(match st {
                    Some(x) => x["state"].as_str().unwrap_or("?").to_string(),
                    None => "-".to_string(),
                });
            }
            if let Some(nack) = st.and_then(|x| x.get("nack")).filter(|n| !n.is_null()) {
                notes.push(format!(
                    "{node} {t} NACK of {}: {}",
                    nack["version"].as_str().unwrap_or(""),
                    nack["message"].as_str().unwrap_or("")
                ));
            }
        }
        if let Some(w) = p["waiting"].as_str() {
            notes.push(format!("{node}: waiting: {w}"));
        }
        rows.push(row);
    }
    let mut out = columns(&rows);
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    // Refused by node-identity authorization (most recent last).
    for r in proxies["rejected"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "DENIED {}: {}\n",
            r["node"].as_str().unwrap_or("?"),
            r["message"].as_str().unwrap_or("")
        ));
    }
    out
}

/// `rows` (the first is the header) as left-aligned columns two spaces apart.
pub fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..n)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Lines about gateways the blast-radius guard holds, from `/debug/pipeline`,
/// saying what each was judged against.
pub fn render_guard(pipeline: &Value) -> String {
    let mut out = String::new();
    let gateways = pipeline["gateways"].as_object().into_iter().flatten();
    for (name, g) in gateways {
        let held = &g["held"];
        if held.is_null() {
            continue;
        }
        let origin = match held["origin"].as_str() {
            Some("restart") => "first snapshot after a restart, judged against the state file",
            _ => "live change",
        };
        out.push_str(&format!(
            "guard: gateway {name} held ({origin}): {}; applied after the settle period ({} ms) unless the source changes\n",
            held["reason"].as_str().unwrap_or("?"),
            held["settle_ms"].as_u64().unwrap_or(0),
        ));
    }
    if pipeline["guard"]["enabled"] == Value::Bool(false) {
        out.push_str("guard: off (--no-guard)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_rejections() {
        let v = serde_json::json!({"proxies": [], "rejected": [{"node": "evil",
            "message": "identity spiffe://ballast.local/ns/default/gw/a may not be served default/b"}]});
        let t = render(&v);
        assert!(
            t.contains("DENIED evil: identity spiffe://ballast.local/ns/default/gw/a may not be served default/b"),
            "{t}"
        );
    }

    #[test]
    fn renders_guard_holds_with_their_origin() {
        let v = serde_json::json!({
            "guard": {"enabled": true},
            "gateways": {
                "default/edge": {"held": {"reason": "would remove 80 of 100 routes", "origin": "restart", "settle_ms": 5000}},
                "default/other": {"held": {"reason": "would remove 3 of 4 clusters", "origin": "live", "settle_ms": 5000}},
                "default/calm": {"held": null}
            }
        });
        let t = render_guard(&v);
        assert!(t.contains("guard: gateway default/edge held (first snapshot after a restart, judged against the state file): would remove 80 of 100 routes"), "{t}");
        assert!(
            t.contains("guard: gateway default/other held (live change)"),
            "{t}"
        );
        assert!(!t.contains("calm"), "{t}");
        assert_eq!(
            render_guard(&serde_json::json!({"guard": {"enabled": false}, "gateways": {}})),
            "guard: off (--no-guard)\n"
        );
    }

    #[test]
    fn renders_table_with_nacks() {
        let v = serde_json::json!({"proxies": [{
            "node": "envoy-1", "gateway": "default/edge", "connected": true, "waiting": null,
            "types": [{"type": "CDS", "state": "SYNCED"}, {"type": "LDS", "state": "ERROR",
                       "nack": {"version": "v2", "message": "bad listener"}}]
        }]});
        let t = render(&v);
        assert!(
            t.starts_with("NODE     GATEWAY       CONNECTED  SDS  CDS     EDS  LDS    RDS"),
            "{t}"
        );
        assert!(
            t.contains("envoy-1  default/edge  yes        -    SYNCED  -    ERROR  -"),
            "{t}"
        );
        assert!(t.contains("envoy-1 LDS NACK of v2: bad listener"), "{t}");
    }
}
