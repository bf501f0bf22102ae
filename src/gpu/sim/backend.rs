//! [`SimBackend`]: the simulator behind [`GpuBackend`], in memory or on a state file.

use super::fault::{Extra, decide};
use super::file::StateFile;
use super::hardware::{gi_id_bucket, model_of, nvml, random_seed, refusal_code};
use super::{FAULTS_ENV, Fault, SimCi, SimGi, SimOp, SimProcess, SimSpec, SimState};
use crate::gpu::{ComputeInstance, GpuBackend, GpuError, GpuInfo, GpuInstance, NvmlCode, Result, xid};
use crate::mig::catalog::GpuModel;
use crate::mig::rules::{self, Placed};
use std::fmt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The simulator. In memory, or backed by a state file shared between processes.
pub struct SimBackend {
    pub(super) file: Option<StateFile>,
    pub(super) local: Mutex<Local>,
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(file) => f.debug_struct("SimBackend").field("path", &file.path).finish_non_exhaustive(),
            None => f.debug_struct("SimBackend").field("path", &"(in memory)").finish_non_exhaustive(),
        }
    }
}

pub(super) struct Local {
    /// The state of an in-memory simulator.
    pub(super) memory: Option<SimState>,
    pub(super) extra: Extra,
}

impl SimBackend {
    /// A simulator in memory with a random seed.
    pub fn in_memory(spec: &SimSpec) -> Self {
        Self::in_memory_seeded(spec, random_seed())
    }

    /// A simulator in memory whose UUIDs and GI IDs follow from `seed`.
    pub fn in_memory_seeded(spec: &SimSpec, seed: u64) -> Self {
        Self::from_parts(None, Some(SimState::new(spec, seed)))
    }

    /// A simulator backed by the state file at `path`: loads it when it exists (a `spec` must then
    /// describe the same GPUs), creates it from `spec` otherwise.
    pub fn open(path: &Path, spec: Option<&SimSpec>) -> Result<Self> {
        let file = StateFile::new(path);
        let guard = file.lock_file()?;
        match file.read_opt()? {
            Some(st) => {
                if let Some(spec) = spec {
                    let have = st.spec();
                    if have != *spec {
                        return Err(GpuError::Invalid(format!(
                            "simulator state {} holds GPUs {have}, but --sim asks for {spec}; \
                             delete the file to start over, or drop --sim to use it as it is",
                            path.display()
                        )));
                    }
                }
            }
            None => {
                let spec = spec.ok_or_else(|| {
                    GpuError::Invalid(format!(
                        "no simulator state at {}; --sim MODEL:COUNT[:mig-off][,...] is needed to create it",
                        path.display()
                    ))
                })?;
                file.write(&SimState::new(spec, random_seed()))?;
            }
        }
        drop(guard);
        Ok(Self::from_parts(Some(file), None))
    }

    pub(super) fn from_parts(file: Option<StateFile>, memory: Option<SimState>) -> Self {
        SimBackend {
            file,
            local: Mutex::new(Local { memory, extra: Extra { env_faults: Vec::new(), rng: random_seed() } }),
        }
    }

    /// Add process-local faults in the `MIGDRA_SIM_FAULTS` format (not persisted). `None` or an
    /// empty string adds nothing.
    pub fn with_env_faults(self, faults: Option<&str>) -> Result<Self> {
        let faults = Fault::parse_list(faults.unwrap_or(""))?;
        if !faults.is_empty() {
            let st = self.state()?;
            for f in &faults {
                if let Some(g) = &f.gpu {
                    st.resolve(g)?;
                }
            }
            self.lock_local().extra.env_faults.extend(faults);
        }
        Ok(self)
    }

    /// [`with_env_faults`](Self::with_env_faults) with the value of `MIGDRA_SIM_FAULTS`.
    pub fn with_faults_from_env(self) -> Result<Self> {
        let v = std::env::var(FAULTS_ENV).ok();
        self.with_env_faults(v.as_deref())
    }

    /// The state file, when there is one.
    pub fn path(&self) -> Option<&Path> {
        self.file.as_ref().map(|f| f.path.as_path())
    }

    /// A snapshot of the whole simulated hardware (persistent faults included, process-local ones
    /// not). Never writes.
    pub fn state(&self) -> Result<SimState> {
        self.txn(|st, _| Ok(st.clone()))
    }

    /// The NVML index of a GPU named by UUID or index.
    pub fn resolve(&self, gpu: &str) -> Result<u32> {
        self.txn(|st, _| Ok(st.gpus[st.resolve(gpu)?].index))
    }

