//! The server's one drain signal: a cancellation token whose state is also
//! an atomic flag.
//!
//! `CancellationToken::is_cancelled` locks the token's mutex. Every stream
//! checks the drain on each pass of its loop and every connection on each
//! read and write, so with one token for the whole fleet that lock was taken
//! tens of thousands of times a second from both cores (W2, issue #13). The
//! flag makes the check a load; waiting still uses the token.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::WaitForCancellationFutureOwned;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// Cancelled once, when shutdown begins; cloned into every long-lived task.
#[derive(Clone, Debug, Default)]
pub(crate) struct Drain {
    token: CancellationToken,
    /// Set before the token is cancelled, never cleared.
    flag: Arc<AtomicBool>,
}

impl Drain {
    pub(crate) fn new() -> Self {
        Drain::default()
    }

    /// Begins the drain: every waiter wakes, every later check sees it.
    pub(crate) fn cancel(&self) {
        self.flag.store(true, Ordering::Release);
        self.token.cancel();
    }

    /// Whether the drain began (an atomic load, no lock).
    pub(crate) fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Resolves once the drain began.
    pub(crate) fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// [`cancelled`](Self::cancelled), owning a clone of the signal.
    pub(crate) fn cancelled_owned(self) -> WaitForCancellationFutureOwned {
        self.token.cancelled_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cancel_is_seen_by_clones_and_wakes_waiters() {
        let drain = Drain::new();
        let clone = drain.clone();
        assert!(!clone.is_cancelled());
        let waiter = tokio::spawn(clone.clone().cancelled_owned());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drain.cancel();
        waiter.await.unwrap();
        assert!(clone.is_cancelled());
        // Already cancelled: resolves at once.
        clone.cancelled().await;
    }
}
