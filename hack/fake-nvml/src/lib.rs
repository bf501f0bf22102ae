//! fake-nvml: a `libnvidia-ml.so` whose GPUs are migdra's simulator (`migdra::gpu::sim`).
//!
//! migdra's NVML backend loads it through nvml-wrapper exactly as it loads the real library, so
//! the C-ABI path that runs on hardware — symbol loading, versioned structs, handles, return
//! codes, event sets — runs in CI too. What it answers comes from the simulator's state file,
//! so a test can change the hardware (faults, processes, XIDs, a reboot) from outside and watch
//! the NVML backend see it.
//!
//! # Settings
//! Read at `nvmlInit`, from a `fake-nvml.conf` beside the loaded library (`key=value` lines; a
//! test copies the library into its own directory to get its own node), else from the
//! environment:
//!
//! - `state` (`FAKE_NVML_STATE`): the simulator state file (required; `migdra sim` and
//!   `SimBackend::open` make one);
//! - `procfs` (`FAKE_NVML_PROCFS`): a directory to keep a driver-like procfs tree in (`devices`,
//!   capability `access` files, boot ID);
//! - `trace` (`FAKE_NVML_TRACE`): a file that gets the name of every NVML function called, one
//!   per line;
//! - `profile-info-version` (`FAKE_NVML_PROFILE_INFO_VERSION`): `2` to reject version 3 of the
//!   profile info structs, like an older driver;
//! - `unlisted` (`FAKE_NVML_UNLISTED`): `1` to report names and PCI IDs no catalog knows, so
//!   migdra must describe the GPU from NVML.
//!
//! Faults come from the state file, and from `MIGDRA_SIM_FAULTS` as in migdra itself.
//!
//! # Safety
//! Every exported function follows nvml.h's contract: handles are those this library returned,
//! and pointers are NULL or valid for the reads and writes that function documents. All raw
//! pointer access is in [`abi`].

// The exports are `unsafe extern "C"` because their callers pass raw pointers; their shared
// safety contract is nvml.h's, stated once above rather than on each of them.
#![allow(clippy::missing_safety_doc)]

mod abi;
mod config;
pub mod exports;
mod handles;
mod node;
mod procfs;