    /// Simulate a node reboot: every GI, CI and process is gone, the boot ID changes, GPUs are
    /// healthy again. GPU identity, MIG modes and persistent faults stay.
    pub fn reboot(&self) -> Result<()> {
        self.txn(|st, _| {
            st.processes.clear();
            st.xids.clear();
            for g in &mut st.gpus {
                g.gpu_instances.clear();
                g.healthy = true;
            }
            st.boot_id = st.new_boot_id();
            Ok(())
        })
    }

    /// Start a simulated process on a MIG device; destroys then fail with IN_USE.
    pub fn add_process(&self, gpu: &str, gi: u32, ci: u32) -> Result<()> {
        self.txn(|st, _| {
            let i = st.mig_gpu(gpu, SimOp::ListCi)?;
            let g = st.gi_pos(i, gi, SimOp::ListCi)?;
            let gpu_ref = &st.gpus[i];
            if !gpu_ref.gpu_instances[g].compute_instances.iter().any(|c| c.id == ci) {
                return Err(nvml(SimOp::ListCi, gpu_ref, NvmlCode::NotFound));
            }
            st.processes.push(SimProcess { gpu: gpu_ref.index, gi, ci });
            Ok(())
        })
    }

    /// End every simulated process on a GPU.
    pub fn clear_processes(&self, gpu: &str) -> Result<()> {
        self.txn(|st, _| {
            let idx = st.gpus[st.resolve(gpu)?].index;
            st.processes.retain(|p| p.gpu != idx);
            Ok(())
        })
    }

    /// Mark a GPU healthy or not; shows in `gpus()`. Unhealthy is what XID 79 (fallen off the
    /// bus) does, and that event is recorded too, so NVML event sets see it.
    pub fn set_gpu_health(&self, gpu: &str, healthy: bool) -> Result<()> {
        self.txn(|st, _| {
            let i = st.resolve(gpu)?;
            if healthy {
                st.gpus[i].healthy = true;
                return Ok(());
            }
            st.record_xid(i, None, xid::XID_FALLEN_OFF_BUS)
        })
    }

    /// Mark a GPU instance healthy or not; shows in [`state`](Self::state). Unhealthy records
    /// XID 94 (a contained ECC error) on that instance.
    pub fn set_instance_health(&self, gpu: &str, gi: u32, healthy: bool) -> Result<()> {
        self.txn(|st, _| {
            let i = st.mig_gpu(gpu, SimOp::ListGi)?;
            let g = st.gi_pos(i, gi, SimOp::ListGi)?;
            if healthy {
                st.gpus[i].gpu_instances[g].healthy = true;
                return Ok(());
            }
            st.record_xid(i, Some(gi), xid::XID_CONTAINED_ECC)
        })
    }

    /// Simulate an XID on a GPU, or on one of its GPU instances: recorded for NVML event sets,
    /// and, unless an application caused it ([`xid::APPLICATION_XIDS`]), the GPU or instance
    /// becomes unhealthy.
    pub fn xid(&self, gpu: &str, gi: Option<u32>, xid: u64) -> Result<()> {
        self.txn(|st, _| {
            let i = st.resolve(gpu)?;
            st.record_xid(i, gi, xid)
        })
    }

    /// Add a persistent fault (its GPU selector must name a GPU of this node).
    pub fn add_fault(&self, fault: Fault) -> Result<()> {
        self.txn(|st, _| {
            if let Some(g) = &fault.gpu {
                st.resolve(g)?;
            }
            st.faults.push(fault);
            Ok(())
        })
    }

    /// Remove every persistent fault (process-local ones from the environment stay).
    pub fn clear_faults(&self) -> Result<()> {
        self.txn(|st, _| {
            st.faults.clear();
            Ok(())
        })
    }

    pub(super) fn lock_local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One transaction: lock, read, run `f` on a copy, write the copy back if `f` succeeded and
    /// changed it, unlock. A failed `f` leaves everything as it was.
    pub(super) fn txn<T>(&self, f: impl FnOnce(&mut SimState, &mut Extra) -> Result<T>) -> Result<T> {
        let mut local = self.lock_local();
        let Local { memory, extra } = &mut *local;
        match &self.file {
            None => {
                let before = memory.as_ref().expect("an in-memory simulator has a state");
                let mut work = before.clone();
                let out = f(&mut work, extra)?;
                if work != *before {
                    *memory = Some(work);
                }
                Ok(out)
            }
            Some(file) => {
                let guard = file.lock_file()?;
                let before = file.read_opt()?.ok_or_else(|| {
                    file.error("the file is gone; recreate it with --sim MODEL:COUNT[:mig-off][,...]".to_string())
                })?;
                let mut work = before.clone();
                let out = f(&mut work, extra)?;
                if work != before {
                    file.write(&work)?;
                }
                drop(guard);
                Ok(out)
            }
        }
    }

