//! The real backend: libnvidia-ml, loaded at run time.
//!
//! nvml-wrapper does discovery (index, minor, UUID, PCI, name, memory, MIG mode, versions,
//! compute capability); [`ffi`], the crate's only unsafe module, makes the MIG calls it lacks
//! through the same loaded library; [`discovery`] builds each GPU's model; [`events`] turns XID
//! events into health; procfs supplies capability minors and the boot ID; [`locate`] picks the
//! library: `--nvml-lib`, else the usual place under `--driver-root` for the architecture migdra
//! runs on, else the loader path. The library path is configurable, which is how CI runs this
//! exact code against `hack/fake-nvml`, a libnvidia-ml built from the simulator.
//!
//! migdra never changes MIG mode: this backend has no call that could.

mod codes;
pub mod discovery;
mod events;
mod ffi;
pub mod locate;

pub use codes::code_of;

use super::procfs::Procfs;
use super::{ComputeInstance, GpuBackend, GpuError, GpuInfo, GpuInstance, NvmlCode, Result};
use crate::mig::catalog::GpuModel;
use codes::{from_raw, from_wrapper};
use discovery::MigState;
use events::{HealthBook, Watcher};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use std::path::PathBuf;
use std::sync::Arc;

/// The library NVIDIA's driver installs; `dlopen` finds it on the loader path.
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// Compute instance profile indexes asked for (`NVML_COMPUTE_INSTANCE_PROFILE_COUNT` is 8, plus
/// 7_SLICE_NVL in newer headers).
const CI_PROFILE_INDEXES: u32 = 9;

/// Room in instance list buffers. NVML writes at most the profile's instance count, which no
/// GPU puts above 8 (there are at most 8 memory slices per compute slice grid).
const LIST_CAPACITY: usize = 32;

/// How to open NVML.
#[derive(Debug, Clone, Default)]
pub struct NvmlOptions {
    /// libnvidia-ml to load (`--nvml-lib`); when `None`, looked up under `driver_root`.
    pub lib_path: Option<PathBuf>,
    /// Where the host's driver files are (`--driver-root`), searched for libnvidia-ml when
    /// `lib_path` is `None`; [`DEFAULT_LIB`] on the loader path when neither is set or nothing
    /// is found there.
    pub driver_root: Option<PathBuf>,
    /// Where capability minors and the boot ID are read.
    pub procfs: Procfs,
    /// Watch XID events (the daemon does; one-shot commands need not).
    pub watch_events: bool,
    /// Where the GPUs' PCIe root and NUMA node are read (`--sysfs-root`); `None`: `/sys`.
    pub sysfs_root: Option<PathBuf>,
}

/// What discovery found about a GPU at start; its model does not change while migdra runs.
#[derive(Debug)]
struct Known {
    index: u32,
    uuid: String,
    model: GpuModel,
    /// What discovery said at start: reported, unhealthy, once the GPU is lost.
    identity: discovery::Identity,
    /// Where it sits on the host, read from `/sys` once: it does not move while migdra runs.
    topology: crate::mig::devices::Topology,
}

/// The NVML backend.
pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    lib: String,
    procfs: Procfs,
    gpus: Vec<Known>,
    health: Arc<HealthBook>,
    _watcher: Option<Watcher>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").field("lib", &self.lib).field("gpus", &self.gpus.len()).finish_non_exhaustive()
    }
}

