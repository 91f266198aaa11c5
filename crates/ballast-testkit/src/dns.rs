//! A tiny authoritative DNS server on loopback UDP, for tests of hostname backends.
//!
//! Envoy resolves DNS clusters itself (c-ares), so a test that wants to move traffic by changing a
//! DNS answer needs a resolver it controls: [`DnsServer`] answers `A` and `AAAA` questions from a
//! name → addresses map the test edits at runtime ([`DnsServer::set`], [`DnsServer::remove`]),
//! with a fixed TTL. Names not in the map get `NXDOMAIN`; a known name without addresses of the
//! asked family gets an empty `NOERROR` answer (so a client falls back to the other family), and
//! any other question type gets an empty answer too. Hand-written (RFC 1035 §4) because the
//! subset is ~100 lines and a DNS server crate would bring far more than a test needs.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const RCODE_NXDOMAIN: u8 = 3;
const RCODE_FORMERR: u8 = 1;

struct Shared {
    records: Mutex<HashMap<String, Vec<IpAddr>>>,
    ttl: u32,
    queries: AtomicU64,
    /// Questions per name (lowercase, no trailing dot), to see that a client re-resolved.
    by_name: Mutex<HashMap<String, u64>>,
}

/// A DNS server on `127.0.0.1:<ephemeral>` (UDP); stopped on drop.
pub struct DnsServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl DnsServer {
    /// Starts a server whose answers carry `ttl_secs` as TTL.
    pub async fn start(ttl_secs: u32) -> Result<DnsServer> {
        let socket = UdpSocket::bind("127.0.0.1:0")
            .await
            .context("bind DNS server on 127.0.0.1:0")?;
        let addr = socket.local_addr()?;
        let shared = Arc::new(Shared {
            records: Mutex::new(HashMap::new()),
            ttl: ttl_secs,
            queries: AtomicU64::new(0),
            by_name: Mutex::new(HashMap::new()),
        });
        let task = tokio::spawn({
            let shared = shared.clone();
            async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                        continue;
                    };
                    if let Some(reply) = answer(&shared, &buf[..n]) {
                        let _ = socket.send_to(&reply, from).await;
                    }
                }
            }
        });
        Ok(DnsServer { addr, shared, task })
    }

    /// Where to send questions (give it to Envoy as its resolver).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers `name` with `addrs` from now on (replacing what it answered before).
    pub fn set(&self, name: &str, addrs: &[IpAddr]) {
        self.shared
            .records
            .lock()
            .unwrap()
            .insert(normalize(name), addrs.to_vec());
    }

    /// Answers `name` with `NXDOMAIN` from now on.
    pub fn remove(&self, name: &str) {
        self.shared.records.lock().unwrap().remove(&normalize(name));
    }

    /// Questions received so far (every name and type).
    pub fn queries(&self) -> u64 {
        self.shared.queries.load(Ordering::Relaxed)
    }

    /// Questions received so far for `name`.
    pub fn queries_for(&self, name: &str) -> u64 {
        self.shared
            .by_name
            .lock()
            .unwrap()
            .get(&normalize(name))
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn normalize(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The reply to one query datagram; `None` for what is not a query (nothing to answer).
fn answer(shared: &Shared, q: &[u8]) -> Option<Vec<u8>> {
    if q.len() < 12 || q[2] & 0x80 != 0 {
        return None; // too short, or a response
    }
    shared.queries.fetch_add(1, Ordering::Relaxed);
    let qdcount = u16::from_be_bytes([q[4], q[5]]);
    let Some((name, end)) = read_name(q, 12).filter(|_| qdcount == 1) else {
        return Some(header_only(q, RCODE_FORMERR));
    };
    if q.len() < end + 4 {
        return Some(header_only(q, RCODE_FORMERR));
    }
    let qtype = u16::from_be_bytes([q[end], q[end + 1]]);
    let qclass = u16::from_be_bytes([q[end + 2], q[end + 3]]);
    *shared
        .by_name
        .lock()
        .unwrap()
        .entry(name.clone())
        .or_default() += 1;
    let addrs = shared.records.lock().unwrap().get(&name).cloned();
    let question = &q[12..end + 4];
    let mut r = Vec::with_capacity(512);
    r.extend_from_slice(&q[0..2]); // id
    // QR, the query's opcode, AA, the query's RD; RA.
    r.push(0x80 | (q[2] & 0x78) | 0x04 | (q[2] & 0x01));
    let Some(addrs) = addrs else {
        r.push(0x80 | RCODE_NXDOMAIN);
        r.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
        r.extend_from_slice(question);
        return Some(r);
    };
    let records: Vec<IpAddr> = addrs
        .into_iter()
        .filter(|a| {
            qclass == CLASS_IN
                && match a {
                    IpAddr::V4(_) => qtype == TYPE_A,
                    IpAddr::V6(_) => qtype == TYPE_AAAA,
                }
        })
        .collect();
    r.push(0x80);
    r.extend_from_slice(&[0, 1]);
    r.extend_from_slice(&u16::try_from(records.len()).unwrap_or(0).to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 0]);
    r.extend_from_slice(question);
    for a in records {
        r.extend_from_slice(&[0xC0, 12]); // the question's name
        let (ty, data) = match a {
            IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
            IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
        };
        r.extend_from_slice(&ty.to_be_bytes());
        r.extend_from_slice(&CLASS_IN.to_be_bytes());
        r.extend_from_slice(&shared.ttl.to_be_bytes());
        r.extend_from_slice(&u16::try_from(data.len()).unwrap_or(0).to_be_bytes());
        r.extend_from_slice(&data);
    }
    Some(r)
}

/// A reply with no sections, just `rcode`.
fn header_only(q: &[u8], rcode: u8) -> Vec<u8> {
    let mut r = q[0..2].to_vec();
    r.push(0x80 | (q[2] & 0x79));
    r.push(0x80 | rcode);
    r.extend_from_slice(&[0; 8]);
    r
}

/// The (uncompressed: queries never compress) name at `at`, lowercase and dot-separated, and
/// where it ends.
fn read_name(p: &[u8], mut at: usize) -> Option<(String, usize)> {
    let mut labels: Vec<String> = Vec::new();
    loop {
        let len = usize::from(*p.get(at)?);
        at += 1;
        if len == 0 {
            return Some((labels.join(".").to_ascii_lowercase(), at));
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(p.get(at..at + len)?).into_owned());
        at += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
        let mut q = id.to_be_bytes().to_vec();
        q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        for l in name.split('.') {
            q.push(u8::try_from(l.len()).unwrap());
            q.extend_from_slice(l.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&CLASS_IN.to_be_bytes());
        q
    }

    async fn ask(server: &DnsServer, name: &str, qtype: u16) -> (u8, Vec<IpAddr>) {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        s.send_to(&query(7, name, qtype), server.addr())
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.recv(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let r = &buf[..n];
        assert_eq!(&r[0..2], &7u16.to_be_bytes());
        let ancount = u16::from_be_bytes([r[6], r[7]]);
        let (_, mut at) = read_name(r, 12).unwrap();
        at += 4;
        let mut out = Vec::new();
        for _ in 0..ancount {
            assert_eq!(&r[at..at + 2], &[0xC0, 12]);
            let len = usize::from(u16::from_be_bytes([r[at + 10], r[at + 11]]));
            let data = &r[at + 12..at + 12 + len];
            out.push(match len {
                4 => IpAddr::from(<[u8; 4]>::try_from(data).unwrap()),
                _ => IpAddr::from(<[u8; 16]>::try_from(data).unwrap()),
            });
            at += 12 + len;
        }
        (r[3] & 0x0F, out)
    }

    #[tokio::test]
    async fn answers_from_the_map_and_follows_changes() {
        let dns = DnsServer::start(1).await.unwrap();
        let v4: IpAddr = "127.0.0.2".parse().unwrap();
        let v6: IpAddr = "::1".parse().unwrap();
        dns.set("API.test.", &[v4, v6]);
        assert_eq!(ask(&dns, "api.test", TYPE_A).await, (0, vec![v4]));
        assert_eq!(ask(&dns, "Api.Test", TYPE_AAAA).await, (0, vec![v6]));
        // A known name, another type: empty NOERROR; an unknown name: NXDOMAIN.
        assert_eq!(ask(&dns, "api.test", 16 /* TXT */).await, (0, vec![]));
        assert_eq!(
            ask(&dns, "nope.test", TYPE_A).await,
            (RCODE_NXDOMAIN, vec![])
        );
        let other: IpAddr = "127.0.0.3".parse().unwrap();
        dns.set("api.test", &[other]);
        assert_eq!(ask(&dns, "api.test", TYPE_A).await, (0, vec![other]));
        dns.remove("api.test");
        assert_eq!(
            ask(&dns, "api.test", TYPE_A).await,
            (RCODE_NXDOMAIN, vec![])
        );
        assert_eq!(dns.queries(), 6);
        assert_eq!(dns.queries_for("api.test"), 5);
    }
}
