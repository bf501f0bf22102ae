//! Why a prepare or unprepare failed, and the class each failure is counted under.

use crate::cdi::CdiError;
use crate::claims::ClaimRef;
use crate::gpu::GpuError;
use crate::state::StateError;
use std::path::PathBuf;

/// Per-claim failure. Messages name the claim (as [`ClaimRef`] displays it), the device and the
/// NVML error. The claims are boxed, keeping the error small enough to return by value.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("claim {claim}: device {device}: {reason}")]
    BadDevice { claim: Box<ClaimRef>, device: String, reason: String },
    #[error("claim {claim}: device {device} is already prepared for claim {other}")]
    DeviceInUse { claim: Box<ClaimRef>, device: String, other: Box<ClaimRef> },
    #[error(
        "claim {claim}: device {device} overlaps {held}, prepared for claim {other}; the scheduler \
         allocated both, so the node's slices or the allocation are stale"
    )]
    Overlaps { claim: Box<ClaimRef>, device: String, held: String, other: Box<ClaimRef> },
    #[error("claim {claim}: its allocation changed from [{was}] to [{now}] under the same UID; unprepare it first")]
    AllocationChanged { claim: Box<ClaimRef>, was: String, now: String },
    #[error("claim {claim}: device {device}: failed to {step}: {source}")]
    Nvml { claim: Box<ClaimRef>, device: String, step: &'static str, source: GpuError },
    #[error("claim {claim}: {source}")]
    Cdi { claim: Box<ClaimRef>, source: CdiError },
    /// A host device node the spec names is missing: the runtime would fail the container.
    #[error("claim {claim}: {source}")]
    HostNode { claim: Box<ClaimRef>, source: crate::cdi::host::HostNodeError },
    /// A prepare failed with `source`, and its rollback could not undo everything; the claim
    /// stays in the checkpoint with the error so the next call finishes the job.
    #[error("{source}; rollback left instances behind, the next call retries: {left}")]
    RollbackIncomplete { source: Box<PrepareError>, left: String },
    #[error("claim {claim}: checkpoint: {source}")]
    Checkpoint { claim: Box<ClaimRef>, source: StateError },
    /// The checkpoint failed while no one claim was being worked on (recovery).
    #[error("checkpoint: {0}")]
    NodeCheckpoint(StateError),
    #[error("claim {claim}: device {device}: GPU is busy: {source}")]
    Busy { claim: Box<ClaimRef>, device: String, source: std::io::Error },
    #[error("failed to discover GPUs: {0}")]
    Discovery(GpuError),
    #[error("cannot create the state directory {}: {source}", path.display())]
    StateDir { path: PathBuf, source: std::io::Error },
    /// The Slurm index sources contradict themselves (an admin map with one index twice).
    #[error("{0}")]
    Slurm(crate::slurm::SlurmError),
    /// `--profiles` names nothing this node has, or leaves a dynamic GPU without partitions.
    #[error("{0}")]
    Profiles(crate::mig::allowlist::AllowlistError),
}

impl PrepareError {
    /// The fixed label a failure is counted under in `migdra_errors_total`: `bad-device`,
    /// `device-in-use`, `overlaps`, `allocation-changed`, `nvml-<code>` (e.g. `nvml-in-use`), `cdi`,
    /// `host-node` (a device node the spec names is missing on the host), `checkpoint`, `timeout`
    /// (a GPU lock held too long), `discovery`, `state-dir`, `slurm-index`, `profiles`. A prepare
    /// whose rollback failed counts under the reason of the failure that started the rollback.
    /// Every value [`reason`](Self::reason) takes but `nvml-<code>` (one per NVML code).
    pub const REASONS: [&'static str; 13] = [
        "bad-device",
        "device-in-use",
        "overlaps",
        "allocation-changed",
        "nvml",
        "cdi",
        "host-node",
        "checkpoint",
        "timeout",
        "discovery",
        "state-dir",
        "slurm-index",
        "profiles",
    ];

    pub fn reason(&self) -> String {
        match self {
            Self::BadDevice { .. } => "bad-device".into(),
            Self::RollbackIncomplete { source, .. } => source.reason(),
            Self::DeviceInUse { .. } => "device-in-use".into(),
            Self::Overlaps { .. } => "overlaps".into(),
            Self::AllocationChanged { .. } => "allocation-changed".into(),
            Self::Nvml { source, .. } => match source.code() {
                Some(code) => format!("nvml-{}", code.name()),
                None => "nvml".into(),
            },
            Self::Cdi { .. } => "cdi".into(),
            Self::HostNode { .. } => "host-node".into(),
            Self::Checkpoint { .. } | Self::NodeCheckpoint(_) => "checkpoint".into(),
            Self::Busy { .. } => "timeout".into(),
            Self::Discovery(_) => "discovery".into(),
            Self::StateDir { .. } => "state-dir".into(),
            Self::Slurm(_) => "slurm-index".into(),
            Self::Profiles(_) => "profiles".into(),
        }
    }

    pub(super) fn bad(claim: &ClaimRef, device: &str, reason: String) -> Self {
        Self::BadDevice { claim: Box::new(claim.clone()), device: device.to_string(), reason }
    }
}

/// Run one NVML call for `claim`; a failure names the claim, the device and the step.
pub(super) fn nvml<T>(
    claim: &ClaimRef,
    device: &str,
    step: &'static str,
    f: impl FnOnce() -> Result<T, GpuError>,
) -> Result<T, PrepareError> {
    f().map_err(|source| PrepareError::Nvml { claim: Box::new(claim.clone()), device: device.into(), step, source })
}
