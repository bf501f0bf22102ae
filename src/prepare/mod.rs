//! The prepare/unprepare state machine: exact MIG creation, CDI, checkpoint, rollback, recovery.
//!
//! Order of a dynamic MIG prepare: checkpoint the intent (PrepareStarted) → create the GI at the
//! allocated placement → record it → create its default CI → record the CI, its MIG UUID and
//! capability minors → write the CDI spec → PrepareCompleted. Any failure after the first NVML
//! mutation rolls back inside the same call. Unprepare reverses it: UnprepareStarted → delete the
//! CDI spec → destroy CI then GI (after checking they are still the ones we made) → drop the claim.
//!
//! Concurrency: each GPU has its own lock ([`locks`]), so claims on different GPUs run in
//! parallel; the checkpoint is a locked read-modify-write shared by every plugin process.

mod cleanup;
mod locks;
mod plan;
mod recovery;
mod status;

pub use cleanup::{BrokenSpec, CleanupError, CleanupReport, LostClaim, OrphanInstance, Outcome, StaleSpec};
pub use recovery::{OrphanAction, OrphanPolicy, RecoveryReport};
pub use status::{DeviceStatusData, Placement, status_data};

use crate::cdi::{self, CdiError, CdiWriter};
use crate::claims::{AllocationResult, ClaimRef};
use crate::gpu::{GpuBackend, GpuError, GpuInfo, GpuInstance, NvmlCode};
use crate::mig::catalog::GpuModel;
use crate::mig::devices::GpuMode;
use crate::slurm::{self, GpuSlurm, NodeGpu, NodeMig, Resolution};
use crate::state::{
    Checkpoint, CheckpointStore, ClaimRecord, ClaimState, DeviceRecord, MigOwner, MigRecord, StateError,
};
use locks::{ClaimLocks, GpuLock};
use plan::PlannedDevice;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A point in prepare or unprepare, right after a checkpoint write or an NVML mutation. Tests
/// kill the process (or panic) there to prove recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    PrepareStarted,
    GiCreated,
    GiRecorded,
    CiCreated,
    CiRecorded,
    CdiWritten,
    PrepareCompleted,
    UnprepareStarted,
    CdiDeleted,
    CiDestroyed,
    GiDestroyed,
    ClaimDropped,
}

impl Step {
    pub const ALL: [Step; 12] = [
        Self::PrepareStarted,
        Self::GiCreated,
        Self::GiRecorded,
        Self::CiCreated,
        Self::CiRecorded,
        Self::CdiWritten,
        Self::PrepareCompleted,
        Self::UnprepareStarted,
        Self::CdiDeleted,
        Self::CiDestroyed,
        Self::GiDestroyed,
        Self::ClaimDropped,
    ];

    /// kebab-case name, as `MIGDRA_CRASH_AT` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::PrepareStarted => "prepare-started",
            Self::GiCreated => "gi-created",
            Self::GiRecorded => "gi-recorded",
            Self::CiCreated => "ci-created",
            Self::CiRecorded => "ci-recorded",
            Self::CdiWritten => "cdi-written",
            Self::PrepareCompleted => "prepare-completed",
            Self::UnprepareStarted => "unprepare-started",
            Self::CdiDeleted => "cdi-deleted",
            Self::CiDestroyed => "ci-destroyed",
            Self::GiDestroyed => "gi-destroyed",
            Self::ClaimDropped => "claim-dropped",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s.trim())
    }
}

/// Called at every [`Step`].
pub type Hook = Arc<dyn Fn(Step) + Send + Sync>;

/// Told the outcome of every claim, e.g. to write the claim's status for slurm-bridge. Called on
/// the claim's blocking thread after the engine is done; it must not fail the call.
pub trait Reporter: Send + Sync {
    fn prepared(&self, claim: &ClaimRef, devices: &[PreparedDevice]);
    fn failed(&self, claim: &ClaimRef, error: &str);
    fn unprepared(&self, claim: &ClaimRef);
}

