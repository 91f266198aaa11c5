//! A TCP relay whose connections can be cut on demand.
//!
//! Invariant 2 ("never empty by accident") is about what happens when Envoy's xDS stream breaks and comes
//! back, possibly to another control-plane replica. Putting a [`TcpProxy`] between Envoy and the control
//! plane lets a test break that stream at an exact moment ([`TcpProxy::cut_all`]), repeatedly, and choose
//! where the reconnect lands ([`TcpProxy::set_backends`], round-robin per accepted connection).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

#[derive(Default)]
struct Shared {
    backends: Mutex<Vec<SocketAddr>>,
    next: AtomicUsize,
    accepted: AtomicU64,
    next_id: AtomicU64,
    /// Live relays by id; a relay removes itself when it ends, [`TcpProxy::cut_all`] aborts them all.
    live: Mutex<HashMap<u64, AbortHandle>>,
}

/// A running relay on `127.0.0.1:<ephemeral>`; closes its listener and every relayed connection on drop.
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_task: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts relaying to `backends` (round-robin per connection). With no backends, accepted connections
    /// are closed immediately — like a control plane that is down but whose address still accepts.
    pub async fn start(backends: Vec<SocketAddr>) -> Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind tcp proxy on 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            backends: Mutex::new(backends),
            ..Shared::default()
        });
        let accept_task = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(TcpProxy {
            addr,
            shared,
            accept_task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the backends for *future* connections; live connections keep their backend until cut.
    pub fn set_backends(&self, backends: Vec<SocketAddr>) {
        *self.shared.backends.lock().expect("backends lock") = backends;
    }

    /// The current backends.
    pub fn backends(&self) -> Vec<SocketAddr> {
        self.shared.backends.lock().expect("backends lock").clone()
    }

    /// Abruptly closes every live relayed connection, on both sides (with a TCP reset where possible, so the
    /// peers notice at once rather than after a FIN exchange). Returns how many were cut.
    pub fn cut_all(&self) -> usize {
        let cut: Vec<AbortHandle> = self
            .shared
            .live
            .lock()
            .expect("live lock")
            .drain()
            .map(|(_, h)| h)
            .collect();
        for h in &cut {
            h.abort();
        }
        cut.len()
    }

    /// Connections accepted since start (including ones closed at once for lack of a reachable backend).
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections currently being relayed.
    pub fn live(&self) -> usize {
        self.shared.live.lock().expect("live lock").len()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.cut_all();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let backend = {
            let backends = shared.backends.lock().expect("backends lock");
            if backends.is_empty() {
                None
            } else {
                let i = shared.next.fetch_add(1, Ordering::SeqCst) % backends.len();
                Some(backends[i])
            }
        };
        let Some(backend) = backend else {
            let _ = client.set_zero_linger();
            drop(client);
            continue;
        };
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        // Register before the relay can finish, so its self-removal always finds its entry; the lock is
        // held across spawn so the entry exists before the task runs.
        {
            let mut live = shared.live.lock().expect("live lock");
            let shared2 = shared.clone();
            let task = tokio::spawn(async move {
                relay(client, backend).await;
                shared2.live.lock().expect("live lock").remove(&id);
            });
            live.insert(id, task.abort_handle());
        }
    }
}

/// Copies both ways until either side closes. Both sockets are owned by this future, so aborting it
/// closes both; zero linger turns that close into a reset.
async fn relay(mut client: TcpStream, backend: SocketAddr) {
    let _ = client.set_zero_linger();
    let _ = client.set_nodelay(true);
    // Bounded: a backend that neither accepts nor refuses must not pin the client forever.
    let connect = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(backend));
    let Ok(Ok(mut upstream)) = connect.await else {
        return;
    };
    let _ = upstream.set_zero_linger();
    let _ = upstream.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo_server(tag: &'static [u8]) -> (SocketAddr, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(tag).await.is_err()
                                    || s.write_all(&buf[..n]).await.is_err()
                                {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        (addr, task)
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
        s.write_all(msg).await.unwrap();
        let mut buf = vec![0u8; msg.len() + 1];
        s.read_exact(&mut buf).await.unwrap();
        buf
    }

    #[tokio::test]
    async fn round_robin_and_no_backends() {
        let (a, _ta) = echo_server(b"A").await;
        let (b, _tb) = echo_server(b"B").await;
        let proxy = TcpProxy::start(vec![a, b]).await.unwrap();
        let mut s1 = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut s2 = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s1, b"x").await, b"Ax");
        assert_eq!(roundtrip(&mut s2, b"y").await, b"By");
        assert_eq!(proxy.live(), 2);

        proxy.set_backends(vec![]);
        let mut s3 = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 1];
        // Closed at once: EOF or reset, never data.
        assert!(matches!(s3.read(&mut buf).await, Ok(0) | Err(_)));
        assert_eq!(proxy.connections_accepted(), 3);
    }
}
