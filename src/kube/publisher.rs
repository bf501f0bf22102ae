//! Publishes this node's ResourceSlices and keeps them as published.
//!
//! - The layout follows the API server's version (`/version`): counters beside devices before
//!   1.35, in their own slices from 1.35; `--slice-layout` forces either.
//! - When only one slice changes it is updated in place under the same pool generation, so the
//!   pool is never incomplete (from 1.35 an incomplete pool is skipped); otherwise the generation
//!   is bumped and every slice rewritten, extras deleted last.
//! - Dynamic GPUs always publish every partition with the same counter consumption, so an
//!   allocated device is never dropped or changed (kubernetes#140802). With `--profiles`, a
//!   profile left out stays published on a GPU while a claim holds a device of it: the claims
//!   allocated on this node are followed ([`super::allocations`]), and a held device the slices
//!   lack publishes again at once. `--publish fitting` leaves out what held devices block, and
//!   `--device-order best-fit` reorders by them; both publish again 100 ms after a change.
//! - Our slices are watched: the kubelet deletes a node's slices when it starts, and people edit
//!   them; any drift is repaired by publishing again. A full check also runs every resync period.
//! - Unhealthy GPUs' devices carry a taint ([`crate::mig::taints`]). Health is polled every
//!   health interval and a change publishes at once; a taint keeps the `timeAdded` the server
//!   gave it for as long as it stays. An API server that drops taints (DRADeviceTaints off,
//!   before 1.36 by default) gets the same taints again only after health changes, so a dropped
//!   field never makes a rewrite loop.
//! - Each round's outcome goes to the status file `migdra probe --ready` reads
//!   ([`super::publish_status`]); a failure names the API server it tried, with every cause.

use super::allocations::Allocations;
use super::inventory::{self, PublishOptions};
use super::publish_status::{self, PublishStatus};
use super::slices::{self, Layout, TaintSet};
use crate::mig::taints::{GpuHealth, TaintPolicy};
use crate::prepare::Engine;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("failed to {op}: {source}")]
    Api { op: &'static str, source: kube::Error },
    #[error("failed to read the GPUs: {0}")]
    Gpu(#[from] crate::gpu::GpuError),
    #[error("failed to build the slices: {0}")]
    Build(#[from] slices::SliceError),
}

impl PublishError {
    /// One line with every cause: a refusal as the API server words it, a connection failure
    /// with why it failed (kube's own text says only `client error (Connect)`).
    pub fn line(&self) -> String {
        match self {
            Self::Api { op, source } => format!("failed to {op}: {}", super::error_text(source)),
            other => crate::causes::with_causes(other),
        }
    }
}

/// What one publish did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    pub layout: Option<Layout>,
    pub generation: i64,
    pub created: usize,
    pub updated: usize,
    pub deleted: usize,
    pub unchanged: usize,
    /// The resourceVersion of the list this round compared against: the watch for drift starts
    /// there, so it sees every change after it and replays nothing.
    pub listed_at: Option<String>,
    /// The resourceVersions of this round's own writes, which the watch then sees and skips.
    pub written: BTreeSet<String>,
}

/// Which devices of dynamic GPUs a publication holds (`--publish`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceSet {
    /// Every partition, always: the slices change only with the hardware.
    #[default]
    All,
    /// Every device a claim holds, and only the partitions that can still be allocated beside
    /// them ([`slices::keep_fitting`]); published again after allocations and releases.
    Fitting,
}

/// How long a burst of allocations and releases is gathered into one publication.
const COALESCE: Duration = Duration::from_millis(100);

