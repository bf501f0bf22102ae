//! What the scheduler has allocated from this node's pool, as the API server says: every
//! ResourceClaim's allocation results for our driver and pool, followed by one list and a watch
//! of all claims (the API has no selector for the node a claim is allocated on).
//!
//! The publisher checks each publication against it: an allocated device must stay published
//! with the same counters (kubernetes#140802), and a publication that steers around allocations
//! starts here. Only device names are kept, never the claims, so the memory is the node's own
//! allocations, whatever the cluster's size.

use super::backoff::Backoff;
use futures_util::StreamExt;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::watch;

/// Claims per page of the list: a cluster's claims arrive in bounded pieces.
const PAGE: u32 = 500;

/// The devices of `pool` that `claim` holds for `driver`.
pub fn held_devices(claim: &ResourceClaim, driver: &str, pool: &str) -> Vec<String> {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    results.iter().filter(|r| r.driver == driver && r.pool == pool).map(|r| r.device.clone()).collect()
}

#[derive(Debug, Default)]
struct State {
    /// Claim UID → the devices of our pool it holds (claims holding none are not kept).
    claims: BTreeMap<String, Vec<String>>,
    /// Whether a list has completed: before it, nothing is known.
    synced: bool,
}

/// This node's allocated devices, shared between the watch that keeps them and the publisher.
#[derive(Debug)]
pub struct Allocations {
    state: Mutex<State>,
    /// Bumped on every change, so a waiter wakes once per burst.
    changes: watch::Sender<u64>,
}

impl Default for Allocations {
    fn default() -> Self {
        Self { state: Mutex::default(), changes: watch::Sender::new(0) }
    }
}

impl Allocations {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every device some claim holds; `None` until the first list has completed.
    pub fn devices(&self) -> Option<BTreeSet<String>> {
        let st = self.lock();
        st.synced.then(|| st.claims.values().flatten().cloned().collect())
    }

    /// How many changes there have been: a reader compares it with what it read before.
    pub fn version(&self) -> u64 {
        *self.changes.borrow()
    }

    /// Forget what is known until the next list: after a broken watch, the devices held may have
    /// changed unseen.
    pub fn forget(&self) {
        let mut st = self.lock();
        let was = std::mem::replace(&mut st.synced, false);
        drop(st);
        if was {
            self.changes.send_modify(|v| *v += 1);
        }
    }

    /// A receiver that sees a new value after each change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Everything a list returned, replacing what was known.
    pub fn replace(&self, claims: BTreeMap<String, Vec<String>>) {
        let mut st = self.lock();
        let changed = !st.synced || st.claims != claims;
        st.claims = claims;
        st.synced = true;
        drop(st);
        if changed {
            self.changes.send_modify(|v| *v += 1);
        }
    }

    /// One claim as a watch event shows it; no devices (or deleted) removes it.
    pub fn apply(&self, uid: &str, devices: Vec<String>) {
        let mut st = self.lock();
        let changed = if devices.is_empty() {
            st.claims.remove(uid).is_some()
        } else if st.claims.get(uid) == Some(&devices) {
            false
        } else {
            st.claims.insert(uid.to_string(), devices);
            true
        };
        drop(st);
        if changed {
            self.changes.send_modify(|v| *v += 1);
        }
    }
}

/// Keep `into` equal to what the claims of `api` hold of `driver`'s `pool`: list, then watch from
/// the list's version; list again when the watch breaks. A failed list, and a watch that broke
/// before it had run for [`HEALTHY`], wait the next backoff step first: a server that refuses or
/// throttles watches is not paged through the cluster's claims in a loop. Runs until dropped.
pub async fn follow(api: Api<ResourceClaim>, driver: String, pool: String, into: std::sync::Arc<Allocations>) {
    let mut backoff = Backoff::new(Duration::from_millis(200), super::backoff::WATCH_MAX);
    loop {
        let version = match list(&api, &driver, &pool).await {
            Ok((claims, version)) => {
                into.replace(claims);
                version
            }
            Err(e) => {
                let wait = backoff.next_wait();
                tracing::warn!(
                    error = %super::error_text(&e),
                    retry_in = ?wait,
                    "listing ResourceClaims failed; allocated devices unknown until it works"
                );
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        let started = tokio::time::Instant::now();
        let why = watch_from(&api, &driver, &pool, &into, version).await;
        // Broken: until the next list completes, nothing is known.
        into.forget();
        if started.elapsed() >= HEALTHY {
            backoff.reset();
            tracing::debug!(reason = %why, "watch of ResourceClaims ended; listing again");
        } else {
            let wait = backoff.next_wait();
            tracing::warn!(
                error = %why,
                retry_in = ?wait,
                "watching ResourceClaims failed; listing again after a wait"
            );
            tokio::time::sleep(wait).await;
        }
    }
}

/// A watch that ran this long was healthy: its end starts the backoff over.
const HEALTHY: Duration = Duration::from_secs(30);

/// Every claim, a page at a time: the devices each holds, and the list's resourceVersion.
async fn list(
    api: &Api<ResourceClaim>,
    driver: &str,
    pool: &str,
) -> kube::Result<(BTreeMap<String, Vec<String>>, String)> {
    let mut claims = BTreeMap::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await?;
        for c in &page.items {
            let held = held_devices(c, driver, pool);
            if let (false, Some(uid)) = (held.is_empty(), c.metadata.uid.clone()) {
                claims.insert(uid, held);
            }
        }
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok((claims, page.metadata.resource_version.unwrap_or_default())),
        }
    }
}

