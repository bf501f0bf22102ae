//! A faithful MIG simulator behind [`GpuBackend`](crate::gpu::GpuBackend) (docs/design.md, "Testing without a GPU").
//!
//! What makes it faithful (docs/facts/mig-nvml.md §0, §4, §5):
//! - real profile IDs, placements and engine counts from the catalog, and NVML's admission rules
//!   from [`admits`](crate::mig::rules::admits), with NVML's error codes (overlap → INSUFFICIENT_RESOURCES, a bad
//!   placement → INVALID_ARGUMENT, MIG off → NOT_SUPPORTED, busy → IN_USE);
//! - driver-assigned GI IDs that do not follow the placement, device minors that differ from NVML
//!   indexes, and MIG UUIDs that stay the same for an instance's lifetime;
//! - the state lives in a file that outlives the process and is shared by every process that opens
//!   it (an exclusive `flock` on `<file>.lock` around each operation, atomic rewrites);
//!   [`SimBackend::reboot`] clears the instances the way a real reboot does;
//! - fault injection: fail any operation with any NVML code or delay it, a number of times, with a
//!   probability, on one GPU ([`Fault`]). Delays are slept holding no lock, so operations on
//!   different GPUs overlap in time like they do on hardware.
//!
//! GPUs are named by UUID or by NVML index (`"0"`) everywhere.

mod backend;
mod fault;
mod file;
mod hardware;
mod spec;
#[cfg(test)]
mod tests;

pub use backend::SimBackend;
pub use fault::{Fault, FaultAction, SimOp};
pub use hardware::{MAX_XIDS, SimCi, SimGi, SimGpu, SimProcess, SimState, SimXid};
pub use spec::{SimGpuSpec, SimSpec};

/// The environment variable with extra faults for this process only (not persisted).
pub const FAULTS_ENV: &str = "MIGDRA_SIM_FAULTS";

/// The driver version every simulated GPU reports.
pub const DRIVER_VERSION: &str = "580.95.05";

/// The CUDA version that driver supports (R580 ships CUDA 13.0).
pub const CUDA_DRIVER_VERSION: &str = "13.0";

/// The state file format version this code reads and writes.
pub const STATE_VERSION: u32 = 1;

/// The most GPUs one simulated node may have.
pub const MAX_GPUS: usize = 64;