/// Longest wait between two failed publishes: short, so the pool is back soon after an outage.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub struct Publisher {
    client: Client,
    engine: Arc<Engine>,
    driver: String,
    node: String,
    /// `None`: from the API server's version.
    choice: Option<Layout>,
    resync: Duration,
    events: Option<super::events::Recorder>,
    /// The order of each GPU's devices (`--device-order`) and the taint policy.
    opts: PublishOptions,
    /// How often health is read for taints.
    health_interval: Duration,
    /// The taints the API server last dropped: not sent again until the wanted set differs.
    dropped: Mutex<Option<TaintSet>>,
    /// The API server's URL, which a failure names: an address that cannot be reached is the
    /// usual cause, and kube's errors do not say which one they tried.
    server: String,
    /// Where each round's outcome is written for `migdra probe --ready`; none in tests that
    /// do not probe.
    status_file: Option<PathBuf>,
    /// The devices of this node's pool that claims hold; none in tests that do not follow claims.
    allocations: Option<Arc<Allocations>>,
    /// Every device name the last publication built or was asked to keep, to tell whether a
    /// newly held device has been considered.
    last_devices: Mutex<BTreeSet<String>>,
    /// Whether the last publication knew the claims (else it kept everything published).
    known: std::sync::atomic::AtomicBool,
    devices: DeviceSet,
    /// The allocations' change count the last publication read.
    seen_version: std::sync::atomic::AtomicU64,
}

