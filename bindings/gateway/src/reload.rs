//! The JWKS file read again while the gateway runs: checked every `reload_s` seconds (read only
//! when it changed) and read at once on `SIGHUP`. A file that cannot be used is logged and
//! counted, and the keys in use stay as they were ([`JwtVerifier::reload`]).
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::config::PrincipalSource;
use crate::jwt::{JwtVerifier, Reload};
use crate::log;
use crate::metrics::Metrics;
use crate::proxy::Shared;

/// With a JWT principal: watches `SIGHUP` from now on (so the signal no longer ends the process)
/// and spawns the task that reads the JWKS file again, which runs until aborted. Without one:
/// nothing (`SIGHUP` keeps its default action).
#[must_use]
pub fn start(shared: &Arc<Shared>) -> Option<tokio::task::JoinHandle<()>> {
    let Some(PrincipalSource::Jwt(verifier)) = &shared.cfg.principal else {
        return None;
    };
    let verifier = Arc::clone(verifier);
    shared.metrics.attach_jwks();
    let hangup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            log::warn(
                "SIGHUP cannot be watched: the JWKS file is read again on its interval only",
                &[("error", json!(e.to_string()))],
            );
            None
        }
    };
    Some(tokio::spawn(run(verifier, Arc::clone(shared), hangup)))
}

async fn run(verifier: Arc<JwtVerifier>, shared: Arc<Shared>, mut hangup: Option<Signal>) {
    let every = verifier.settings().reload_s;
    let mut ticker = (every > 0).then(|| {
        let every = Duration::from_secs(every);
        tokio::time::interval_at(tokio::time::Instant::now() + every, every)
    });
    loop {
        let force = tokio::select! {
            () = async { match ticker.as_mut() {
                Some(t) => { t.tick().await; }
                None => std::future::pending::<()>().await,
            } } => false,
            Some(()) = async { match hangup.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            } } => true,
        };
        once(&verifier, &shared.metrics, force).await;
    }
}

/// One check of the file (a read on the blocking pool).
pub async fn once(verifier: &Arc<JwtVerifier>, metrics: &Metrics, force: bool) {
    let v = Arc::clone(verifier);
    let file = json!(v.settings().jwks_file.display().to_string());
    match tokio::task::spawn_blocking(move || v.reload(force)).await {
        Ok(Ok(Reload::Unchanged)) => {}
        Ok(Ok(Reload::Loaded { keys })) => {
            metrics.jwks_reload(true);
            log::info("JWKS reloaded", &[("file", file), ("keys", json!(keys))]);
        }
        Ok(Err(e)) => {
            metrics.jwks_reload(false);
            log::error(
                "JWKS reload failed: the previous keys stay in use until the file is fixed",
                &[("file", file), ("error", json!(e.to_string()))],
            );
        }
        Err(e) => log::error("JWKS reload failed", &[("error", json!(e.to_string()))]),
    }
}
