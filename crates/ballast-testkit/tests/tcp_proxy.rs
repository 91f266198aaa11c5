//! `TcpProxy::cut_all` really closes both sides of live connections.

use std::time::Duration;

use ballast_testkit::{TcpProxy, wait_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test]
async fn forwards_and_cut_all_closes_both_sides() {
    // Echo server that reports when its side of a connection ends.
    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            let closed_tx = closed_tx.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 256];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = closed_tx.send(());
            });
        }
    });

    let proxy = TcpProxy::start(vec![echo_addr]).await.unwrap();
    let mut clients = Vec::new();
    for i in 0..3u8 {
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        c.write_all(&[i; 4]).await.unwrap();
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, [i; 4]);
        clients.push(c);
    }
    assert_eq!(proxy.live(), 3);
    assert_eq!(proxy.connections_accepted(), 3);

    assert_eq!(proxy.cut_all(), 3);
    assert_eq!(proxy.live(), 0);
    // Client side: EOF or reset, never more data.
    for c in &mut clients {
        let mut buf = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("client side not closed");
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    }
    // Backend side: each echo connection ends.
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(10), closed_rx.recv())
            .await
            .expect("backend side not closed");
    }

    // The proxy keeps accepting after a cut.
    let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
    c.write_all(b"again").await.unwrap();
    let mut buf = [0u8; 5];
    c.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"again");
    wait_until(
        Duration::from_secs(10),
        Duration::from_millis(5),
        || async { proxy.live() == 1 },
    )
    .await
    .unwrap();
}
