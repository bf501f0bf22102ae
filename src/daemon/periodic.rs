//! The daemon's periodic tasks: the operator's health-clear request and the stale-claim sweep.

use crate::claims::ClaimSource;
use crate::prepare::Engine;
use std::sync::Arc;
use std::time::Duration;

/// Run `tick` every `period` (first after one period) until `stop`.
pub(super) async fn every<F: std::future::Future<Output = ()>>(
    period: Duration,
    stop: impl std::future::Future<Output = ()>,
    mut tick: impl FnMut() -> F,
) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(period) => {}
        }
        tick().await;
    }
}

/// Take the operator's `migdra health clear` request, if any, and forget the errors of the GPUs
/// it names; the health stream and the taints follow on their next look.
pub(super) fn take_health_request(engine: &Engine, plugin_dir: &std::path::Path) {
    let uuids = match super::health_request::take(plugin_dir) {
        Ok(Some(uuids)) => uuids,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(error = %e, dir = %plugin_dir.display(), "health clear request unreadable");
            return;
        }
    };
    for uuid in uuids {
        match engine.backend().clear_health(&uuid) {
            Ok(()) => tracing::warn!(gpu = %uuid, "health cleared by the operator (migdra health clear)"),
            Err(e) => tracing::warn!(gpu = %uuid, error = %e, "health clear request names no GPU of this node"),
        }
    }
}

/// Roll back the claims left mid-prepare that the claim source no longer allocates to this node
/// ([`Engine::sweep_stale`]). The sweep reads the claim source with blocking calls, so it runs on
/// a blocking thread.
pub(super) async fn sweep_stale_claims(engine: Arc<Engine>, claims: Arc<dyn ClaimSource>) {
    let sweep = match tokio::task::spawn_blocking(move || engine.sweep_stale(claims.as_ref())).await {
        Ok(Ok(sweep)) => sweep,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "stale-claim check skipped");
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "stale-claim check failed");
            return;
        }
    };
    for (claim, e) in &sweep.unknown {
        tracing::debug!(%claim, error = %e, "claim left mid-prepare kept: its allocation could not be read");
    }
    for stale in &sweep.stale {
        match &stale.rollback {
            Ok(()) => {
                crate::metrics::METRICS.stale_rolled_back(stale.reason);
                tracing::warn!(claim = %stale.claim, reason = stale.reason.as_str(),
                    "claim left mid-prepare is no longer allocated to this node: rolled back, its instances released");
            }
            Err(e) => {
                crate::metrics::METRICS.error("unprepare", &e.reason());
                tracing::warn!(claim = %stale.claim, reason = stale.reason.as_str(), error = %e,
                    "claim left mid-prepare is no longer allocated to this node; rolling it back \
                     failed, the next check retries");
            }
        }
    }
}
