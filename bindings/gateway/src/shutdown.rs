//! Graceful shutdown: the signals that start it and the count of flows still running, which
//! shutdown waits for (within its deadline) after the listener closed.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Flows (protected requests) still running, including those whose client went away.
#[derive(Debug, Default, Clone)]
pub struct Inflight {
    count: Arc<AtomicUsize>,
    idle: Arc<Notify>,
}

/// Held by a running flow; dropping it ends the flow's count.
#[derive(Debug)]
pub struct InflightGuard(Inflight);

impl Inflight {
    /// Counts one more running flow until the guard drops.
    #[must_use]
    pub fn enter(&self) -> InflightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InflightGuard(self.clone())
    }

    /// Flows running now.
    #[must_use]
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Waits until no flow runs.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
