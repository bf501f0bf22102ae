//! The hardware boundary: what migdra needs from NVML, as one trait.
//!
//! [`GpuBackend`] has two implementations: [`sim::SimBackend`], a faithful simulator used by the
//! tests, the demo and `--sim`, and [`nvml::NvmlBackend`], the real one, which loads
//! libnvidia-ml at run time ([`procfs`] supplies what NVML does not: capability minors and the
//! boot ID). Both pass one conformance suite (`tests/library/conformance.rs`). Calls are blocking, like
//! NVML; async callers run them on a blocking thread.

pub mod nvml;
pub mod procfs;
pub mod sim;
pub mod sysfs;
pub mod xid;

use crate::mig::catalog::GpuModel;
use serde::{Deserialize, Serialize};

/// Every NVML error code (`nvmlReturn_t` values from nvml.h, API version 13), so an error from
/// the real library keeps its meaning; a value newer than this list becomes `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvmlCode {
    Uninitialized,
    InvalidArgument,
    NotSupported,
    NoPermission,
    AlreadyInitialized,
    NotFound,
    InsufficientSize,
    InsufficientPower,
    DriverNotLoaded,
    Timeout,
    IrqIssue,
    LibraryNotFound,
    FunctionNotFound,
    CorruptedInforom,
    GpuIsLost,
    ResetRequired,
    OperatingSystem,
    LibRmVersionMismatch,
    InUse,
    Memory,
    NoData,
    VgpuEccNotSupported,
    InsufficientResources,
    FreqNotSupported,
    ArgumentVersionMismatch,
    Deprecated,
    NotReady,
    GpuNotFound,
    InvalidState,
    ResetTypeNotSupported,
    Unknown,
}

impl NvmlCode {
    /// Every code, for parsing and for error messages.
    pub const ALL: [NvmlCode; 31] = [
        Self::Uninitialized,
        Self::InvalidArgument,
        Self::NotSupported,
        Self::NoPermission,
        Self::AlreadyInitialized,
        Self::NotFound,
        Self::InsufficientSize,
        Self::InsufficientPower,
        Self::DriverNotLoaded,
        Self::Timeout,
        Self::IrqIssue,
        Self::LibraryNotFound,
        Self::FunctionNotFound,
        Self::CorruptedInforom,
        Self::GpuIsLost,
        Self::ResetRequired,
        Self::OperatingSystem,
        Self::LibRmVersionMismatch,
        Self::InUse,
        Self::Memory,
        Self::NoData,
        Self::VgpuEccNotSupported,
        Self::InsufficientResources,
        Self::FreqNotSupported,
        Self::ArgumentVersionMismatch,
        Self::Deprecated,
        Self::NotReady,
        Self::GpuNotFound,
        Self::InvalidState,
        Self::ResetTypeNotSupported,
        Self::Unknown,
    ];

    /// The `nvmlReturn_t` value.
    pub fn value(self) -> u32 {
        match self {
            Self::Uninitialized => 1,
            Self::InvalidArgument => 2,
            Self::NotSupported => 3,
            Self::NoPermission => 4,
            Self::AlreadyInitialized => 5,
            Self::NotFound => 6,
            Self::InsufficientSize => 7,
            Self::InsufficientPower => 8,
            Self::DriverNotLoaded => 9,
            Self::Timeout => 10,
            Self::IrqIssue => 11,
            Self::LibraryNotFound => 12,
            Self::FunctionNotFound => 13,
            Self::CorruptedInforom => 14,
            Self::GpuIsLost => 15,
            Self::ResetRequired => 16,
            Self::OperatingSystem => 17,
            Self::LibRmVersionMismatch => 18,
            Self::InUse => 19,
            Self::Memory => 20,
            Self::NoData => 21,
            Self::VgpuEccNotSupported => 22,
            Self::InsufficientResources => 23,
            Self::FreqNotSupported => 24,
            Self::ArgumentVersionMismatch => 25,
            Self::Deprecated => 26,
            Self::NotReady => 27,
            Self::GpuNotFound => 28,
            Self::InvalidState => 29,
            Self::ResetTypeNotSupported => 30,
            Self::Unknown => 999,
        }
    }

    /// The code for an `nvmlReturn_t` value; anything unlisted is `Unknown`.
    pub fn from_value(v: u32) -> Self {
        Self::ALL.into_iter().find(|c| c.value() == v).unwrap_or(Self::Unknown)
    }