impl Publisher {
    pub fn new(client: Client, engine: Arc<Engine>, choice: Option<Layout>) -> Self {
        let opts = engine.options();
        Self {
            driver: opts.driver.clone(),
            node: opts.pool.clone(),
            client,
            engine,
            choice,
            resync: Duration::from_secs(30),
            events: None,
            opts: PublishOptions::default(),
            health_interval: Duration::from_secs(1),
            dropped: Mutex::new(None),
            server: "the API server".into(),
            status_file: None,
            allocations: None,
            last_devices: Mutex::new(BTreeSet::new()),
            known: std::sync::atomic::AtomicBool::new(false),
            devices: DeviceSet::All,
            seen_version: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Name `url` (the client's cluster URL) in every failure.
    pub fn with_server(mut self, url: &str) -> Self {
        self.server = url.trim_end_matches('/').to_string();
        self
    }

    /// Write each round's outcome to `path` ([`publish_status`]).
    pub fn with_status_file(mut self, path: PathBuf) -> Self {
        self.status_file = Some(path);
        self
    }

    /// Publish each GPU's devices in this order (a pure reorder: the same devices and counters).
    pub fn with_device_order(mut self, order: crate::packing::DeviceOrder) -> Self {
        self.opts.order = order;
        self
    }

    /// Taint unhealthy GPUs' devices this way (default `NoSchedule`), reading health every
    /// `interval`.
    pub fn with_taints(mut self, policy: TaintPolicy, interval: Duration) -> Self {
        self.opts.taints = policy;
        self.health_interval = interval;
        self
    }

    /// Also post a Warning event on the Node when publishing fails.
    pub fn with_events(mut self, events: super::events::Recorder) -> Self {
        self.events = Some(events);
        self
    }

    /// Keep every device that claims hold published (`allocations`, kept by
    /// [`super::allocations::follow`]), and publish again when one is held that the last
    /// publication lacks.
    pub fn with_allocations(mut self, allocations: Arc<Allocations>) -> Self {
        self.allocations = Some(allocations);
        self
    }

    /// Publish every partition, or only what can still be allocated beside the devices claims
    /// hold (which needs [`Self::with_allocations`]; without it, every partition).
    pub fn with_device_set(mut self, devices: DeviceSet) -> Self {
        self.devices = devices;
        self
    }

    /// How often everything is compared even without a watch event.
    pub fn with_resync(mut self, resync: Duration) -> Self {
        self.resync = resync;
        self
    }

    fn api(&self) -> Api<ResourceSlice> {
        Api::all(self.client.clone())
    }

    fn selector(&self) -> (String, String) {
        (
            format!("{}={}", slices::node_label(&self.driver), slices::node_label_value(&self.node)),
            format!("spec.driver={}", self.driver),
        )
    }

    async fn layout(&self) -> Result<Layout, PublishError> {
        if let Some(layout) = self.choice {
            return Ok(layout);
        }
        let v = self
            .client
            .apiserver_version()
            .await
            .map_err(|source| PublishError::Api { op: "read /version", source })?;
        let num = |s: &str| s.trim_end_matches(|c: char| !c.is_ascii_digit()).parse::<u32>().unwrap_or(0);
        Ok(slices::layout_for(num(&v.major), num(&v.minor)))
    }

    /// Make the published slices equal what the node has now.
    ///
    /// # Errors
    /// The API server refuses or cannot be reached; the caller retries.
    pub async fn publish(&self) -> Result<Published, PublishError> {
        let layout = self.layout().await?;
        let node_uid = Api::<Node>::all(self.client.clone())
            .get_opt(&self.node)
            .await
            .map_err(|source| PublishError::Api { op: "read the Node", source })?
            .and_then(|n| n.metadata.uid);
        let (labels, fields) = self.selector();
        let list = self
            .api()
            .list(&ListParams::default().labels(&labels).fields(&fields))
            .await
            .map_err(|source| PublishError::Api { op: "list our ResourceSlices", source })?;
        let (engine, opts) = (self.engine.clone(), self.opts);
        // Until the claims are known, whatever is published now may be held: keep it all.
        if let Some(a) = &self.allocations {
            self.seen_version.store(a.version(), std::sync::atomic::Ordering::Relaxed);
        }
        let known = self.allocations.as_ref().map(|a| a.devices());
        // Leaving devices out is safe only beside claims known now; adding them back always is.
        let fitting = self.devices == DeviceSet::Fitting && matches!(known, Some(Some(_)));
        let best_fit = self.opts.order.policy().is_dynamic() && matches!(known, Some(Some(_)));
        self.known.store(!matches!(known, Some(None)), std::sync::atomic::Ordering::Relaxed);
        let held = match known {
            None => BTreeSet::new(),
            Some(Some(held)) => held,
            Some(None) => {
                list.items.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.clone()).collect()
            }
        };
        let gpus = {
            let held = held.clone();
            tokio::task::spawn_blocking(move || inventory::node_gpus_holding(&engine, false, opts, &held))
                .await
                .map_err(|e| crate::gpu::GpuError::Invalid(e.to_string()))??
        };
        let names: BTreeSet<String> = gpus.iter().flat_map(|g| g.devices.iter().map(|d| d.name.clone())).collect();
        let missing: Vec<&String> = held.difference(&names).collect();
        if !missing.is_empty() && self.known.load(std::sync::atomic::Ordering::Relaxed) {
            // A lost GPU, or a name no GPU of this node has: nothing to publish it from.
            tracing::error!(
                devices = ?missing,
                "claims hold devices this node cannot publish: the scheduler no longer counts what they consume"
            );
        }
        // What this round considered: a held device it could not publish does not start another.
        *self.last_devices.lock().unwrap_or_else(PoisonError::into_inner) = names.union(&held).cloned().collect();
        let listed_at = list.metadata.resource_version;
        let existing = list.items;
        let current_gen = existing.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0);
        let build = |generation: i64| -> Result<Vec<ResourceSlice>, PublishError> {
            let mut built = slices::build(&self.driver, &self.node, node_uid.as_deref(), generation, layout, &gpus)?;
            if fitting {
                slices::keep_fitting(&mut built, &held);
            }
            if best_fit {
                slices::rank_best_fit(&mut built, &self.dynamic_models(), &held);
            }
            self.settle_taints(&mut built, &existing);
            Ok(built)
        };
        let same_gen = build(current_gen.max(1))?;
        let changed: Vec<&ResourceSlice> = same_gen
            .iter()
            .filter(|want| !existing.iter().any(|have| have.metadata.name == want.metadata.name && same(have, want)))
            .collect();
        let extra =
            existing.iter().filter(|have| !same_gen.iter().any(|w| w.metadata.name == have.metadata.name)).count();
        let all_present = same_gen.iter().all(|w| existing.iter().any(|h| h.metadata.name == w.metadata.name));
        let mut report =
            Published { layout: Some(layout), generation: current_gen.max(1), listed_at, ..Default::default() };
        if changed.is_empty() && extra == 0 && current_gen > 0 {
            report.unchanged = same_gen.len();
            return Ok(report);
        }
        // One slice to touch, all others in place: update it without a new generation.
        let desired = if changed.len() == 1 && extra == 0 && all_present && current_gen > 0 {
            same_gen
        } else {
            report.generation = current_gen + 1;
            build(current_gen + 1)?
        };
        let api = self.api();
        for want in &desired {
            let name = want.metadata.name.clone().unwrap_or_default();
            match existing.iter().find(|h| h.metadata.name.as_deref() == Some(name.as_str())) {
                Some(have) if same(have, want) => report.unchanged += 1,
                Some(have) => {
                    let mut next = want.clone();
                    next.metadata.resource_version = have.metadata.resource_version.clone();
                    let written = api
                        .replace(&name, &PostParams::default(), &next)
                        .await
                        .map_err(|source| PublishError::Api { op: "update a ResourceSlice", source })?;
                    crate::prepare::reached(crate::prepare::Step::SliceWritten);
                    warn_if_dropped(want, &written);
                    self.note_dropped_taints(want, &written);
                    report.written.extend(written.metadata.resource_version);
                    report.updated += 1;
                }
                None => {
                    let written = api
                        .create(&PostParams::default(), want)
                        .await
                        .map_err(|source| PublishError::Api { op: "create a ResourceSlice", source })?;
                    crate::prepare::reached(crate::prepare::Step::SliceWritten);
                    warn_if_dropped(want, &written);
                    self.note_dropped_taints(want, &written);
                    report.written.extend(written.metadata.resource_version);
                    report.created += 1;
                }
            }
        }
        for have in existing.iter().filter(|h| !desired.iter().any(|w| w.metadata.name == h.metadata.name)) {
            let name = have.metadata.name.clone().unwrap_or_default();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => report.deleted += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => return Err(PublishError::Api { op: "delete a stale ResourceSlice", source }),
            }
        }
        Ok(report)
    }