    /// Run one NVML-like operation: decide its faults (persisting their countdown), sleep any delay
    /// holding no lock, then fail as injected or do `f` in a transaction.
    pub(super) fn op<T>(&self, op: SimOp, gpu: Option<&str>, f: impl FnOnce(&mut SimState) -> Result<T>) -> Result<T> {
        let d = self.txn(|st, extra| Ok(decide(st, extra, op, gpu)))?;
        if !d.delay.is_zero() {
            std::thread::sleep(d.delay);
        }
        if let Some(code) = d.fail {
            return Err(GpuError::Nvml { op: op.nvml_call(), gpu: d.gpu_label, code });
        }
        self.txn(|st, _| f(st))
    }
}

impl GpuBackend for SimBackend {
    fn gpus(&self) -> Result<Vec<GpuInfo>> {
        self.op(SimOp::Discover, None, |st| Ok((0..st.gpus.len()).map(|i| st.gpu_info(i)).collect()))
    }

    fn model(&self, gpu: &str) -> Result<GpuModel> {
        self.txn(|st, _| Ok(model_of(&st.gpus[st.resolve(gpu)?]).clone()))
    }

    fn gpu_instances(&self, gpu: &str) -> Result<Vec<GpuInstance>> {
        self.op(SimOp::ListGi, Some(gpu), |st| {
            let i = st.mig_gpu(gpu, SimOp::ListGi)?;
            let mut gis: Vec<GpuInstance> = st.gpus[i]
                .gpu_instances
                .iter()
                .map(|g| GpuInstance {
                    id: g.id,
                    profile_id: g.profile_id,
                    start: g.start,
                    size: g.size,
                    healthy: g.healthy,
                })
                .collect();
            gis.sort_by_key(|g| g.id);
            Ok(gis)
        })
    }

    fn create_gpu_instance(&self, gpu: &str, profile_id: u32, start: u32) -> Result<GpuInstance> {
        let op = SimOp::CreateGi;
        self.op(op, Some(gpu), |st| {
            let i = st.mig_gpu(gpu, op)?;
            let g = &st.gpus[i];
            let model = model_of(g);
            let existing: Vec<Placed> =
                g.gpu_instances.iter().map(|x| Placed { profile_id: x.profile_id, start: x.start }).collect();
            rules::admits(model, &existing, Placed { profile_id, start }).map_err(|r| nvml(op, g, refusal_code(&r)))?;
            let profile = model.profile(profile_id).expect("admitted profiles exist");
            let bucket: Vec<u32> = gi_id_bucket(model, profile).collect();
            let rotation = (st.next_u64() % bucket.len() as u64) as usize;
            let g = &st.gpus[i];
            let free = |id: &u32| !g.gpu_instances.iter().any(|x| x.id == *id);
            let id = (0..bucket.len())
                .map(|k| bucket[(rotation + k) % bucket.len()])
                .find(free)
                .or_else(|| (1..=14).find(free))
                .ok_or_else(|| nvml(op, g, NvmlCode::InsufficientResources))?;
            let gi = SimGi {
                id,
                profile_id,
                start,
                size: profile.memory_slices,
                healthy: true,
                compute_instances: Vec::new(),
            };
            st.gpus[i].gpu_instances.push(gi);
            Ok(GpuInstance { id, profile_id, start, size: profile.memory_slices, healthy: true })
        })
    }

    fn destroy_gpu_instance(&self, gpu: &str, gi_id: u32) -> Result<()> {
        let op = SimOp::DestroyGi;
        self.op(op, Some(gpu), |st| {
            let i = st.mig_gpu(gpu, op)?;
            let pos = st.gi_pos(i, gi_id, op)?;
            if !st.gpus[i].gpu_instances[pos].compute_instances.is_empty() || st.has_process(i, gi_id, None) {
                return Err(nvml(op, &st.gpus[i], NvmlCode::InUse));
            }
            st.gpus[i].gpu_instances.remove(pos);
            Ok(())
        })
    }