impl NvmlBackend {
    /// Load the library, check that it has the MIG API, and discover every GPU and its model.
    ///
    /// # Errors
    /// One line each: the library is missing or does not initialise ([`GpuError::Load`]), the
    /// driver is too old for MIG or a GPU with MIG on reports no profiles
    /// ([`GpuError::Unsupported`]), or a discovery call fails.
    pub fn open(opts: &NvmlOptions) -> Result<Self> {
        let choice = locate::choose(
            opts.lib_path.as_deref(),
            opts.driver_root.as_deref(),
            std::env::consts::ARCH,
            std::path::Path::exists,
        );
        let lib = choice.path().display().to_string();
        let nvml =
            Nvml::builder().lib_path(std::ffi::OsStr::new(&lib)).init().map_err(|e| load_error(&lib, &choice, e))?;
        tracing::info!(lib = %lib, from = choice.source(), "NVML loaded");
        let missing = ffi::missing_mig_symbols(&nvml);
        if !missing.is_empty() {
            return Err(GpuError::Unsupported(format!(
                "{lib} lacks the MIG API ({}): the NVIDIA driver is too old; MIG needs R470 or newer",
                missing.join(", ")
            )));
        }
        let count = nvml.device_count().map_err(|e| from_wrapper("nvmlDeviceGetCount_v2", "all", e))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            let found = nvml
                .device_by_index(index)
                .map_err(|e| from_wrapper("nvmlDeviceGetHandleByIndex_v2", &index.to_string(), e))
                .and_then(|dev| {
                    let id = discovery::identity(&dev, index)?;
                    let model = discovery::model(&nvml, &dev, &id)?;
                    Ok((id, model))
                });
            let (id, model) = match found {
                Ok(found) => found,
                // A GPU that fell off the bus has nothing to publish; the others still work.
                Err(e) if e.code() == Some(NvmlCode::GpuIsLost) => {
                    tracing::error!(index, error = %e, "GPU is lost; it is left out until migdra restarts");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let sysfs = opts.sysfs_root.as_deref().unwrap_or(std::path::Path::new("/sys"));
            let topology = crate::gpu::sysfs::topology(sysfs, &id.pci_bus_id);
            tracing::info!(
                index,
                minor = id.minor,
                uuid = %id.uuid,
                name = %id.name,
                mig = ?id.mig,
                model = %model.key,
                pcie_root = topology.pcie_root.as_deref().unwrap_or("unknown"),
                numa_node = ?topology.numa_node,
                "NVML GPU"
            );
            gpus.push(Known { index, uuid: id.uuid.clone(), model, identity: id, topology });
        }
        let nvml = Arc::new(nvml);
        let health = Arc::new(HealthBook::default());
        let watcher = if opts.watch_events {
            let list = gpus.iter().map(|g| (g.index, g.uuid.clone())).collect();
            match events::watch(nvml.clone(), list, health.clone()) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(
                        call = e.call,
                        code = %NvmlCode::from_value(e.ret),
                        "no XID events: device health will not follow NVML"
                    );
                    None
                }
            }
        } else {
            None
        };
        Ok(NvmlBackend { nvml, lib, procfs: opts.procfs.clone(), gpus, health, _watcher: watcher })
    }

    /// Each GPU's identity, with the model NVML's own profile answers describe (whatever the MIG
    /// mode), for comparison with the catalog. Read-only: profile info and placements only.
    pub fn observed(&self) -> Vec<(discovery::Identity, Result<GpuModel>)> {
        self.gpus
            .iter()
            .map(|k| {
                let model = self.device(k).and_then(|dev| discovery::observe(&self.nvml, &dev, &k.identity));
                (k.identity.clone(), model)
            })
            .collect()
    }

    /// The library this backend loaded.
    pub fn lib_path(&self) -> &str {
        &self.lib
    }

    /// A GPU named by UUID (any case) or NVML index, as the simulator accepts.
    fn resolve(&self, gpu: &str) -> Result<&Known> {
        let g = gpu.trim();
        let found = match g.parse::<u32>() {
            Ok(i) => self.gpus.iter().find(|k| k.index == i),
            Err(_) => self.gpus.iter().find(|k| k.uuid.eq_ignore_ascii_case(g)),
        };
        found.ok_or_else(|| {
            let last = self.gpus.len().saturating_sub(1);
            GpuError::UnknownGpu(format!("{gpu} on this node; valid: an NVML index 0-{last} or a GPU UUID"))
        })
    }

    fn device(&self, k: &Known) -> Result<Device<'_>> {
        self.nvml.device_by_index(k.index).map_err(|e| from_wrapper("nvmlDeviceGetHandleByIndex_v2", &k.uuid, e))
    }

    /// The CI profile ID NVML gives the CI profile index `index` in this GI, falling back to a
    /// search when a driver numbers them differently. `None`: the GI has no such CI profile.
    fn ci_profile(&self, k: &Known, gi: ffi::GiHandle, id: u32) -> Result<Option<ffi::CiProfileInfo>> {
        let absent = |e: &ffi::RawError| {
            matches!(NvmlCode::from_value(e.ret), NvmlCode::NotSupported | NvmlCode::InvalidArgument)
        };
        match ffi::ci_profile_info(&self.nvml, gi, id) {
            Ok(info) if info.id == id => return Ok(Some(info)),
            Ok(_) => {}
            Err(e) if absent(&e) => {}
            Err(e) => return Err(from_raw(e, &k.uuid)),
        }
        for index in 0..CI_PROFILE_INDEXES {
            match ffi::ci_profile_info(&self.nvml, gi, index) {
                Ok(info) if info.id == id => return Ok(Some(info)),
                Ok(_) => {}
                Err(e) if absent(&e) => {}
                Err(e) => return Err(from_raw(e, &k.uuid)),
            }
        }
        Ok(None)
    }
}