/// Per-claim failure. Messages name the claim, the device and the NVML error.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("claim {claim}: device {device}: {reason}")]
    BadDevice { claim: String, device: String, reason: String },
    #[error("claim {claim}: device {device} is already prepared for claim {other}")]
    DeviceInUse { claim: String, device: String, other: String },
    #[error(
        "claim {claim}: device {device} overlaps {held}, prepared for claim {other}; the scheduler allocated both, so the node's slices or the allocation are stale"
    )]
    Overlaps { claim: String, device: String, held: String, other: String },
    #[error("claim {claim}: its allocation changed from [{was}] to [{now}] under the same UID; unprepare it first")]
    AllocationChanged { claim: String, was: String, now: String },
    #[error("claim {claim}: device {device}: failed to {step}: {source}")]
    Nvml { claim: String, device: String, step: &'static str, source: GpuError },
    #[error("claim {claim}: {source}")]
    Cdi { claim: String, source: CdiError },
    #[error("claim {claim}: checkpoint: {source}")]
    Checkpoint { claim: String, source: StateError },
    #[error("claim {claim}: device {device}: GPU is busy: {source}")]
    Busy { claim: String, device: String, source: std::io::Error },
    #[error("failed to discover GPUs: {0}")]
    Discovery(GpuError),
    #[error("cannot create the state directory {}: {source}", path.display())]
    StateDir { path: PathBuf, source: std::io::Error },
}

impl PrepareError {
    /// The fixed label a failure is counted under in `migdra_errors_total`: `bad-device`,
    /// `device-in-use`, `overlaps`, `allocation-changed`, `nvml-<code>` (e.g. `nvml-in-use`), `cdi`,
    /// `checkpoint`, `timeout` (a GPU lock held too long), `discovery`, `state-dir`.
    pub fn reason(&self) -> String {
        match self {
            Self::BadDevice { .. } => "bad-device".into(),
            Self::DeviceInUse { .. } => "device-in-use".into(),
            Self::Overlaps { .. } => "overlaps".into(),
            Self::AllocationChanged { .. } => "allocation-changed".into(),
            Self::Nvml { source, .. } => match source.code() {
                Some(code) => format!("nvml-{}", code.name()),
                None => "nvml".into(),
            },
            Self::Cdi { .. } => "cdi".into(),
            Self::Checkpoint { .. } => "checkpoint".into(),
            Self::Busy { .. } => "timeout".into(),
            Self::Discovery(_) => "discovery".into(),
            Self::StateDir { .. } => "state-dir".into(),
        }
    }

    fn bad(claim: &ClaimRef, device: &str, reason: String) -> Self {
        Self::BadDevice { claim: describe(claim), device: device.to_string(), reason }
    }
}

/// `namespace/name (uid)`.
fn describe(claim: &ClaimRef) -> String {
    format!("{}/{} ({})", claim.namespace, claim.name, claim.uid)
}

/// The same, for a claim the checkpoint holds.
fn describe_record(rec: &ClaimRecord) -> String {
    format!("{}/{} ({})", rec.namespace, rec.name, rec.uid)
}

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// DRA driver name, e.g. `mig.slinky.slurm.net`.
    pub driver: String,
    /// This node's pool (the node name).
    pub pool: String,
    /// MIG mode for MIG-enabled GPUs without an override.
    pub mig_mode: GpuMode,
    /// Per-GPU MIG mode by UUID or NVML index.
    pub mode_overrides: Vec<(String, GpuMode)>,
    pub orphans: OrphanPolicy,
    pub state_dir: PathBuf,
    pub cdi_dir: PathBuf,
    /// Longest wait for another process's GPU lock.
    pub lock_timeout: Duration,
    /// Where each GPU's Slurm index and shards come from.
    pub slurm: slurm::Settings,
}

impl Options {
    /// Defaults for a node: dynamic MIG, orphans destroyed, 10 s lock timeout.
    pub fn new(driver: &str, pool: &str, state_dir: PathBuf, cdi_dir: PathBuf) -> Self {
        Self {
            driver: driver.to_string(),
            pool: pool.to_string(),
            mig_mode: GpuMode::Dynamic,
            mode_overrides: Vec::new(),
            orphans: OrphanPolicy::Destroy,
            state_dir,
            cdi_dir,
            lock_timeout: Duration::from_secs(10),
            slurm: slurm::Settings::none(pool),
        }
    }
}

/// A GPU of this node as the engine sees it.
#[derive(Debug)]
pub struct GpuEntry {
    pub info: GpuInfo,
    pub model: GpuModel,
    pub mode: GpuMode,
    pub slurm: GpuSlurm,
    lock: GpuLock,
}

