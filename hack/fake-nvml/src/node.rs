//! The simulated node behind the exports: init refcounting, the simulator, and each NVML call's
//! logic as a safe function from plain values to plain values or an `nvmlReturn_t`.

use crate::config::Config;
use crate::handles::Handle;
use crate::procfs;
use migdra::gpu::sim::{DRIVER_VERSION, SimBackend, SimGpu, SimState};
use migdra::gpu::{GpuBackend, GpuError, xid};
use migdra::mig::catalog::{self, CiProfile, GiProfile, GpuModel};
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// An `nvmlReturn_t` error.
pub type Ret<T> = Result<T, u32>;

pub const UNINITIALIZED: u32 = 1;
pub const INVALID_ARGUMENT: u32 = 2;
pub const NOT_SUPPORTED: u32 = 3;
pub const NO_PERMISSION: u32 = 4;
pub const NOT_FOUND: u32 = 6;
pub const INSUFFICIENT_SIZE: u32 = 7;
pub const DRIVER_NOT_LOADED: u32 = 9;
pub const TIMEOUT: u32 = 10;
pub const GPU_IS_LOST: u32 = 15;
pub const ARGUMENT_VERSION_MISMATCH: u32 = 25;
pub const UNKNOWN: u32 = 999;

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` of the v13 header: indexes at or above are out of range.
const GI_PROFILE_INDEXES: u32 = 18;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT` plus 7_SLICE_NVL.
const CI_PROFILE_INDEXES: u32 = 9;

/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = 8;
/// `gpuInstanceId` of an event about the whole GPU.
pub const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// The CUDA version the fake driver supports, as `nvmlSystemGetCudaDriverVersion` encodes it.
pub const CUDA_VERSION: i32 = 13000;

/// The node of this loaded copy of the library, with its `nvmlInit` count.
static NODE: Mutex<Option<(u32, Arc<Fake>)>> = Mutex::new(None);

fn node_lock() -> MutexGuard<'static, Option<(u32, Arc<Fake>)>> {
    NODE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// nvmlInit: open the simulator on first use; later calls only count.
pub fn init() -> Ret<()> {
    let mut node = node_lock();
    if let Some((n, _)) = node.as_mut() {
        *n += 1;
        return Ok(());
    }
    // No state file means no driver to talk to.
    let config = Config::load().ok_or(DRIVER_NOT_LOADED)?;
    let sim = SimBackend::open(&config.state, None)
        .and_then(SimBackend::with_faults_from_env)
        .map_err(|_| DRIVER_NOT_LOADED)?;
    let fake = Arc::new(Fake { config, sim, written: Mutex::new(None), sets: Mutex::new((0, HashMap::new())) });
    fake.sync_procfs(&fake.state()?);
    *node = Some((1, fake));
    Ok(())
}

/// nvmlShutdown: the last one closes the node.
pub fn shutdown() -> Ret<()> {
    let mut node = node_lock();
    match node.as_mut() {
        None => Err(UNINITIALIZED),
        Some((n, _)) if *n > 1 => {
            *n -= 1;
            Ok(())
        }
        Some(_) => {
            *node = None;
            Ok(())
        }
    }
}

/// The initialised node, or UNINITIALIZED. Calls run on a clone, with no lock held, so a delay
/// injected into one call does not hold up others (as on hardware).
pub fn node() -> Ret<Arc<Fake>> {
    node_lock().as_ref().map(|(_, f)| f.clone()).ok_or(UNINITIALIZED)
}

/// Append an NVML function's name to the trace file, if there is one.
pub fn trace(name: &str) {
    let Ok(fake) = node() else { return };
    if let Some(path) = &fake.config.trace
        && let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path)
    {
        let _ = writeln!(f, "{name}");
    }
}

/// The return code of a simulator error.
fn code(e: GpuError) -> u32 {
    match e {
        GpuError::Nvml { code, .. } => code.value(),
        GpuError::UnknownGpu(_) | GpuError::Invalid(_) => INVALID_ARGUMENT,
        _ => UNKNOWN,
    }
}