    /// The kebab-case name (`insufficient-resources`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Uninitialized => "uninitialized",
            Self::InvalidArgument => "invalid-argument",
            Self::NotSupported => "not-supported",
            Self::NoPermission => "no-permission",
            Self::AlreadyInitialized => "already-initialized",
            Self::NotFound => "not-found",
            Self::InsufficientSize => "insufficient-size",
            Self::InsufficientPower => "insufficient-power",
            Self::DriverNotLoaded => "driver-not-loaded",
            Self::Timeout => "timeout",
            Self::IrqIssue => "irq-issue",
            Self::LibraryNotFound => "library-not-found",
            Self::FunctionNotFound => "function-not-found",
            Self::CorruptedInforom => "corrupted-inforom",
            Self::GpuIsLost => "gpu-is-lost",
            Self::ResetRequired => "reset-required",
            Self::OperatingSystem => "operating-system",
            Self::LibRmVersionMismatch => "lib-rm-version-mismatch",
            Self::InUse => "in-use",
            Self::Memory => "memory",
            Self::NoData => "no-data",
            Self::VgpuEccNotSupported => "vgpu-ecc-not-supported",
            Self::InsufficientResources => "insufficient-resources",
            Self::FreqNotSupported => "freq-not-supported",
            Self::ArgumentVersionMismatch => "argument-version-mismatch",
            Self::Deprecated => "deprecated",
            Self::NotReady => "not-ready",
            Self::GpuNotFound => "gpu-not-found",
            Self::InvalidState => "invalid-state",
            Self::ResetTypeNotSupported => "reset-type-not-supported",
            Self::Unknown => "unknown",
        }
    }

    /// Parse a name (`in-use`) or a number (`19`).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        if let Ok(v) = s.parse::<u32>() {
            return Self::ALL.into_iter().find(|c| c.value() == v);
        }
        let norm = s.to_ascii_lowercase().replace('_', "-");
        let norm = norm.strip_prefix("nvml-error-").unwrap_or(&norm);
        Self::ALL.into_iter().find(|c| c.name() == norm)
    }

    /// The valid names, for error messages.
    pub fn names() -> String {
        let names: Vec<&str> = Self::ALL.iter().map(|c| c.name()).collect();
        names.join(", ")
    }
}

impl std::fmt::Display for NvmlCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.value())
    }
}

/// Errors of the hardware layer.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// An NVML call returned an error code.
    #[error("{op} failed on GPU {gpu}: {code}")]
    Nvml { op: &'static str, gpu: String, code: NvmlCode },
    /// No GPU with this UUID on the node.
    #[error("no GPU {0}")]
    UnknownGpu(String),
    /// The simulator state file could not be read or written.
    #[error("simulator state {path}: {reason}")]
    SimState { path: String, reason: String },
    /// Bad input to the simulator (a spec, a fault description).
    #[error("{0}")]
    Invalid(String),
    /// libnvidia-ml could not be loaded or initialised.
    #[error("failed to load NVML from {path}: {reason}")]
    Load { path: String, reason: String },
    /// The driver or a GPU lacks what migdra needs (the MIG API, MIG profiles).
    #[error("{0}")]
    Unsupported(String),
    /// A procfs file the driver should have written is missing or unreadable.
    #[error("failed to read {path}: {reason}")]
    Procfs { path: String, reason: String },
}

impl GpuError {
    /// The NVML code, when this is an NVML error.
    pub fn code(&self) -> Option<NvmlCode> {
        match self {
            Self::Nvml { code, .. } => Some(*code),
            _ => None,
        }
    }
}

pub type Result<T, E = GpuError> = std::result::Result<T, E>;

/// A physical GPU as discovery reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML index (PCI bus order).
    pub index: u32,
    /// Device minor: `/dev/nvidia<minor>`. Often not the index.
    pub minor: u32,
    /// `GPU-…`
    pub uuid: String,
    /// NVML bus ID, `00000000:18:00.0`.
    pub pci_bus_id: String,
    /// The catalog key of the model, when it is one migdra knows.
    pub model: String,
    pub product_name: String,
    pub memory_mib: u64,
    /// Current MIG mode.
    pub mig_enabled: bool,
    pub driver_version: String,
    /// The CUDA version the driver supports, `13.0` (`nvmlSystemGetCudaDriverVersion_v2`).
    #[serde(default)]
    pub cuda_driver_version: String,
    pub cuda_compute_capability: (u32, u32),
    /// False after a simulated or real XID that makes the GPU unusable.
    #[serde(default = "yes")]
    pub healthy: bool,
    /// Where it sits on the host (sysfs): the standard attributes `pcieRoot` and `numaNode`.
    #[serde(default)]
    pub topology: crate::mig::devices::Topology,
}

fn yes() -> bool {
    true
}

/// A GPU instance that exists on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInstance {
    /// Driver-assigned GI ID; not a function of the placement.
    pub id: u32,
    pub profile_id: u32,
    /// Placement start, in memory slices.
    pub start: u32,
    /// Placement size, in memory slices.
    pub size: u32,
    /// False after an error (XID) on this instance; its MIG device reports unhealthy.
    #[serde(default = "yes")]
    pub healthy: bool,
}

