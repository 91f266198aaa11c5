//! A WebSocket echo upstream and a one-message client, to prove upgrades pass through Envoy.
//!
//! Hand-written (RFC 6455 handshake and unfragmented frames, SHA-1 included) rather than a
//! WebSocket crate: tests need one text message each way, and the handshake is checked end to
//! end (the client verifies `Sec-WebSocket-Accept`).

use std::net::SocketAddr;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A WebSocket server on `127.0.0.1:<ephemeral>` that echoes every frame; stopped on drop.
pub struct WsEcho {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl WsEcho {
    pub async fn start() -> Result<WsEcho> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    Ok((s, _)) = listener.accept() => {
                        conns.spawn(async move { let _ = serve(s).await; });
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(WsEcho { addr, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for WsEcho {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_head(s: &mut TcpStream) -> Result<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await? == 0 {
            bail!("connection closed in the HTTP head");
        }
        buf.push(byte[0]);
        if buf.len() > 64 * 1024 {
            bail!("HTTP head too long");
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

async fn serve(mut s: TcpStream) -> Result<()> {
    let head = read_head(&mut s).await?;
    let key = header(&head, "sec-websocket-key").context("no Sec-WebSocket-Key")?;
    if !header(&head, "upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket")) {
        s.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            .await?;
        return Ok(());
    }
    let resp = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
        accept(key)
    );
    s.write_all(resp.as_bytes()).await?;
    loop {
        let (opcode, payload) = read_frame(&mut s).await?;
        if opcode == 0x8 {
            write_frame(&mut s, 0x8, &payload, None).await?;
            return Ok(());
        }
        write_frame(&mut s, opcode, &payload, None).await?;
    }
}

/// Upgrades a connection to `addr` (`Host: host`, `GET path`), sends `msg` as a text frame and
/// returns the text echoed back. Fails unless the answer is `101` with the right accept key.
pub async fn ws_echo_roundtrip(
    addr: SocketAddr,
    host: &str,
    path: &str,
    msg: &str,
) -> Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let head =
        tokio::time::timeout(std::time::Duration::from_secs(10), read_head(&mut s)).await??;
    if !head.starts_with("HTTP/1.1 101") {
        bail!("no upgrade: {}", head.lines().next().unwrap_or(""));
    }
    if header(&head, "sec-websocket-accept") != Some(accept(key).as_str()) {
        bail!("bad Sec-WebSocket-Accept in {head:?}");
    }
    write_frame(&mut s, 0x1, msg.as_bytes(), Some([1, 2, 3, 4])).await?;
    let (opcode, payload) =
        tokio::time::timeout(std::time::Duration::from_secs(10), read_frame(&mut s)).await??;
    if opcode != 0x1 {
        bail!("expected a text frame, got opcode {opcode}");
    }
    write_frame(&mut s, 0x8, &[], Some([5, 6, 7, 8])).await?;
    Ok(String::from_utf8(payload)?)
}

async fn read_frame(s: &mut TcpStream) -> Result<(u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    s.read_exact(&mut h).await?;
    let opcode = h[0] & 0x0f;
    let masked = h[1] & 0x80 != 0;
    let len = match h[1] & 0x7f {
        126 => u64::from(s.read_u16().await?),
        127 => s.read_u64().await?,
        n => u64::from(n),
    };
    if len > 1 << 20 {
        bail!("frame too large");
    }
    let mut mask = [0u8; 4];
    if masked {
        s.read_exact(&mut mask).await?;
    }
    let mut payload = vec![0u8; len as usize];
    s.read_exact(&mut payload).await?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Ok((opcode, payload))
}

async fn write_frame(
    s: &mut TcpStream,
    opcode: u8,
    payload: &[u8],
    mask: Option<[u8; 4]>,
) -> Result<()> {
    let mut out = vec![0x80 | opcode];
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(m | n as u8),
        n if n <= usize::from(u16::MAX) => {
            out.push(m | 126);
            out.extend((n as u16).to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend((n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(k) => {
            out.extend(k);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ k[i % 4]));
        }
        None => out.extend_from_slice(payload),
    }
    s.write_all(&out).await?;
    Ok(())
}

/// `Sec-WebSocket-Accept` for `key`: base64(SHA-1(key + GUID)).
fn accept(key: &str) -> String {
    base64(&sha1(format!("{key}{GUID}").as_bytes()))
}

fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend(bit_len.to_be_bytes());
    for chunk in msg.chunks(64) {
        let mut w = [0u32; 80];
        for i in 0..16 {
            w[i] = u32::from_be_bytes([
                chunk[4 * i],
                chunk[4 * i + 1],
                chunk[4 * i + 2],
                chunk[4 * i + 3],
            ]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A827999),
                20..=39 => (b ^ c ^ d, 0x6ED9EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1BBCDC),
                _ => (b ^ c ^ d, 0xCA62C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc6455_accept_key() {
        // The example of RFC 6455 §1.3.
        assert_eq!(
            accept("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert_eq!(base64(b"ab"), "YWI=");
    }

    #[tokio::test]
    async fn echoes_directly() {
        let ws = WsEcho::start().await.unwrap();
        let got = ws_echo_roundtrip(ws.addr(), "x", "/", "hello")
            .await
            .unwrap();
        assert_eq!(got, "hello");
    }
}