/// An event set: which GPUs (NVML index) it watches for which event types, and the last XID
/// sequence number it delivered.
struct EventSet {
    devices: Vec<(u32, u64)>,
    seen: u64,
}

/// One loaded copy's node.
pub struct Fake {
    pub config: Config,
    sim: SimBackend,
    /// The procfs fingerprint last written.
    written: Mutex<Option<String>>,
    /// (last set number, sets).
    sets: Mutex<(u32, HashMap<u32, EventSet>)>,
}

/// One GPU instance profile as `nvmlGpuInstanceProfileInfo_v3_t` carries it.
pub struct GiProfileInfo<'a> {
    pub profile: &'a GiProfile,
    pub name: String,
}

/// One compute instance profile in a GPU instance.
pub struct CiProfileInfo<'a> {
    pub gi: &'a GiProfile,
    pub ci: &'a CiProfile,
    pub name: String,
}

/// What GpuInstanceGetInfo reports.
pub struct GiInfo {
    pub gpu: u32,
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

/// What ComputeInstanceGetInfo reports.
pub struct CiInfo {
    pub gpu: u32,
    pub gi: u32,
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

/// One delivered event.
pub struct Event {
    pub gpu: u32,
    pub xid: u64,
    pub gi: u32,
}

/// Whether GPU `i` fell off the bus: unhealthy, and its last critical XID was 79.
fn lost(st: &SimState, i: usize) -> bool {
    let g = &st.gpus[i];
    !g.healthy
        && st
            .xids
            .iter()
            .rev()
            .find(|x| x.gpu == g.index && x.gi.is_none() && xid::is_critical(x.xid))
            .is_some_and(|x| x.xid == xid::XID_FALLEN_OFF_BUS)
}

fn model_of(g: &SimGpu) -> Ret<&'static GpuModel> {
    catalog::model(&g.model).ok_or(UNKNOWN)
}

impl Fake {
    pub fn state(&self) -> Ret<SimState> {
        self.sim.state().map_err(code)
    }

    /// Keep the procfs tree in step with the hardware (best effort, like the driver's).
    fn sync_procfs(&self, st: &SimState) {
        let Some(root) = &self.config.procfs else { return };
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        let now = procfs::fingerprint(st);
        if written.as_deref() != Some(now.as_str()) && procfs::write(root, st).is_ok() {
            *written = Some(now);
        }
    }

    fn after_change(&self) {
        if let Ok(st) = self.state() {
            self.sync_procfs(&st);
        }
    }

    /// The GPU a device handle names, with the state it was read from; GPU_IS_LOST once it fell
    /// off the bus.
    fn gpu(&self, h: usize) -> Ret<(SimState, usize)> {
        let Some(Handle::Gpu(i)) = Handle::decode(h) else { return Err(INVALID_ARGUMENT) };
        let st = self.state()?;
        if i as usize >= st.gpus.len() {
            return Err(INVALID_ARGUMENT);
        }
        if lost(&st, i as usize) {
            return Err(GPU_IS_LOST);
        }
        Ok((st, i as usize))
    }

    /// A GPU that must have MIG on.
    fn mig_gpu(&self, h: usize) -> Ret<(SimState, usize)> {
        let (st, i) = self.gpu(h)?;
        if !st.gpus[i].mig_enabled {
            return Err(NOT_SUPPORTED);
        }
        Ok((st, i))
    }

    /// The GPU and GI a GI handle names; INVALID_ARGUMENT once the GI is gone.
    fn gi(&self, h: usize) -> Ret<(SimState, usize, usize)> {
        let Some(Handle::Gi { gpu, gi }) = Handle::decode(h) else { return Err(INVALID_ARGUMENT) };
        let st = self.state()?;
        let i = gpu as usize;
        let g = st.gpus.get(i).and_then(|g| g.gpu_instances.iter().position(|x| x.id == gi)).ok_or(INVALID_ARGUMENT)?;
        Ok((st, i, g))
    }