/// A compute instance inside a GPU instance: one MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeInstance {
    /// CI ID, starting at 0 inside its GI.
    pub id: u32,
    pub gi_id: u32,
    pub profile_id: u32,
    /// Placement start inside the GI, in compute slices.
    pub start: u32,
    pub size: u32,
    /// `MIG-…`, the UUID CUDA_VISIBLE_DEVICES takes.
    pub uuid: String,
}

/// What migdra needs from NVML. Every GPU is named by its UUID.
pub trait GpuBackend: Send + Sync {
    /// Every GPU on the node, in NVML index order.
    fn gpus(&self) -> Result<Vec<GpuInfo>>;
    /// The catalog model of a GPU (for unknown MIG GPUs, built from NVML's own profile queries).
    fn model(&self, gpu: &str) -> Result<GpuModel>;
    /// Every GPU instance on a GPU.
    fn gpu_instances(&self, gpu: &str) -> Result<Vec<GpuInstance>>;
    /// Create a GI at exactly this placement (CreateGpuInstanceWithPlacement).
    fn create_gpu_instance(&self, gpu: &str, profile_id: u32, start: u32) -> Result<GpuInstance>;
    /// Destroy a GI; IN_USE while it still has a CI or a process.
    fn destroy_gpu_instance(&self, gpu: &str, gi_id: u32) -> Result<()>;
    /// Every CI inside a GI.
    fn compute_instances(&self, gpu: &str, gi_id: u32) -> Result<Vec<ComputeInstance>>;
    /// Create a CI of this CI profile inside a GI; the result carries the MIG UUID.
    fn create_compute_instance(&self, gpu: &str, gi_id: u32, ci_profile_id: u32) -> Result<ComputeInstance>;
    /// Destroy a CI; IN_USE while a process runs on it.
    fn destroy_compute_instance(&self, gpu: &str, gi_id: u32, ci_id: u32) -> Result<()>;
    /// The boot ID instances belong to: they vanish when it changes.
    fn boot_id(&self) -> Result<String>;
    /// Major number of the `nvidia-caps` character devices (dynamic; `/proc/devices` on a host).
    /// No default: a backend that guessed would expose the wrong device to the container.
    fn caps_major(&self) -> Result<u32>;
    /// `nvidia-cap<N>` minors of a GI and its CI (`DeviceFileMinor` in procfs on a host).
    fn mig_capability_minors(&self, gpu_minor: u32, gi_id: u32, ci_id: u32) -> Result<(u32, u32)>;
    /// Why a GPU, or one of its GPU instances, is unhealthy (`XID 79`), when the backend knows.
    /// Only for the health stream's messages; `healthy` in [`GpuInfo`] and [`GpuInstance`] decides.
    fn unhealthy_reason(&self, _gpu: &str, _gi: Option<u32>) -> Option<String> {
        None
    }
    /// Forget the errors that made a GPU and its instances unhealthy: the operator looked
    /// (`migdra health clear`). A GPU NVML cannot reach stays unhealthy.
    ///
    /// # Errors
    /// The GPU is not known.
    fn clear_health(&self, _gpu: &str) -> Result<()> {
        Ok(())
    }
}

/// The `nvidia-caps` major the simulator reports: the value in the MIG guide's `ls -l` example.
pub const SIM_CAPS_MAJOR: u32 = 508;

/// `/dev/nvidia-caps/nvidia-cap<N>` minors of a GI and a CI, from the predetermined table in
/// `/proc/driver/nvidia-caps/mig-minors` (docs/facts/mig-nvml.md §4; fits every sample listed there).
pub fn capability_minors(gpu_minor: u32, gi_id: u32, ci_id: u32) -> (u32, u32) {
    let gi = 3 + 135 * gpu_minor + 9 * gi_id;
    (gi, gi + 1 + ci_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_minors_match_the_samples_in_the_facts() {
        assert_eq!(capability_minors(0, 1, 0), (12, 13));
        assert_eq!(capability_minors(0, 1, 2).1, 15);
        assert_eq!(capability_minors(3, 3, 3).1, 439);
        assert_eq!(capability_minors(31, 14, 7).1, 4322);
    }

    #[test]
    fn nvml_codes_parse_by_name_and_number() {
        assert_eq!(NvmlCode::parse("23"), Some(NvmlCode::InsufficientResources));
        assert_eq!(NvmlCode::parse("IN_USE"), Some(NvmlCode::InUse));
        assert_eq!(NvmlCode::parse("NVML_ERROR_NOT_FOUND"), Some(NvmlCode::NotFound));
        assert_eq!(NvmlCode::parse("bogus"), None);
        assert_eq!(NvmlCode::from_value(25), NvmlCode::ArgumentVersionMismatch);
    }
}
