//! The prepare/unprepare state machine: exact MIG creation, CDI, checkpoint, rollback, recovery.
//!
//! Order of a dynamic MIG prepare: checkpoint the intent (PrepareStarted) → create the GI at the
//! allocated placement → create its default CI → read its MIG UUID and capability minors → write
//! the device metadata files and the CDI spec that mounts them → PrepareCompleted, with the GI and
//! CI IDs, UUID and minors. Any failure after the first NVML mutation rolls back inside the same
//! call. Unprepare reverses it: UnprepareStarted → delete the CDI spec and the metadata files →
//! destroy CI then GI (after checking they are still the ones we made) → drop the claim.
//!
//! Durable writes (temp file, fsync, rename, fsync of the directory) set a prepare's latency on a
//! real disk, so each call makes two: the checkpoint writes that open and close it. Nothing in
//! between needs one:
//! - the intent reserves the placement against every other claim, so an instance a crash leaves
//!   before the completion is found by profile and placement, adopted by the retry, destroyed by
//!   an unprepare, and never swept as an orphan; its IDs need no record of their own;
//! - the CDI spec is renamed into place without fsync: a crashed process leaves the page cache
//!   behind, and a power loss reboots the node, so every claim is re-created and its spec written
//!   again; within a boot, a prepared claim's missing spec is rewritten from its record;
//! - a MIG instance never outlives a reboot, so only a process crash can leave one behind, and a
//!   process crash loses no write that returned, synced or not.
//!
//! The two that stay durable are what a reboot must keep: which claims the node holds (they are
//! re-created at the same placements) and which it gave up (a lost removal would reserve a
//! placement for a claim the kubelet has forgotten). Their fsync also reports a write-back error
//! (EIO, a full disk) before NVML or the kubelet is told anything.
//!
//! Concurrency: each GPU has its own lock ([`locks`]), so claims on different GPUs run in
//! parallel; the checkpoint is a locked read-modify-write shared by every plugin process.
//!
//! Files: `create` (prepare and its rollback), `admin` (admin access: a spec, no instance),
//! `release` (unprepare), `instances` (the MIG helpers prepare, unprepare, recovery and cleanup
//! share), `records` (a claim's checkpoint record and the kubelet's answer from it), `spec` (a
//! claim's CDI spec from its record, and its repair), `step` (the points tests stop at), `error`,
//! `plan` (an allocation checked against the node), `recovery`, `cleanup`, `locks`, `bridge_data`
//! (what slurm-bridge reads per device), `metadata` (each claim's device metadata files, KEP-5304).

mod admin;
mod bridge_data;
mod cleanup;
mod create;
mod error;
mod health;
mod instances;
mod locks;
mod metadata;
mod plan;
mod records;
mod recovery;
mod release;
mod spec;
mod stale;
mod step;

pub use bridge_data::{DeviceStatusData, Placement, admin_status_data, status_data};
pub use cleanup::{BrokenSpec, CleanupError, CleanupReport, LostClaim, OrphanInstance, Outcome, StaleSpec};
pub use error::PrepareError;
pub use health::node_health;
pub use recovery::{OrphanAction, OrphanPolicy, RecoveryReport};
pub use stale::{StaleClaim, StaleReason, Sweep};
pub use step::{Hook, Step, reached, set_process_hook};

use crate::cdi::CdiWriter;
use crate::cdi::metadata::MetadataDir;
use crate::claims::ClaimRef;
use crate::gpu::{GpuBackend, GpuError, GpuInfo};
use crate::mig::allowlist::Allowlist;
use crate::mig::catalog::GpuModel;
use crate::mig::devices::GpuMode;
use crate::mig::naming::NameStyle;
use crate::slurm::{self, GpuSlurm, NodeGpu, NodeMig, Resolution};
use crate::state::{Checkpoint, CheckpointStore, StateError};
use locks::{ClaimLocks, GpuLock};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Told the outcome of every claim, e.g. to write the claim's status for slurm-bridge. Called on
/// the claim's blocking thread after the engine is done; it must not fail the call.
pub trait Reporter: Send + Sync {
    fn prepared(&self, claim: &ClaimRef, devices: &[PreparedDevice]);
    fn failed(&self, claim: &ClaimRef, error: &str);
    fn unprepared(&self, claim: &ClaimRef);
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
    /// Where each claim's device metadata files go (KEP-5304): `<plugin dir>/dra-device-metadata`.
    pub metadata_dir: PathBuf,
    /// Longest wait for another process's GPU lock.
    pub lock_timeout: Duration,
    /// Where each GPU's Slurm index and shards come from.
    pub slurm: slurm::Settings,
    /// How published device names are formed; names of both styles are accepted on prepare.
    pub device_names: NameStyle,
    /// The profiles dynamic GPUs publish. Prepare takes any valid partition, so a claim allocated
    /// before the list changed still runs.
    pub profiles: Allowlist,
    /// Where a prepare looks for the host device nodes a spec names by path (`<root>/dev/…`)
    /// before writing it ([`crate::cdi::host`]); `None`: not checked (the simulator, whose GPUs
    /// have no nodes).
    pub host_root: Option<PathBuf>,
}