/// A one-line reason the library could not be used, naming the driver root's candidates when
/// none existed and the loader path was tried instead.
fn load_error(lib: &str, choice: &locate::Choice, e: NvmlError) -> GpuError {
    let mut reason = match e {
        NvmlError::LibloadingError(e) => {
            format!("{e}; is the NVIDIA driver installed? Point --nvml-lib (MIGDRA_NVML_LIB) at its libnvidia-ml.so.1")
        }
        NvmlError::FailedToLoadSymbol(s) => format!("it is not libnvidia-ml ({s})"),
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_string(),
        e => format!("nvmlInit_v2 returned {}", code_of(&e)),
    };
    if let locate::Choice::LoaderPath { tried } = choice
        && !tried.is_empty()
    {
        let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
        reason.push_str(&format!(" (none under --driver-root: tried {})", tried.join(", ")));
    }
    GpuError::Load { path: lib.to_string(), reason: reason.replace('\n', " ") }
}

impl GpuBackend for NvmlBackend {
    /// The GPUs found at start, re-read from NVML; one that is lost since is reported as it was,
    /// unhealthy.
    fn gpus(&self) -> Result<Vec<GpuInfo>> {
        self.nvml.device_count().map_err(|e| from_wrapper("nvmlDeviceGetCount_v2", "all", e))?;
        let driver =
            self.nvml.sys_driver_version().map_err(|e| from_wrapper("nvmlSystemGetDriverVersion", "all", e))?;
        let cuda = self
            .nvml
            .sys_cuda_driver_version()
            .map_err(|e| from_wrapper("nvmlSystemGetCudaDriverVersion_v2", "all", e))?;
        let cuda = format!("{}.{}", cuda / 1000, (cuda % 1000) / 10);
        let mut out = Vec::with_capacity(self.gpus.len());
        for k in &self.gpus {
            let (id, lost) = match self.device(k).and_then(|dev| discovery::identity(&dev, k.index)) {
                Ok(id) => (id, false),
                Err(e) if e.code() == Some(NvmlCode::GpuIsLost) => (k.identity.clone(), true),
                Err(e) => return Err(e),
            };
            if self.health.reachable(&k.uuid, !lost) {
                tracing::warn!(
                    gpu = %k.uuid,
                    "GPU answers NVML again after GPU_IS_LOST: it was reset; its XID health is cleared"
                );
            }
            out.push(GpuInfo {
                index: k.index,
                minor: id.minor,
                healthy: !lost && self.health.gpu_healthy(&id.uuid),
                uuid: id.uuid,
                pci_bus_id: id.pci_bus_id,
                model: k.model.key.clone(),
                product_name: id.name,
                memory_mib: id.memory_mib,
                mig_enabled: id.mig == MigState::Enabled,
                driver_version: driver.clone(),
                cuda_driver_version: cuda.clone(),
                cuda_compute_capability: id.cuda_compute_capability,
                topology: k.topology.clone(),
            });
        }
        Ok(out)
    }

    fn model(&self, gpu: &str) -> Result<GpuModel> {
        Ok(self.resolve(gpu)?.model.clone())
    }

