//! The Kubernetes side: what this node publishes to the API server, where claims come from, and
//! what the bridge reads back.
//!
//! - [`slices`]: the pure ResourceSlice builder and the API server's validation rules for them,
//!   in both layouts (counters beside devices before 1.35, in their own slices from 1.35).
//! - [`inventory`]: the node's GPUs as the slice builder takes them, read from the prepare engine.
//! - [`publisher`]: publishes the slices and repairs drift.
//! - [`allocations`]: the devices of this node's pool that claims hold, from a watch of claims.
//! - [`publish_status`]: whether it publishes, on disk for `migdra probe --ready`.
//! - [`claims`]: the claim source backed by the API server.
//! - [`claim_status`]: the claim status writer (`status.devices[]` with Ready and the bridge's data).
//! - [`device_classes`]: the DeviceClasses for migdra's devices, and slurm-bridge's profiles for them.
//! - [`events`]: Warning events on failed claims and on the Node.
//! - [`backoff`]: the jittered, doubling wait between API retries.

pub mod allocations;
pub mod api_calls;
pub mod backoff;
pub mod claim_status;
pub mod claims;
pub mod device_classes;
pub mod events;
pub mod inventory;
pub mod publish_status;
pub mod publisher;
pub mod slices;

use std::time::Duration;

/// Errors worth retrying: the server or the network, not a refusal.
pub fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429 || s.code == 409,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
    }
}

/// One line for an API error: kube's own text of a refusal carries the whole Status struct, and
/// that of a connection failure only `ServiceError: client error (Connect)`, the cause (refused,
/// timed out, no route, a TLS failure) being in its sources.
pub fn error_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({}, HTTP {})", s.message, s.reason, s.code),
        other => crate::causes::with_causes(other),
    }
}

/// Run `call` until it succeeds, fails for good, or `budget` runs out; transient failures are
/// retried after about 100 ms, doubling up to 5 s ([`backoff::Backoff`]). `what` names the call
/// in the log.
pub async fn retry_transient<T, F, Fut>(budget: Duration, what: &str, mut call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = tokio::time::Instant::now() + budget;
    let mut backoff = backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let wait = backoff.next_wait();
        match call().await {
            Err(e) if transient(&e) && tokio::time::Instant::now() + wait < deadline => {
                tracing::debug!(error = %e, retry_in = ?wait, "{what} failed; retrying");
                tokio::time::sleep(wait).await;
            }
            r => return r,
        }
    }
}
