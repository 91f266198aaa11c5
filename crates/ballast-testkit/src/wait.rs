//! Bounded polling. Every wait in an end-to-end test has a deadline, so a broken build fails with the last
//! observed error instead of hanging CI; the deadline is a bound, never an assertion about speed.

use std::future::Future;
use std::time::Duration;

use anyhow::{Result, anyhow};

/// Calls `f` every `interval` until it returns `Ok`, and returns that value; after `timeout`, fails with the
/// last error `f` returned (so the failure says *what* was still wrong, e.g. via `anyhow::ensure!`).
///
/// `f` is always called at least once, even with a zero timeout.
pub async fn wait_for<T, F, Fut>(timeout: Duration, interval: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut attempts = 0u64;
    loop {
        attempts += 1;
        let err = match f().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if tokio::time::Instant::now() + interval > deadline {
            return Err(err.context(format!(
                "condition not met within {timeout:?} ({attempts} attempts)"
            )));
        }
        tokio::time::sleep(interval).await;
    }
}

/// Like [`wait_for`] for a plain predicate: polls until `f` returns `true`, fails after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, interval: Duration, mut f: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(timeout, interval, || {
        let fut = f();
        async move {
            if fut.await {
                Ok(())
            } else {
                Err(anyhow!("predicate still false"))
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn returns_first_ok_value() {
        let n = Arc::new(AtomicU32::new(0));
        let v = wait_for(Duration::from_secs(5), Duration::from_millis(1), || {
            let n = n.clone();
            async move {
                let i = n.fetch_add(1, Ordering::SeqCst);
                anyhow::ensure!(i >= 3, "only {i}");
                Ok(i)
            }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
    }

    #[tokio::test]
    async fn times_out_with_last_error() {
        let err = wait_for(
            Duration::from_millis(20),
            Duration::from_millis(5),
            || async { Err::<(), _>(anyhow!("still broken")) },
        )
        .await
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("still broken"), "{msg}");
        assert!(msg.contains("not met"), "{msg}");
    }

    #[tokio::test]
    async fn wait_until_zero_timeout_polls_once() {
        wait_until(Duration::ZERO, Duration::from_millis(1), || async { true })
            .await
            .unwrap();
        assert!(
            wait_until(Duration::ZERO, Duration::from_millis(1), || async { false })
                .await
                .is_err()
        );
    }
}