    fn gpu_instances(&self, gpu: &str) -> Result<Vec<GpuInstance>> {
        let k = self.resolve(gpu)?;
        let dev = self.device(k)?;
        if k.model.profiles.is_empty() {
            return Err(GpuError::Nvml {
                op: "nvmlDeviceGetGpuInstances",
                gpu: k.uuid.clone(),
                code: NvmlCode::NotSupported,
            });
        }
        let mut out = Vec::new();
        for p in &k.model.profiles {
            let cap = LIST_CAPACITY.max(p.max_instances as usize);
            for gi in ffi::gpu_instances(&self.nvml, &dev, p.id, cap).map_err(|e| from_raw(e, &k.uuid))? {
                let info = ffi::gi_info(&self.nvml, gi).map_err(|e| from_raw(e, &k.uuid))?;
                out.push(GpuInstance {
                    id: info.id,
                    profile_id: info.profile_id,
                    start: info.start,
                    size: info.size,
                    healthy: self.health.instance_healthy(&k.uuid, info.id),
                });
            }
        }
        out.sort_by_key(|g| g.id);
        Ok(out)
    }

    fn create_gpu_instance(&self, gpu: &str, profile_id: u32, start: u32) -> Result<GpuInstance> {
        let k = self.resolve(gpu)?;
        let dev = self.device(k)?;
        // An unknown profile goes to NVML as is; it answers INVALID_ARGUMENT (or NOT_SUPPORTED
        // with MIG off), as the simulator does.
        let size = k.model.profile(profile_id).map_or(0, |p| p.memory_slices);
        let gi = ffi::create_gi(&self.nvml, &dev, profile_id, start, size).map_err(|e| from_raw(e, &k.uuid))?;
        let info = match ffi::gi_info(&self.nvml, gi) {
            Ok(info) => info,
            Err(e) => {
                // Leave nothing behind that the caller cannot name.
                let _ = ffi::destroy_gi(&self.nvml, gi);
                return Err(from_raw(e, &k.uuid));
            }
        };
        self.health.forget_instance(&k.uuid, info.id);
        Ok(GpuInstance { id: info.id, profile_id: info.profile_id, start: info.start, size: info.size, healthy: true })
    }

    fn destroy_gpu_instance(&self, gpu: &str, gi_id: u32) -> Result<()> {
        let k = self.resolve(gpu)?;
        let dev = self.device(k)?;
        let gi = ffi::gi_by_id(&self.nvml, &dev, gi_id).map_err(|e| from_raw(e, &k.uuid))?;
        ffi::destroy_gi(&self.nvml, gi).map_err(|e| from_raw(e, &k.uuid))?;
        self.health.forget_instance(&k.uuid, gi_id);
        Ok(())
    }

    fn compute_instances(&self, gpu: &str, gi_id: u32) -> Result<Vec<ComputeInstance>> {
        let k = self.resolve(gpu)?;
        let dev = self.device(k)?;
        let gi = ffi::gi_by_id(&self.nvml, &dev, gi_id).map_err(|e| from_raw(e, &k.uuid))?;
        let mut profiles: Vec<ffi::CiProfileInfo> = Vec::new();
        for index in 0..CI_PROFILE_INDEXES {
            match ffi::ci_profile_info(&self.nvml, gi, index) {
                Ok(info) if !profiles.iter().any(|p| p.id == info.id) => profiles.push(info),
                Ok(_) => {}
                Err(e) if matches!(NvmlCode::from_value(e.ret), NvmlCode::NotSupported | NvmlCode::InvalidArgument) => {
                }
                Err(e) => return Err(from_raw(e, &k.uuid)),
            }
        }
        let mut out = Vec::new();
        for p in profiles {
            let cap = LIST_CAPACITY.max(p.instance_count as usize);
            for ci in ffi::compute_instances(&self.nvml, gi, p.id, cap).map_err(|e| from_raw(e, &k.uuid))? {
                let info = ffi::ci_info(&self.nvml, ci).map_err(|e| from_raw(e, &k.uuid))?;
                out.push(compute_instance(info, gi_id));
            }
        }
        out.sort_by_key(|c| c.id);
        Ok(out)
    }