/// What the Slurm sources need to know about a GPU: its device files, and for a MIG GPU the
/// existing instances with their capability minors (Slurm may list them as GPUs).
fn node_gpu(backend: &dyn GpuBackend, info: &GpuInfo, model: &GpuModel) -> Result<NodeGpu, GpuError> {
    let mut migs = Vec::new();
    if info.mig_enabled {
        for gi in backend.gpu_instances(&info.uuid)? {
            for ci in backend.compute_instances(&info.uuid, gi.id)? {
                let (gi_cap, ci_cap) = backend.mig_capability_minors(info.minor, gi.id, ci.id)?;
                migs.push(NodeMig { gi: gi.id, ci: ci.id, gi_cap, ci_cap });
            }
        }
    }
    Ok(NodeGpu {
        nvml_index: info.index,
        minor: info.minor,
        uuid: info.uuid.clone(),
        pci_bus_id: info.pci_bus_id.clone(),
        mig_enabled: info.mig_enabled,
        memory_slices: model.memory_slices,
        migs,
    })
}

/// One prepared device, as the kubelet needs it plus the status data for the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    pub requests: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_ids: Vec<String>,
    pub status: DeviceStatusData,
}

/// The prepare engine of one node.
pub struct Engine {
    backend: Arc<dyn GpuBackend>,
    gpus: Vec<GpuEntry>,
    store: CheckpointStore,
    cdi: CdiWriter,
    opts: Options,
    boot_id: String,
    hook: Option<Hook>,
    slurm: Resolution,
    /// One call at a time per claim UID.
    claims: ClaimLocks,
}

/// What one device of a claim holds on the hardware while a prepare runs, for rollback.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    gi: Option<u32>,
    ci: Option<u32>,
}

impl Engine {
    /// Discover the node's GPUs and open the checkpoint and CDI directories.
    ///
    /// # Errors
    /// Discovery fails, or a GPU's model cannot be described.
    pub fn new(backend: Arc<dyn GpuBackend>, opts: Options) -> Result<Self, PrepareError> {
        let boot_id = backend.boot_id().map_err(PrepareError::Discovery)?;
        let mut gpus = Vec::new();
        let mut found = Vec::new();
        for info in backend.gpus().map_err(PrepareError::Discovery)? {
            let model = backend.model(&info.uuid).map_err(PrepareError::Discovery)?;
            let mode = if !info.mig_enabled {
                GpuMode::Full
            } else {
                opts.mode_overrides
                    .iter()
                    .find(|(sel, _)| sel.eq_ignore_ascii_case(&info.uuid) || *sel == info.index.to_string())
                    .map_or(opts.mig_mode, |(_, m)| *m)
            };
            found.push((info, model, mode));
        }
        let node_gpus = found
            .iter()
            .map(|(info, model, _)| node_gpu(backend.as_ref(), info, model))
            .collect::<Result<Vec<_>, _>>()
            .map_err(PrepareError::Discovery)?;
        let slurm = slurm::resolve(&opts.slurm, &node_gpus);
        for ((info, model, mode), s) in found.into_iter().zip(&slurm.gpus) {
            let lock = GpuLock::new(&opts.state_dir, &info.uuid);
            gpus.push(GpuEntry { info, model, mode, slurm: s.clone(), lock });
        }
        crate::files::create_dir(&opts.state_dir, 0o750)
            .map_err(|source| PrepareError::StateDir { path: opts.state_dir.clone(), source })?;
        Ok(Self {
            store: CheckpointStore::new(&opts.state_dir),
            cdi: CdiWriter::new(&opts.cdi_dir, &opts.driver),
            backend,
            gpus,
            opts,
            boot_id,
            hook: None,
            slurm,
            claims: ClaimLocks::default(),
        })
    }

    /// How each GPU's Slurm index was decided, with the warnings to log.
    pub fn slurm(&self) -> &Resolution {
        &self.slurm
    }

    /// Call `hook` at every [`Step`] (tests use it to crash there).
    pub fn with_hook(mut self, hook: Hook) -> Self {
        self.hook = Some(hook);
        self
    }

    pub fn gpus(&self) -> &[GpuEntry] {
        &self.gpus
    }