    /// Taints as they should be sent: each keeps the time it already has on the server, and
    /// none at all while the server drops exactly these.
    fn settle_taints(&self, built: &mut [ResourceSlice], existing: &[ResourceSlice]) {
        let dropped = self.dropped.lock().unwrap_or_else(PoisonError::into_inner);
        if dropped.as_ref().is_some_and(|d| *d == slices::taints_of(built)) {
            slices::strip_taints(built);
            return;
        }
        // Whole seconds, as the server stores a time: what it returns then equals what was sent.
        let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH);
        slices::keep_taint_times(built, existing, Time(now));
    }

    /// With DRADeviceTaints off the API server silently drops taints: remember what it dropped
    /// (and say so once per change), so the next publish does not send them again.
    fn note_dropped_taints(&self, want: &ResourceSlice, written: &ResourceSlice) {
        let sent = slices::taints_of(std::slice::from_ref(want));
        if sent.is_empty() || !slices::taints_of(std::slice::from_ref(written)).is_empty() {
            return;
        }
        let mut dropped = self.dropped.lock().unwrap_or_else(PoisonError::into_inner);
        let all = dropped.get_or_insert_with(BTreeSet::new);
        if !sent.is_subset(all) {
            tracing::error!(
                slice = want.metadata.name.as_deref().unwrap_or(""),
                "the API server dropped the device taints of unhealthy GPUs: the DRADeviceTaints \
                 feature gate is off (on by default from Kubernetes 1.36); the scheduler still \
                 sees those devices as usable"
            );
        }
        all.extend(sent);
    }

    /// Each GPU's health when taints are on; `None` when they are off or it cannot be read.
    async fn health(&self) -> Option<Vec<GpuHealth>> {
        if self.opts.taints == TaintPolicy::Off {
            return None;
        }
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || crate::prepare::node_health(&engine).ok()).await.ok().flatten()
    }

    /// Returns once health differs from `seen` (never while taints are off).
    async fn health_change(&self, seen: &Option<Vec<GpuHealth>>) {
        if self.opts.taints == TaintPolicy::Off {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(self.health_interval).await;
            let now = self.health().await;
            if now.is_some() && now != *seen {
                return;
            }
        }
    }

    /// Publish, then keep the slices as published until `shutdown`: repair on any watch event
    /// that is not our own write, at every resync, and when a GPU's health changes; retry
    /// failures with backoff.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut backoff = super::backoff::Backoff::new(Duration::from_millis(200), MAX_BACKOFF);
        let mut watch_backoff = super::backoff::Backoff::new(Duration::from_millis(200), super::backoff::WATCH_MAX);
        let mut status = PublishStatus::starting(&publish_status::now());
        loop {
            let seen = self.health().await;
            let published = self.publish().await;
            crate::metrics::METRICS
                .slice_publish(published.as_ref().ok().map(|p| p.created + p.updated + p.deleted > 0));
            let failure = published.as_ref().err().map(|e| self.failure(e));
            let since = published.as_ref().ok().map(|p| (p.listed_at.clone(), p.written.clone()));
            status = status.after(&publish_status::now(), failure.clone());
            self.record(&status);
            match published {
                Ok(p) => {
                    if p.created + p.updated + p.deleted > 0 {
                        tracing::info!(
                            layout = ?p.layout,
                            generation = p.generation,
                            created = p.created,
                            updated = p.updated,
                            deleted = p.deleted,
                            "published ResourceSlices"
                        );
                    }
                    backoff.reset();
                }
                Err(_) => {
                    let wait = backoff.next_wait();
                    let failure = failure.unwrap_or_default();
                    tracing::warn!(error = %failure, retry_in = ?wait, "publishing ResourceSlices failed");
                    if let Some(events) = &self.events {
                        events.node_warning("PublishFailed", &failure).await;
                    }
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
            }
            let (listed_at, written) = since.unwrap_or_default();
            tokio::select! {
                () = &mut shutdown => return,
                drift = self.watch_for_drift(listed_at.as_deref(), &written) => match drift {
                    Drift::Seen => watch_backoff.reset(),
                    // Refused or broken: look again after a wait, so that a server refusing
                    // watches gets a list of this node's slices per step, not per second.
                    Drift::Unwatched(why) => {
                        let wait = watch_backoff.next_wait();
                        tracing::warn!(
                            error = %why,
                            retry_in = ?wait,
                            "watching ResourceSlices failed; checking them again after a wait"
                        );
                        tokio::select! {
                            () = &mut shutdown => return,
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                },
                () = self.held_unpublished() => {
                    tracing::info!("the devices claims hold here changed, or became known: publishing again");
                }
                () = self.health_change(&seen) => {
                    tracing::info!("GPU health changed: publishing the taints again");
                    *self.dropped.lock().unwrap_or_else(PoisonError::into_inner) = None;
                }
            }
        }
    }

    /// Minor → model of each GPU whose partitions are made on demand: the GPUs best fit ranks.
    fn dynamic_models(&self) -> BTreeMap<u32, &crate::mig::catalog::GpuModel> {
        let gpus = self.engine.gpus().iter().filter(|g| g.mode == crate::mig::devices::GpuMode::Dynamic);
        gpus.map(|g| (g.info.minor, &g.model)).collect()
    }

    /// Returns when a claim holds a device the last publication lacks (a profile `--profiles`
    /// leaves out, allocated before this pod started), or when the claims become known after a
    /// publication that kept everything; never without allocations followed.
    async fn held_unpublished(&self) {
        let Some(allocations) = &self.allocations else { return std::future::pending().await };
        let mut changes = allocations.subscribe();
        // Publishing only what fits, or ranking by what is held, any change matters.
        let follows = self.devices == DeviceSet::Fitting || self.opts.order.policy().is_dynamic();
        loop {
            let changed = allocations.version() != self.seen_version.load(std::sync::atomic::Ordering::Relaxed);
            if let Some(held) = allocations.devices() {
                let last = self.last_devices.lock().unwrap_or_else(PoisonError::into_inner).clone();
                // Newly held and not published, or the claims known at last: publish again.
                if !held.is_subset(&last) || !self.known.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                // A burst of changes is gathered into one round.
                if follows && changed {
                    tokio::time::sleep(COALESCE).await;
                    return;
                }
            }
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// A failed round in one line: the server tried, then the error with its causes.
    fn failure(&self, e: &PublishError) -> String {
        format!("publishing ResourceSlices to {} failed: {}", self.server, e.line())
    }

    /// Write a round's outcome for `migdra probe --ready`; a failure to write is logged (the
    /// probe then reads the previous round's, and the plugin directory is broken for the
    /// sockets too).
    fn record(&self, status: &PublishStatus) {
        let Some(path) = &self.status_file else { return };
        if let Err(e) = status.write(path) {
            tracing::error!(error = %e, "failed to record the publish status for migdra probe --ready");
        }
    }

    /// Returns when our slices may have drifted since the list at `listed_at`: a deletion or a
    /// change that is not one of our own `written` versions, an expired version, the server's
    /// timeout, or the resync period ([`Drift::Seen`]); or when the watch was refused or broke
    /// ([`Drift::Unwatched`]). Without a list version (none came back) the resync alone decides.
    async fn watch_for_drift(&self, listed_at: Option<&str>, written: &BTreeSet<String>) -> Drift {
        let deadline = tokio::time::sleep(self.resync);
        tokio::pin!(deadline);
        let Some(from) = listed_at else {
            deadline.await;
            return Drift::Seen;
        };
        let (labels, fields) = self.selector();
        let params =
            WatchParams::default().labels(&labels).fields(&fields).timeout(self.resync.as_secs().clamp(1, 290) as u32);
        let stream = match self.api().watch(&params, from).await {
            Ok(stream) => stream,
            Err(e) => return Drift::Unwatched(super::error_text(&e)),
        };
        let opened = tokio::time::Instant::now();
        let mut stream = stream.boxed();
        let ours = |s: &ResourceSlice| s.metadata.resource_version.as_ref().is_some_and(|v| written.contains(v));
        loop {
            tokio::select! {
                () = &mut deadline => return Drift::Seen,
                event = stream.next() => match event {
                    Some(Ok(WatchEvent::Added(s) | WatchEvent::Modified(s))) if ours(&s) => {}
                    Some(Ok(WatchEvent::Bookmark(_))) => {}
                    // A stream closed as soon as it opened is a watch something refuses.
                    None if opened.elapsed() < super::backoff::WATCH_LIVED => {
                        return Drift::Unwatched("the watch ended as soon as it opened".into());
                    }
                    // Someone else's change or deletion, the server's timeout, or an expired
                    // version (410): publish again, which lists anew.
                    Some(Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_))) | None => {
                        return Drift::Seen;
                    }
                    Some(Ok(WatchEvent::Error(s))) if s.code == 410 => return Drift::Seen,
                    Some(Ok(WatchEvent::Error(s))) => {
                        return Drift::Unwatched(super::error_text(&kube::Error::Api(s)));
                    }
                    Some(Err(e)) => return Drift::Unwatched(super::error_text(&e)),
                },
            }
        }
    }
}

/// How a watch for drift ended.
enum Drift {
    /// Something to publish again for: a change, an expiry, the resync period.
    Seen,
    /// The watch was refused or broke: why, in one line.
    Unwatched(String),
}

/// Whether a published slice already says what we want (labels, owners and spec).
fn same(have: &ResourceSlice, want: &ResourceSlice) -> bool {
    have.spec == want.spec
        && have.metadata.labels == want.metadata.labels
        && have.metadata.owner_references == want.metadata.owner_references
}

/// With the DRAPartitionableDevices gate off the API server silently drops counter fields.
fn warn_if_dropped(want: &ResourceSlice, written: &ResourceSlice) {
    let counters = |s: &ResourceSlice| {
        s.spec.shared_counters.as_ref().map_or(0, Vec::len)
            + s.spec.devices.as_ref().map_or(0, |d| d.iter().filter(|d| d.consumes_counters.is_some()).count())
    };
    if counters(written) < counters(want) {
        tracing::error!(
            slice = want.metadata.name.as_deref().unwrap_or(""),
            "the API server dropped sharedCounters/consumesCounters: is the DRAPartitionableDevices feature gate on?"
        );
    }
}