    fn create_compute_instance(&self, gpu: &str, gi_id: u32, ci_profile_id: u32) -> Result<ComputeInstance> {
        let k = self.resolve(gpu)?;
        let dev = self.device(k)?;
        let gi = ffi::gi_by_id(&self.nvml, &dev, gi_id).map_err(|e| from_raw(e, &k.uuid))?;
        let Some(profile) = self.ci_profile(k, gi, ci_profile_id)? else {
            return Err(GpuError::Nvml {
                op: "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
                gpu: k.uuid.clone(),
                code: NvmlCode::InvalidArgument,
            });
        };
        let ci = ffi::create_ci(&self.nvml, gi, profile.id).map_err(|e| from_raw(e, &k.uuid))?;
        match ffi::ci_info(&self.nvml, ci) {
            Ok(info) => Ok(compute_instance(info, gi_id)),
            Err(e) => {
                // Without its UUID the CI is useless to the caller; do not leak it.
                let _ = ffi::destroy_ci(&self.nvml, ci);
                Err(from_raw(e, &k.uuid))
            }
        }
    }

    fn destroy_compute_instance(&self, gpu: &str, gi_id: u32, ci_id: u32) -> Result<()> {
        let k = self.resolve(gpu)?;
        let dev = self.device(k)?;
        let gi = ffi::gi_by_id(&self.nvml, &dev, gi_id).map_err(|e| from_raw(e, &k.uuid))?;
        let ci = ffi::ci_by_id(&self.nvml, gi, ci_id).map_err(|e| from_raw(e, &k.uuid))?;
        ffi::destroy_ci(&self.nvml, ci).map_err(|e| from_raw(e, &k.uuid))
    }

    fn boot_id(&self) -> Result<String> {
        self.procfs.boot_id()
    }

    fn caps_major(&self) -> Result<u32> {
        self.procfs.caps_major()
    }

    fn mig_capability_minors(&self, gpu_minor: u32, gi_id: u32, ci_id: u32) -> Result<(u32, u32)> {
        self.procfs.mig_capability_minors(gpu_minor, gi_id, ci_id)
    }

    fn clear_health(&self, gpu: &str) -> Result<()> {
        self.health.clear(&self.resolve(gpu)?.uuid);
        Ok(())
    }

    fn unhealthy_reason(&self, gpu: &str, gi: Option<u32>) -> Option<String> {
        self.health.reason(&self.resolve(gpu).ok()?.uuid, gi)
    }
}

/// The backend's view of a CI NVML described.
fn compute_instance(info: ffi::CiInfo, gi_id: u32) -> ComputeInstance {
    ComputeInstance {
        id: info.id,
        gi_id,
        profile_id: info.profile_id,
        start: info.start,
        size: info.size,
        uuid: info.uuid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<NvmlBackend>();
    }

    #[test]
    fn a_missing_library_is_one_clear_line() {
        let opts = NvmlOptions { lib_path: Some("/nonexistent/libnvidia-ml.so.1".into()), ..Default::default() };
        let e = NvmlBackend::open(&opts).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, GpuError::Load { .. }), "{e:?}");
        assert!(msg.starts_with("failed to load NVML from /nonexistent/libnvidia-ml.so.1: "), "{msg}");
        assert!(msg.contains("--nvml-lib") && !msg.contains('\n'), "{msg}");
    }

    #[test]
    fn a_driver_root_without_the_library_names_every_path_tried() {
        let root = tempfile::tempdir().unwrap();
        let opts = NvmlOptions { driver_root: Some(root.path().into()), ..Default::default() };
        let e = NvmlBackend::open(&opts).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, GpuError::Load { .. }), "{e:?}");
        // Fell back to the loader path (this machine has no NVIDIA driver), and says where it looked.
        assert!(msg.starts_with(&format!("failed to load NVML from {DEFAULT_LIB}: ")), "{msg}");
        for tried in locate::candidates(root.path(), std::env::consts::ARCH) {
            assert!(msg.contains(&tried.display().to_string()), "{} not named: {msg}", tried.display());
        }
        assert!(msg.contains("--driver-root") && msg.contains("--nvml-lib") && !msg.contains('\n'), "{msg}");
    }

    #[test]
    fn a_library_that_is_not_nvml_is_refused() {
        // libc loads, but has no nvmlInit_v2.
        let opts = NvmlOptions { lib_path: Some("libc.so.6".into()), ..Default::default() };
        let msg = NvmlBackend::open(&opts).unwrap_err().to_string();
        assert!(msg.contains("libc.so.6") && msg.contains("not libnvidia-ml"), "{msg}");
    }
}