    /// GPU, GI and CI positions a CI or MIG device handle names.
    fn ci(&self, h: usize, mig: bool) -> Ret<(SimState, usize, usize, usize)> {
        let (gpu, gi, ci) = match Handle::decode(h) {
            Some(Handle::Ci { gpu, gi, ci }) if !mig => (gpu, gi, ci),
            Some(Handle::Mig { gpu, gi, ci }) if mig => (gpu, gi, ci),
            _ => return Err(INVALID_ARGUMENT),
        };
        let st = self.state()?;
        let i = gpu as usize;
        let g = st.gpus.get(i).and_then(|g| g.gpu_instances.iter().position(|x| x.id == gi)).ok_or(INVALID_ARGUMENT)?;
        let c =
            st.gpus[i].gpu_instances[g].compute_instances.iter().position(|x| x.id == ci).ok_or(INVALID_ARGUMENT)?;
        Ok((st, i, g, c))
    }

    // === system ===

    pub fn driver_version(&self) -> &'static str {
        DRIVER_VERSION
    }

    /// nvmlDeviceGetCount: discovery, where the simulator's `discover` faults fire.
    pub fn device_count(&self) -> Ret<u32> {
        let gpus = self.sim.gpus().map_err(code)?;
        self.after_change();
        Ok(gpus.len() as u32)
    }

    pub fn handle_by_index(&self, index: u32) -> Ret<usize> {
        let st = self.state()?;
        if index as usize >= st.gpus.len() {
            return Err(INVALID_ARGUMENT);
        }
        Ok(Handle::Gpu(index).encode())
    }

    /// A GPU UUID or a MIG UUID.
    pub fn handle_by_uuid(&self, uuid: &str) -> Ret<usize> {
        let st = self.state()?;
        for (i, g) in st.gpus.iter().enumerate() {
            if g.uuid.eq_ignore_ascii_case(uuid) {
                return Ok(Handle::Gpu(i as u32).encode());
            }
            for gi in &g.gpu_instances {
                if let Some(ci) = gi.compute_instances.iter().find(|c| c.uuid.eq_ignore_ascii_case(uuid)) {
                    return Ok(Handle::Mig { gpu: i as u32, gi: gi.id, ci: ci.id }.encode());
                }
            }
        }
        Err(NOT_FOUND)
    }

    // === device queries ===

    pub fn uuid(&self, h: usize) -> Ret<String> {
        if let Ok((st, i, g, c)) = self.ci(h, true) {
            return Ok(st.gpus[i].gpu_instances[g].compute_instances[c].uuid.clone());
        }
        let (st, i) = self.gpu(h)?;
        Ok(st.gpus[i].uuid.clone())
    }

    pub fn minor(&self, h: usize) -> Ret<u32> {
        let (st, i) = self.gpu(h)?;
        Ok(st.gpus[i].minor)
    }

    pub fn index(&self, h: usize) -> Ret<u32> {
        let (st, i) = self.gpu(h)?;
        Ok(st.gpus[i].index)
    }

    /// (bus ID `00000000:18:00.0`, pciDeviceId), the device ID unknown to the catalog when
    /// `unlisted`.
    pub fn pci(&self, h: usize) -> Ret<(String, u32)> {
        let (st, i) = self.gpu(h)?;
        let g = &st.gpus[i];
        let device = if self.config.unlisted { 0x0001 } else { model_of(g)?.pci_device_ids[0] };
        Ok((g.pci_bus_id.clone(), (u32::from(device) << 16) | 0x10DE))
    }

    pub fn name(&self, h: usize) -> Ret<String> {
        if let Ok((st, i, g, _)) = self.ci(h, true) {
            let gpu = &st.gpus[i];
            let p = model_of(gpu)?.profile(gpu.gpu_instances[g].profile_id).ok_or(UNKNOWN)?;
            return Ok(format!("{} MIG {}", self.product_name(gpu)?, p.name));
        }
        let (st, i) = self.gpu(h)?;
        self.product_name(&st.gpus[i])
    }