impl Options {
    /// Defaults for a node: dynamic MIG, orphans destroyed, 10 s lock timeout, device metadata
    /// under the state directory (the plugin directory unless moved).
    pub fn new(driver: &str, pool: &str, state_dir: PathBuf, cdi_dir: PathBuf) -> Self {
        Self {
            metadata_dir: state_dir.join(crate::cdi::metadata::SUBDIR),
            driver: driver.to_string(),
            pool: pool.to_string(),
            mig_mode: GpuMode::Dynamic,
            mode_overrides: Vec::new(),
            orphans: OrphanPolicy::Destroy,
            state_dir,
            cdi_dir,
            lock_timeout: Duration::from_secs(10),
            slurm: slurm::Settings::none(pool),
            device_names: NameStyle::Minor,
            profiles: Allowlist::all(),
            host_root: None,
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

impl GpuEntry {
    /// What the device model needs to know about this GPU: the same identity the slices use.
    pub fn identity(&self) -> crate::mig::devices::GpuIdentity {
        let i = &self.info;
        crate::mig::devices::GpuIdentity {
            index: i.index,
            minor: i.minor,
            uuid: i.uuid.clone(),
            pci_bus_id: i.pci_bus_id.clone(),
            product_name: i.product_name.clone(),
            memory_mib: i.memory_mib,
            driver_version: i.driver_version.clone(),
            cuda_compute_capability: i.cuda_compute_capability,
            slurm_index: self.slurm.index,
            slurm_index_source: self.slurm.source.as_str().into(),
            shards_per_gpu: self.slurm.shards,
            topology: i.topology.clone(),
        }
    }
}

/// What the Slurm sources need to know about a GPU: its device files, and for a MIG GPU the
/// existing instances with their capability minors (Slurm may list them as GPUs).
fn node_gpu(backend: &dyn GpuBackend, info: &GpuInfo, model: &GpuModel) -> Result<NodeGpu, GpuError> {
    let mut migs = Vec::new();
    if info.mig_enabled {
        let gis = match backend.gpu_instances(&info.uuid) {
            // Lost between listing and now: its instances are out of reach; the others go on.
            Err(e) if e.code() == Some(crate::gpu::NvmlCode::GpuIsLost) => {
                tracing::warn!(gpu = %info.uuid, "GPU is lost; its MIG instances cannot be read: {e}");
                Vec::new()
            }
            r => r?,
        };
        for gi in gis {
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
    metadata: MetadataDir,
    opts: Options,
    boot_id: String,
    hook: Option<Hook>,
    slurm: Resolution,
    /// One call at a time per claim UID.
    claims: ClaimLocks,
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
        let dynamic = found.iter().filter(|(_, _, mode)| *mode == GpuMode::Dynamic);
        opts.profiles.check(dynamic.map(|(info, model, _)| (info.index, model))).map_err(PrepareError::Profiles)?;
        let slurm = slurm::resolve(&opts.slurm, &node_gpus).map_err(PrepareError::Slurm)?;
        for ((info, model, mode), s) in found.into_iter().zip(&slurm.gpus) {
            let lock = GpuLock::new(&opts.state_dir, &info.uuid);
            gpus.push(GpuEntry { info, model, mode, slurm: s.clone(), lock });
        }
        crate::files::create_dir(&opts.state_dir, 0o750)
            .map_err(|source| PrepareError::StateDir { path: opts.state_dir.clone(), source })?;
        Ok(Self {
            store: CheckpointStore::new(&opts.state_dir),
            cdi: CdiWriter::new(&opts.cdi_dir, &opts.driver),
            metadata: MetadataDir::new(&opts.metadata_dir, &opts.driver),
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

    pub(super) fn gpu(&self, uuid: &str) -> Option<&GpuEntry> {
        self.gpus.iter().find(|g| g.info.uuid == uuid)
    }
}