    /// The hardware this engine drives.
    pub fn backend(&self) -> &Arc<dyn GpuBackend> {
        &self.backend
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The checkpoint as it is on disk now.
    ///
    /// # Errors
    /// It cannot be read.
    pub fn checkpoint(&self) -> Result<Checkpoint, StateError> {
        self.store.read()
    }

    /// Checkpoint writes since start.
    pub fn checkpoint_writes(&self) -> u64 {
        self.store.writes()
    }

    fn step(&self, step: Step) {
        if let Some(hook) = &self.hook {
            hook(step);
        }
    }

    fn gpu(&self, uuid: &str) -> Option<&GpuEntry> {
        self.gpus.iter().find(|g| g.info.uuid == uuid)
    }

    /// Prepare a claim: make every allocated device of our driver exist and return its CDI IDs.
    /// Idempotent: a completed claim returns its devices again without touching NVML.
    ///
    /// # Errors
    /// Only this claim fails; whatever this call created has been destroyed again.
    pub fn prepare(&self, claim: &ClaimRef, results: &[AllocationResult]) -> Result<Vec<PreparedDevice>, PrepareError> {
        let _claim = self.claims.lock(&claim.uid);
        let who = describe(claim);
        let planned = plan::plan(claim, results, &self.opts.driver, &self.opts.pool, &self.gpus)?;
        let names: Vec<&str> = planned.iter().map(|p| p.device.as_str()).collect();
        let ckpt = |source| PrepareError::Checkpoint { claim: who.clone(), source };

        if let Some(rec) = self.store.read().map_err(ckpt)?.claims.get(&claim.uid) {
            same_allocation(&who, rec, &names)?;
            if rec.state == ClaimState::PrepareCompleted && !rec.needs_recreate {
                // The kubelet asks again when a container (re)starts: the runtime will resolve the
                // IDs we return, so the spec behind them must still be there.
                self.repair_spec(rec)?;
                return Ok(self.prepared(rec));
            }
        }
        let record =
            self.store.update(&self.boot_id, |cp| self.start(cp, claim, &who, &planned, &names)).map_err(ckpt)??;
        self.step(Step::PrepareStarted);

        let mut held = vec![Held::default(); planned.len()];
        match self.make(claim, &who, &planned, &record, &mut held) {
            Ok(devices) => Ok(devices),
            Err(e) => {
                let rollback = self.rollback(claim, &planned, &held, &e.to_string());
                Err(match rollback {
                    Ok(()) => e,
                    Err(r) => PrepareError::BadDevice {
                        claim: who,
                        device: "-".into(),
                        reason: format!("{e}; rollback left instances behind, the next call retries: {r}"),
                    },
                })
            }
        }
    }

    /// Inside the checkpoint lock: refuse devices held by other claims, then record the intent.
    fn start(
        &self,
        cp: &mut Checkpoint,
        claim: &ClaimRef,
        who: &str,
        planned: &[PlannedDevice<'_>],
        names: &[&str],
    ) -> Result<ClaimRecord, PrepareError> {
        for (uid, other) in cp.claims.iter().filter(|(uid, _)| **uid != claim.uid) {
            if let Some(d) = other.devices.iter().find(|d| names.contains(&d.device.as_str())) {
                return Err(PrepareError::DeviceInUse {
                    claim: who.to_string(),
                    device: d.device.clone(),
                    other: format!("{}/{} ({uid})", other.namespace, other.name),
                });
            }
            // Said here, with both claims named, rather than as NVML's bare INSUFFICIENT_RESOURCES.
            for p in planned {
                let Some(m) = &p.mig else { continue };
                let (start, end) = (m.start, m.start + m.profile.memory_slices);
                let held = other.devices.iter().find(|d| {
                    d.gpu_uuid == p.gpu.info.uuid
                        && d.mig.as_ref().is_some_and(|o| o.start < end && start < o.start + o.size)
                });
                if let Some(d) = held {
                    return Err(PrepareError::Overlaps {
                        claim: who.to_string(),
                        device: p.device.clone(),
                        held: d.device.clone(),
                        other: format!("{}/{} ({uid})", other.namespace, other.name),
                    });
                }
            }
        }
        let earlier = cp.claims.get(&claim.uid);
        if let Some(rec) = earlier {
            same_allocation(who, rec, names)?;
        }
        let devices = planned
            .iter()
            .map(|p| {
                let before = earlier.and_then(|r| r.devices.iter().find(|d| d.device == p.device));
                DeviceRecord {
                    requests: p.requests.clone(),
                    pool: self.opts.pool.clone(),
                    device: p.device.clone(),
                    gpu_uuid: p.gpu.info.uuid.clone(),
                    pci_bus_id: p.gpu.info.pci_bus_id.clone(),
                    gpu_minor: p.gpu.info.minor,
                    gpu_index: p.gpu.info.index,
                    mig: p.mig.as_ref().map(|m| {
                        let intent =
                            MigRecord::intent(m.owner, m.profile.id, &m.profile.name, m.start, m.profile.memory_slices);
                        // Keep what an earlier attempt made, if it was for the same partition.
                        before.and_then(|b| b.mig.clone()).filter(|k| k.forgotten() == intent).unwrap_or(intent)
                    }),
                    cdi_ids: Vec::new(),
                }
            })
            .collect();
        let record = ClaimRecord {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            state: ClaimState::PrepareStarted,
            devices,
            needs_recreate: earlier.is_some_and(|r| r.needs_recreate),
            last_error: None,
        };
        cp.claims.insert(claim.uid.clone(), record.clone());
        Ok(record)
    }

    /// Create (or adopt) every device, write the CDI spec, complete the claim.
    fn make(
        &self,
        claim: &ClaimRef,
        who: &str,
        planned: &[PlannedDevice<'_>],
        record: &ClaimRecord,
        held: &mut [Held],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let mut devices = record.devices.clone();
        for (i, p) in planned.iter().enumerate() {
            if let Some(m) = &record.devices[i].mig {
                devices[i].mig = Some(self.ensure_mig(claim, who, i, p, m, &mut held[i])?);
            }
        }
        let cdi_devices = self.spec_devices(who, &claim.uid, &devices)?;
        let ids = self
            .cdi
            .write(&claim.uid, &cdi_devices)
            .map_err(|source| PrepareError::Cdi { claim: who.into(), source })?;
        self.step(Step::CdiWritten);
        let done = self
            .update_claim(who, &claim.uid, |rec| {
                rec.state = ClaimState::PrepareCompleted;
                rec.needs_recreate = false;
                for (d, id) in rec.devices.iter_mut().zip(&ids) {
                    d.cdi_ids = vec![id.clone()];
                }
            })?
            .unwrap_or_else(|| record.clone());
        self.step(Step::PrepareCompleted);
        Ok(self.prepared(&done))
    }

    /// The CDI devices of a claim's spec, from what its record says was made. Reads NVML only for
    /// the nvidia-caps major.
    fn spec_devices(
        &self,
        who: &str,
        uid: &str,
        devices: &[DeviceRecord],
    ) -> Result<Vec<cdi::CdiDevice>, PrepareError> {
        let mut caps_major = None;
        let mut out = Vec::with_capacity(devices.len());
        for d in devices {
            let name = cdi::device_name(uid, &d.device);
            out.push(match &d.mig {
                None => cdi::gpu_device(name, d.gpu_minor, &d.gpu_uuid),
                Some(m) => {
                    let major = match caps_major {
                        Some(major) => major,
                        None => *caps_major.insert(
                            self.nvml(who, &d.device, "read the nvidia-caps major", || self.backend.caps_major())?,
                        ),
                    };
                    cdi::mig_device(
                        name,
                        d.gpu_minor,
                        m.uuid.as_deref().unwrap_or_default(),
                        m.gi_cap_minor.unwrap_or_default(),
                        m.ci_cap_minor.unwrap_or_default(),
                        major,
                    )
                }
            });
        }
        Ok(out)
    }

    /// Make a prepared claim's spec on disk what its record says, rewriting a deleted or changed
    /// one; returns what the file was before.
    ///
    /// # Errors
    /// The spec cannot be written.
    pub(crate) fn repair_spec(&self, rec: &ClaimRecord) -> Result<cdi::SpecState, PrepareError> {
        let who = describe_record(rec);
        let devices = self.spec_devices(&who, &rec.uid, &rec.devices)?;
        let (_, state) =
            self.cdi.ensure(&rec.uid, &devices).map_err(|source| PrepareError::Cdi { claim: who.clone(), source })?;
        if state != cdi::SpecState::Intact {
            tracing::warn!(claim = %who, spec = state.as_str(), "the claim's CDI spec was {} on disk; wrote it again", state.as_str());
        }
        Ok(state)
    }

    /// Make one MIG device exist and return its record with IDs, UUID and capability minors.
    fn ensure_mig(
        &self,
        claim: &ClaimRef,
        who: &str,
        i: usize,
        p: &PlannedDevice<'_>,
        m: &MigRecord,
        held: &mut Held,
    ) -> Result<MigRecord, PrepareError> {
        let gpu = p.gpu;
        let uuid = gpu.info.uuid.as_str();
        let dev = p.device.as_str();
        let _guard = gpu.lock.lock(self.opts.lock_timeout).map_err(|source| PrepareError::Busy {
            claim: who.into(),
            device: dev.into(),
            source,
        })?;
        let gis = self.nvml(who, dev, "list GPU instances", || self.backend.gpu_instances(uuid))?;
        let at_placement = gis.iter().find(|g| g.profile_id == m.profile_id && g.start == m.start);
        let mut m = m.clone();
        let gi = match (at_placement, m.owner) {
            (Some(g), MigOwner::Static) => g.id,
            (None, MigOwner::Static) => {
                return Err(PrepareError::bad(
                    claim,
                    dev,
                    format!("no {} instance at placement {} exists on this static-MIG GPU", m.profile, m.start),
                ));
            }
            (Some(g), MigOwner::Dynamic) => {
                if let Some(other) = self
                    .holder(uuid, g, &claim.uid)
                    .map_err(|source| PrepareError::Checkpoint { claim: who.into(), source })?
                {
                    return Err(PrepareError::DeviceInUse { claim: who.into(), device: dev.into(), other });
                }
                // Ours from an earlier attempt that crashed after creating it: adopt it.
                g.id
            }
            (None, MigOwner::Dynamic) => {
                let g = self.nvml(who, dev, "create the GPU instance", || {
                    self.backend.create_gpu_instance(uuid, m.profile_id, m.start)
                })?;
                held.gi = Some(g.id);
                self.step(Step::GiCreated);
                g.id
            }
        };
        held.gi = Some(gi);
        if m.gi_id != Some(gi) {
            m.gi_id = Some(gi);
            m.ci_id = None;
            m.uuid = None;
            self.record_mig(who, &claim.uid, i, &m)?;
            self.step(Step::GiRecorded);
        }
        let cis = self.nvml(who, dev, "list compute instances", || self.backend.compute_instances(uuid, gi))?;
        let ci = match cis.into_iter().next() {
            Some(ci) => ci,
            None if m.owner == MigOwner::Static => {
                return Err(PrepareError::bad(claim, dev, format!("static GPU instance {gi} has no compute instance")));
            }
            None => {
                let ci_profile =
                    p.mig.as_ref().and_then(|pm| pm.profile.default_ci()).map(|c| c.id).unwrap_or_default();
                let ci = self.nvml(who, dev, "create the compute instance", || {
                    self.backend.create_compute_instance(uuid, gi, ci_profile)
                })?;
                held.ci = Some(ci.id);
                self.step(Step::CiCreated);
                ci
            }
        };
        held.ci = Some(ci.id);
        let (gi_cap, ci_cap) = self.nvml(who, dev, "read the capability minors", || {
            self.backend.mig_capability_minors(gpu.info.minor, gi, ci.id)
        })?;
        if m.ci_id != Some(ci.id) || m.uuid.as_deref() != Some(ci.uuid.as_str()) || m.ci_cap_minor != Some(ci_cap) {
            m.ci_id = Some(ci.id);
            m.uuid = Some(ci.uuid.clone());
            m.gi_cap_minor = Some(gi_cap);
            m.ci_cap_minor = Some(ci_cap);
            self.record_mig(who, &claim.uid, i, &m)?;
            self.step(Step::CiRecorded);
        }
        Ok(m)
    }

    /// The claim (other than `uid`) whose checkpoint entry holds this GI, if any.
    fn holder(&self, gpu_uuid: &str, gi: &GpuInstance, uid: &str) -> Result<Option<String>, StateError> {
        let cp = self.store.read()?;
        Ok(cp.claims.values().filter(|c| c.uid != uid).find_map(|c| {
            c.devices
                .iter()
                .any(|d| d.gpu_uuid == gpu_uuid && d.mig.as_ref().is_some_and(|m| holds(m, gi)))
                .then(|| describe_record(c))
        }))
    }

    fn record_mig(&self, who: &str, uid: &str, i: usize, m: &MigRecord) -> Result<(), PrepareError> {
        self.update_claim(who, uid, |rec| {
            if let Some(d) = rec.devices.get_mut(i) {
                d.mig = Some(m.clone());
            }
        })?;
        Ok(())
    }

    /// Change one claim's record under the checkpoint lock; `None` when the claim is gone.
    fn update_claim(
        &self,
        who: &str,
        uid: &str,
        f: impl FnOnce(&mut ClaimRecord),
    ) -> Result<Option<ClaimRecord>, PrepareError> {
        let r = self.store.update(&self.boot_id, |cp| {
            Ok::<_, std::convert::Infallible>(cp.claims.get_mut(uid).map(|rec| {
                f(rec);
                rec.clone()
            }))
        });
        match r {
            Ok(Ok(rec)) => Ok(rec),
            Ok(Err(never)) => match never {},
            Err(source) => Err(PrepareError::Checkpoint { claim: who.into(), source }),
        }
    }

    fn nvml<T>(
        &self,
        who: &str,
        device: &str,
        step: &'static str,
        f: impl FnOnce() -> Result<T, GpuError>,
    ) -> Result<T, PrepareError> {
        f().map_err(|source| PrepareError::Nvml { claim: who.into(), device: device.into(), step, source })
    }

    /// Undo a failed prepare: destroy the instances this claim holds (CI, then GI), delete its
    /// CDI spec and drop it from the checkpoint. If something cannot be destroyed the claim stays
    /// in the checkpoint with the error, so the next prepare or unprepare finishes the job.
    fn rollback(
        &self,
        claim: &ClaimRef,
        planned: &[PlannedDevice<'_>],
        held: &[Held],
        error: &str,
    ) -> Result<(), String> {
        let mut left = Vec::new();
        for (p, h) in planned.iter().zip(held).rev() {
            if p.mig.as_ref().is_none_or(|m| m.owner != MigOwner::Dynamic) {
                continue;
            }
            let Some(gi) = h.gi else { continue };
            let uuid = p.gpu.info.uuid.as_str();
            let Ok(_guard) = p.gpu.lock.lock(self.opts.lock_timeout) else {
                left.push(format!("{}: GPU lock", p.device));
                continue;
            };
            if let Err(e) = destroy_gi(self.backend.as_ref(), uuid, gi, h.ci) {
                left.push(format!("{}: {e}", p.device));
            }
        }
        let _ = self.cdi.remove(&claim.uid);
        let error = error.to_string();
        let outcome = self.store.update(&self.boot_id, |cp| {
            if left.is_empty() {
                cp.claims.remove(&claim.uid);
            } else if let Some(rec) = cp.claims.get_mut(&claim.uid) {
                rec.last_error = Some(error);
            }
            Ok::<_, std::convert::Infallible>(())
        });
        if let Err(e) = outcome {
            left.push(format!("checkpoint: {e}"));
        }
        if left.is_empty() { Ok(()) } else { Err(left.join("; ")) }
    }

    fn prepared(&self, rec: &ClaimRecord) -> Vec<PreparedDevice> {
        rec.devices
            .iter()
            .map(|d| {
                let unknown = GpuSlurm {
                    index: Some(d.gpu_index),
                    source: slurm::Source::Nvml,
                    shards: 1,
                    memory_slices: 1,
                    migs: Vec::new(),
                };
                let slurm = self.gpu(&d.gpu_uuid).map_or(&unknown, |g| &g.slurm);
                PreparedDevice {
                    requests: d.requests.clone(),
                    pool: d.pool.clone(),
                    device: d.device.clone(),
                    cdi_ids: d.cdi_ids.clone(),
                    status: status_data(d, slurm),
                }
            })
            .collect()
    }

    /// Unprepare a claim: delete its CDI spec, destroy its dynamic instances (CI, then GI), forget
    /// it. An unknown claim succeeds.
    ///
    /// # Errors
    /// NVML refuses a destroy (e.g. IN_USE); the claim stays UnprepareStarted for the retry.
    pub fn unprepare(&self, uid: &str) -> Result<(), PrepareError> {
        let _claim = self.claims.lock(uid);
        let ckpt = |source| PrepareError::Checkpoint { claim: uid.to_string(), source };
        let Some(rec) = self.store.read().map_err(ckpt)?.claims.get(uid).cloned() else {
            return Ok(());
        };
        let who = describe_record(&rec);
        if rec.state != ClaimState::UnprepareStarted {
            self.update_claim(&who, uid, |r| r.state = ClaimState::UnprepareStarted)?;
            self.step(Step::UnprepareStarted);
        }
        self.cdi.remove(uid).map_err(|source| PrepareError::Cdi { claim: who.clone(), source })?;
        self.step(Step::CdiDeleted);
        for (i, d) in rec.devices.iter().enumerate().rev() {
            let Some(m) = d.mig.as_ref().filter(|m| m.owner == MigOwner::Dynamic) else { continue };
            if let Err(e) = self.release(uid, &who, d, m) {
                let _ = self.update_claim(&who, uid, |r| r.last_error = Some(e.to_string()));
                return Err(e);
            }
            self.record_mig(&who, uid, i, &m.forgotten())?;
        }
        self.store
            .update(&self.boot_id, |cp| {
                cp.claims.remove(uid);
                Ok::<_, std::convert::Infallible>(())
            })
            .map_err(ckpt)?
            .unwrap_or_else(|never| match never {});
        self.step(Step::ClaimDropped);
        Ok(())
    }

    /// Destroy one dynamic instance of a claim, after checking it is still the one we made: same
    /// profile and placement, and held by no other claim (GI IDs are reused by the driver).
    fn release(&self, uid: &str, who: &str, d: &DeviceRecord, m: &MigRecord) -> Result<(), PrepareError> {
        let Some(gpu) = self.gpu(&d.gpu_uuid) else { return Ok(()) };
        let uuid = gpu.info.uuid.as_str();
        let dev = d.device.as_str();
        let _guard = gpu.lock.lock(self.opts.lock_timeout).map_err(|source| PrepareError::Busy {
            claim: who.into(),
            device: dev.into(),
            source,
        })?;
        let gis = match self.backend.gpu_instances(uuid) {
            Err(e) if e.code() == Some(NvmlCode::NotSupported) => return Ok(()),
            r => self.nvml(who, dev, "list GPU instances", || r)?,
        };
        let ours = gis.iter().find(|g| match m.gi_id {
            Some(id) => g.id == id && g.profile_id == m.profile_id && g.start == m.start,
            None => g.profile_id == m.profile_id && g.start == m.start,
        });
        let Some(gi) = ours else { return Ok(()) };
        let other =
            self.holder(uuid, gi, uid).map_err(|source| PrepareError::Checkpoint { claim: who.into(), source })?;
        if other.is_some() {
            return Ok(());
        }
        let cis = self.nvml(who, dev, "list compute instances", || self.backend.compute_instances(uuid, gi.id))?;
        for ci in cis {
            gone_ok(self.backend.destroy_compute_instance(uuid, gi.id, ci.id)).map_err(|source| {
                PrepareError::Nvml {
                    claim: who.into(),
                    device: dev.into(),
                    step: "destroy the compute instance",
                    source,
                }
            })?;
            self.step(Step::CiDestroyed);
        }
        gone_ok(self.backend.destroy_gpu_instance(uuid, gi.id)).map_err(|source| PrepareError::Nvml {
            claim: who.into(),
            device: dev.into(),
            step: "destroy the GPU instance",
            source,
        })?;
        self.step(Step::GiDestroyed);
        Ok(())
    }
}

/// Whether a checkpointed MIG device is this GI: by ID when recorded, else by its intent.
fn holds(m: &MigRecord, gi: &GpuInstance) -> bool {
    match m.gi_id {
        Some(id) => id == gi.id && m.profile_id == gi.profile_id && m.start == gi.start,
        None => m.profile_id == gi.profile_id && m.start == gi.start,
    }
}

fn same_allocation(who: &str, rec: &ClaimRecord, names: &[&str]) -> Result<(), PrepareError> {
    let mut was: Vec<&str> = rec.devices.iter().map(|d| d.device.as_str()).collect();
    let mut now = names.to_vec();
    was.sort_unstable();
    now.sort_unstable();
    if was == now {
        return Ok(());
    }
    Err(PrepareError::AllocationChanged { claim: who.to_string(), was: was.join(", "), now: now.join(", ") })
}

/// NOT_FOUND on a destroy means someone already did it.
fn gone_ok(r: Result<(), GpuError>) -> Result<(), GpuError> {
    match r {
        Err(e) if e.code() == Some(NvmlCode::NotFound) => Ok(()),
        r => r,
    }
}

/// Destroy a GI's CIs (the one we know of, or all) and then the GI.
fn destroy_gi(backend: &dyn GpuBackend, gpu: &str, gi: u32, ci: Option<u32>) -> Result<(), GpuError> {
    let cis = match backend.compute_instances(gpu, gi) {
        Ok(cis) => cis.into_iter().map(|c| c.id).collect(),
        Err(e) if e.code() == Some(NvmlCode::NotFound) => return Ok(()),
        Err(_) => ci.into_iter().collect::<Vec<_>>(),
    };
    for c in cis {
        gone_ok(backend.destroy_compute_instance(gpu, gi, c))?;
    }
    gone_ok(backend.destroy_gpu_instance(gpu, gi))
}