    fn compute_instances(&self, gpu: &str, gi_id: u32) -> Result<Vec<ComputeInstance>> {
        let op = SimOp::ListCi;
        self.op(op, Some(gpu), |st| {
            let i = st.mig_gpu(gpu, op)?;
            let gi = &st.gpus[i].gpu_instances[st.gi_pos(i, gi_id, op)?];
            let mut cis: Vec<ComputeInstance> = gi
                .compute_instances
                .iter()
                .map(|c| ComputeInstance {
                    id: c.id,
                    gi_id,
                    profile_id: c.profile_id,
                    start: c.start,
                    size: c.size,
                    uuid: c.uuid.clone(),
                })
                .collect();
            cis.sort_by_key(|c| c.id);
            Ok(cis)
        })
    }

    fn create_compute_instance(&self, gpu: &str, gi_id: u32, ci_profile_id: u32) -> Result<ComputeInstance> {
        let op = SimOp::CreateCi;
        self.op(op, Some(gpu), |st| {
            let i = st.mig_gpu(gpu, op)?;
            let pos = st.gi_pos(i, gi_id, op)?;
            let g = &st.gpus[i];
            let gi = &g.gpu_instances[pos];
            let gi_profile = model_of(g).profile(gi.profile_id).expect("validated GI profile");
            let ci_profile = gi_profile
                .ci_profiles
                .iter()
                .find(|c| c.id == ci_profile_id)
                .ok_or_else(|| nvml(op, g, NvmlCode::InvalidArgument))?;
            let same = gi.compute_instances.iter().filter(|c| c.profile_id == ci_profile_id).count() as u32;
            if same >= ci_profile.max_instances {
                return Err(nvml(op, g, NvmlCode::InsufficientResources));
            }
            let size = ci_profile.compute_slices;
            let fits = |s: u32| gi.compute_instances.iter().all(|c| s + size <= c.start || c.start + c.size <= s);
            let start = (0..gi_profile.compute_slices)
                .take_while(|s| s + size <= gi_profile.compute_slices)
                .find(|&s| fits(s))
                .ok_or_else(|| nvml(op, g, NvmlCode::InsufficientResources))?;
            let id = (0..).find(|id| !gi.compute_instances.iter().any(|c| c.id == *id)).expect("a free CI ID");
            let uuid = st.mig_uuid();
            let ci = SimCi { id, profile_id: ci_profile_id, start, size, uuid: uuid.clone() };
            st.gpus[i].gpu_instances[pos].compute_instances.push(ci);
            Ok(ComputeInstance { id, gi_id, profile_id: ci_profile_id, start, size, uuid })
        })
    }

    fn destroy_compute_instance(&self, gpu: &str, gi_id: u32, ci_id: u32) -> Result<()> {
        let op = SimOp::DestroyCi;
        self.op(op, Some(gpu), |st| {
            let i = st.mig_gpu(gpu, op)?;
            let pos = st.gi_pos(i, gi_id, op)?;
            let cis = &st.gpus[i].gpu_instances[pos].compute_instances;
            let c = cis.iter().position(|c| c.id == ci_id).ok_or_else(|| nvml(op, &st.gpus[i], NvmlCode::NotFound))?;
            if st.has_process(i, gi_id, Some(ci_id)) {
                return Err(nvml(op, &st.gpus[i], NvmlCode::InUse));
            }
            st.gpus[i].gpu_instances[pos].compute_instances.remove(c);
            Ok(())
        })
    }

    fn boot_id(&self) -> Result<String> {
        self.txn(|st, _| Ok(st.boot_id.clone()))
    }

    /// The last critical XID recorded for the GPU (or the GI), as the NVML backend reports it.
    fn caps_major(&self) -> Result<u32> {
        Ok(crate::gpu::SIM_CAPS_MAJOR)
    }

    fn mig_capability_minors(&self, gpu_minor: u32, gi_id: u32, ci_id: u32) -> Result<(u32, u32)> {
        Ok(crate::gpu::capability_minors(gpu_minor, gi_id, ci_id))
    }

    /// The simulator keeps health as hardware state: clearing marks the GPU and its instances
    /// healthy, as `migdra sim health` does.
    fn clear_health(&self, gpu: &str) -> Result<()> {
        self.txn(|st, _| {
            let i = st.resolve(gpu)?;
            st.gpus[i].healthy = true;
            for gi in &mut st.gpus[i].gpu_instances {
                gi.healthy = true;
            }
            Ok(())
        })
    }

    fn unhealthy_reason(&self, gpu: &str, gi: Option<u32>) -> Option<String> {
        let st = self.state().ok()?;
        let index = st.gpus[st.resolve(gpu).ok()?].index;
        let x = st.xids.iter().rev().find(|x| x.gpu == index && x.gi == gi && xid::is_critical(x.xid))?;
        Some(xid::reason(x.xid))
    }
}