    fn product_name(&self, g: &SimGpu) -> Ret<String> {
        let name = model_of(g)?.product_name.clone();
        Ok(if self.config.unlisted { name.replacen("NVIDIA ", "NVIDIA Unlisted ", 1) } else { name })
    }

    pub fn memory_bytes(&self, h: usize) -> Ret<u64> {
        let (st, i) = self.gpu(h)?;
        Ok(model_of(&st.gpus[i])?.memory_mib * 1024 * 1024)
    }

    /// (current, pending): migdra never changes it, so they are always equal.
    pub fn mig_mode(&self, h: usize) -> Ret<u32> {
        let (st, i) = self.gpu(h)?;
        Ok(u32::from(st.gpus[i].mig_enabled))
    }

    pub fn compute_capability(&self, h: usize) -> Ret<(u32, u32)> {
        let (st, i) = self.gpu(h)?;
        Ok(model_of(&st.gpus[i])?.cuda_compute_capability)
    }

    // === MIG: GPU instances ===

    /// GetGpuInstanceProfileInfoV by profile *index*. Like the real library's, it answers with
    /// MIG off too (profile queries are independent of the MIG mode).
    pub fn gi_profile_info(&self, h: usize, index: u32) -> Ret<(GiProfileInfo<'static>, u32)> {
        let (st, i) = self.gpu(h)?;
        if index >= GI_PROFILE_INDEXES {
            return Err(INVALID_ARGUMENT);
        }
        let m = model_of(&st.gpus[i])?;
        let p = m.profiles.iter().find(|p| p.index == index).ok_or(NOT_SUPPORTED)?;
        Ok((GiProfileInfo { profile: p, name: format!("MIG {}", p.name) }, m.memory_slices))
    }

    /// GetGpuInstancePossiblePlacements_v2: `(start, size)`, with MIG off too.
    pub fn placements(&self, h: usize, profile_id: u32) -> Ret<Vec<(u32, u32)>> {
        let (st, i) = self.gpu(h)?;
        let p = model_of(&st.gpus[i])?.profile(profile_id).ok_or(INVALID_ARGUMENT)?;
        Ok(p.placements.iter().map(|&s| (s, p.memory_slices)).collect())
    }

    pub fn create_gi(&self, h: usize, profile_id: u32, start: u32, size: u32) -> Ret<usize> {
        let (st, i) = self.gpu(h)?;
        let g = &st.gpus[i];
        if g.mig_enabled
            && let Some(p) = model_of(g)?.profile(profile_id)
            && p.memory_slices != size
        {
            return Err(INVALID_ARGUMENT);
        }
        let gi = self.sim.create_gpu_instance(&g.uuid, profile_id, start).map_err(code)?;
        self.after_change();
        Ok(Handle::Gi { gpu: i as u32, gi: gi.id }.encode())
    }

    /// GetGpuInstances of one profile: a listing, where `list-gi` faults fire.
    pub fn gpu_instances(&self, h: usize, profile_id: u32) -> Ret<Vec<usize>> {
        let (st, i) = self.gpu(h)?;
        let gis = self.sim.gpu_instances(&st.gpus[i].uuid).map_err(code)?;
        model_of(&st.gpus[i])?.profile(profile_id).ok_or(INVALID_ARGUMENT)?;
        Ok(gis
            .iter()
            .filter(|g| g.profile_id == profile_id)
            .map(|g| Handle::Gi { gpu: i as u32, gi: g.id }.encode())
            .collect())
    }

    pub fn gi_by_id(&self, h: usize, id: u32) -> Ret<usize> {
        let (st, i) = self.mig_gpu(h)?;
        st.gpus[i].gpu_instances.iter().find(|g| g.id == id).ok_or(NOT_FOUND)?;
        Ok(Handle::Gi { gpu: i as u32, gi: id }.encode())
    }