/// Apply watch events from `version` until the watch must be listed again: an expired version,
/// an error, or a broken stream; returns why, in one line. The server's timeout resumes from the
/// last version seen.
async fn watch_from(
    api: &Api<ResourceClaim>,
    driver: &str,
    pool: &str,
    into: &Allocations,
    mut version: String,
) -> String {
    loop {
        let params = WatchParams::default().timeout(290);
        let stream = match api.watch(&params, &version).await {
            Ok(stream) => stream,
            Err(e) => return super::error_text(&e),
        };
        let opened = tokio::time::Instant::now();
        let mut stream = stream.boxed();
        while let Some(event) = stream.next().await {
            let claim = match event {
                Ok(WatchEvent::Added(c) | WatchEvent::Modified(c)) => (c, false),
                Ok(WatchEvent::Deleted(c)) => (c, true),
                Ok(WatchEvent::Bookmark(b)) => {
                    version = b.metadata.resource_version;
                    continue;
                }
                // 410 Gone and every other error: list again.
                Ok(WatchEvent::Error(s)) => return super::error_text(&kube::Error::Api(s)),
                Err(e) => return super::error_text(&e),
            };
            let (c, deleted) = claim;
            if let Some(v) = &c.metadata.resource_version {
                version.clone_from(v);
            }
            let Some(uid) = c.metadata.uid.as_deref() else { continue };
            let held = if deleted { Vec::new() } else { held_devices(&c, driver, pool) };
            into.apply(uid, held);
        }
        // The server's timeout is 290 s: a stream closed at once is a watch something refuses.
        if opened.elapsed() < super::backoff::WATCH_LIVED {
            return "the watch ended as soon as it opened".into();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(uid: &str, results: &[(&str, &str, &str)]) -> ResourceClaim {
        let results: Vec<serde_json::Value> = results
            .iter()
            .map(|(driver, pool, device)| {
                serde_json::json!({"request": "gpu", "driver": driver, "pool": pool, "device": device})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "uid": uid},
            "spec": {},
            "status": {"allocation": {"devices": {"results": results}}}
        }))
        .unwrap()
    }

    #[test]
    fn only_our_drivers_devices_in_our_pool_are_held() {
        let c = claim(
            "a",
            &[
                ("mig.slinky.slurm.net", "node-a", "gpu-0-mig-19-0-1"),
                ("mig.slinky.slurm.net", "node-b", "gpu-0-mig-19-1-1"),
                ("gpu.nvidia.com", "node-a", "gpu-0"),
                ("mig.slinky.slurm.net", "node-a", "gpu-1-mig-9-4-4"),
            ],
        );
        assert_eq!(held_devices(&c, "mig.slinky.slurm.net", "node-a"), ["gpu-0-mig-19-0-1", "gpu-1-mig-9-4-4"]);
        let unallocated: ResourceClaim =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "u"}, "spec": {}})).unwrap();
        assert!(held_devices(&unallocated, "mig.slinky.slurm.net", "node-a").is_empty());
    }

    #[test]
    fn nothing_is_known_before_a_list_and_each_change_wakes_once() {
        let a = Allocations::default();
        let rx = a.subscribe();
        assert_eq!(a.devices(), None);
        a.apply("x", vec!["d1".into()]);
        assert_eq!(a.devices(), None, "a watch event before any list proves nothing");
        a.replace(BTreeMap::from([("x".to_string(), vec!["d1".to_string()])]));
        assert_eq!(a.devices(), Some(BTreeSet::from(["d1".to_string()])));
        let seen = *rx.borrow();
        a.apply("x", vec!["d1".into()]);
        a.apply("gone", Vec::new());
        assert_eq!(*rx.borrow(), seen, "no change, no wake-up");
        a.apply("y", vec!["d2".into(), "d3".into()]);
        a.apply("x", Vec::new());
        assert_eq!(a.devices(), Some(BTreeSet::from(["d2".to_string(), "d3".to_string()])));
        assert_eq!(*rx.borrow(), seen + 2);
    }
}