    pub fn gi_info(&self, h: usize) -> Ret<GiInfo> {
        let (st, i, g) = self.gi(h)?;
        let x = &st.gpus[i].gpu_instances[g];
        Ok(GiInfo { gpu: i as u32, id: x.id, profile_id: x.profile_id, start: x.start, size: x.size })
    }

    pub fn destroy_gi(&self, h: usize) -> Ret<()> {
        let (st, i, g) = self.gi(h)?;
        let gpu = &st.gpus[i];
        self.sim.destroy_gpu_instance(&gpu.uuid, gpu.gpu_instances[g].id).map_err(code)?;
        self.after_change();
        Ok(())
    }

    // === MIG: compute instances ===

    /// GpuInstanceGetComputeInstanceProfileInfoV by CI profile *index* (equal to its ID).
    pub fn ci_profile_info(&self, h: usize, index: u32, engine_profile: u32) -> Ret<CiProfileInfo<'static>> {
        let (st, i, g) = self.gi(h)?;
        if engine_profile != 0 || index >= CI_PROFILE_INDEXES {
            return Err(INVALID_ARGUMENT);
        }
        let gpu = &st.gpus[i];
        let gi = model_of(gpu)?.profile(gpu.gpu_instances[g].profile_id).ok_or(UNKNOWN)?;
        let ci = gi.ci_profiles.iter().find(|c| c.id == index).ok_or(NOT_SUPPORTED)?;
        Ok(CiProfileInfo { gi, ci, name: format!("MIG {}", ci.name) })
    }

    pub fn create_ci(&self, h: usize, profile_id: u32) -> Ret<usize> {
        let (st, i, g) = self.gi(h)?;
        let gpu = &st.gpus[i];
        let gi = gpu.gpu_instances[g].id;
        let ci = self.sim.create_compute_instance(&gpu.uuid, gi, profile_id).map_err(code)?;
        self.after_change();
        Ok(Handle::Ci { gpu: i as u32, gi, ci: ci.id }.encode())
    }

    /// GetComputeInstances of one CI profile: a listing, where `list-ci` faults fire.
    pub fn compute_instances(&self, h: usize, profile_id: u32) -> Ret<Vec<usize>> {
        let (st, i, g) = self.gi(h)?;
        let gpu = &st.gpus[i];
        let gi = gpu.gpu_instances[g].id;
        let cis = self.sim.compute_instances(&gpu.uuid, gi).map_err(code)?;
        Ok(cis
            .iter()
            .filter(|c| c.profile_id == profile_id)
            .map(|c| Handle::Ci { gpu: i as u32, gi, ci: c.id }.encode())
            .collect())
    }

    pub fn ci_by_id(&self, h: usize, id: u32) -> Ret<usize> {
        let (st, i, g) = self.gi(h)?;
        let gi = &st.gpus[i].gpu_instances[g];
        gi.compute_instances.iter().find(|c| c.id == id).ok_or(NOT_FOUND)?;
        Ok(Handle::Ci { gpu: i as u32, gi: gi.id, ci: id }.encode())
    }

    pub fn ci_info(&self, h: usize) -> Ret<CiInfo> {
        let (st, i, g, c) = self.ci(h, false)?;
        let gi = &st.gpus[i].gpu_instances[g];
        let ci = &gi.compute_instances[c];
        Ok(CiInfo { gpu: i as u32, gi: gi.id, id: ci.id, profile_id: ci.profile_id, start: ci.start, size: ci.size })
    }

    pub fn destroy_ci(&self, h: usize) -> Ret<()> {
        let (st, i, g, c) = self.ci(h, false)?;
        let gpu = &st.gpus[i];
        let gi = &gpu.gpu_instances[g];
        self.sim.destroy_compute_instance(&gpu.uuid, gi.id, gi.compute_instances[c].id).map_err(code)?;
        self.after_change();
        Ok(())
    }

    // === MIG devices ===

    /// GetMaxMigDeviceCount: 0 with MIG off.
    pub fn max_mig_devices(&self, h: usize) -> Ret<u32> {
        let (st, i) = self.gpu(h)?;
        let g = &st.gpus[i];
        Ok(if g.mig_enabled { model_of(g)?.compute_slices } else { 0 })
    }

    /// GetMigDeviceHandleByIndex: the CIs in (GI ID, CI ID) order.
    pub fn mig_device_by_index(&self, h: usize, index: u32) -> Ret<usize> {
        let (st, i) = self.mig_gpu(h)?;
        let mut all: Vec<(u32, u32)> = st.gpus[i]
            .gpu_instances
            .iter()
            .flat_map(|g| g.compute_instances.iter().map(move |c| (g.id, c.id)))
            .collect();
        all.sort_unstable();
        let (gi, ci) = all.get(index as usize).copied().ok_or(NOT_FOUND)?;
        Ok(Handle::Mig { gpu: i as u32, gi, ci }.encode())
    }

    pub fn is_mig_device(&self, h: usize) -> Ret<bool> {
        match Handle::decode(h) {
            Some(Handle::Mig { .. }) => Ok(true),
            Some(Handle::Gpu(_)) => Ok(false),
            _ => Err(INVALID_ARGUMENT),
        }
    }

    /// (parent handle, GI ID, CI ID) of a MIG device handle.
    pub fn mig_parent(&self, h: usize) -> Ret<(usize, u32, u32)> {
        let (st, i, g, c) = self.ci(h, true).map_err(|_| NOT_SUPPORTED)?;
        let gi = &st.gpus[i].gpu_instances[g];
        Ok((Handle::Gpu(i as u32).encode(), gi.id, gi.compute_instances[c].id))
    }

    // === events ===

    pub fn event_set_create(&self) -> Ret<usize> {
        let seen = self.state()?.xid_seq;
        let mut sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        sets.0 += 1;
        let n = sets.0;
        sets.1.insert(n, EventSet { devices: Vec::new(), seen });
        Ok(Handle::EventSet(n).encode())
    }

    fn set_number(h: usize) -> Ret<u32> {
        match Handle::decode(h) {
            Some(Handle::EventSet(n)) => Ok(n),
            _ => Err(INVALID_ARGUMENT),
        }
    }

    /// Only XID events exist in the simulator; asking for others is NOT_SUPPORTED.
    pub fn register_events(&self, dev: usize, types: u64, set: usize) -> Ret<()> {
        let (_, i) = self.gpu(dev)?;
        if types & !EVENT_XID != 0 {
            return Err(NOT_SUPPORTED);
        }
        let n = Self::set_number(set)?;
        let mut sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        let s = sets.1.get_mut(&n).ok_or(INVALID_ARGUMENT)?;
        s.devices.push((i as u32, types));
        Ok(())
    }

    pub fn event_set_free(&self, set: usize) -> Ret<()> {
        let n = Self::set_number(set)?;
        let mut sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        sets.1.remove(&n).map(|_| ()).ok_or(INVALID_ARGUMENT)
    }

    /// EventSetWait: the next XID on a registered GPU, polling the state file until `timeout`.
    pub fn event_wait(&self, set: usize, timeout: Duration) -> Ret<Event> {
        let n = Self::set_number(set)?;
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.state()?;
            {
                let mut sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
                let s = sets.1.get_mut(&n).ok_or(INVALID_ARGUMENT)?;
                let next = st.xids.iter().find(|x| {
                    x.seq > s.seen && s.devices.iter().any(|(g, types)| *g == x.gpu && types & EVENT_XID != 0)
                });
                if let Some(x) = next {
                    s.seen = x.seq;
                    return Ok(Event { gpu: x.gpu, xid: x.xid, gi: x.gi.unwrap_or(NO_INSTANCE) });
                }
                // Events of unwatched GPUs are skipped for good.
                s.seen = s.seen.max(st.xids.iter().map(|x| x.seq).max().unwrap_or(0));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TIMEOUT);
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(25)));
        }
    }
}
