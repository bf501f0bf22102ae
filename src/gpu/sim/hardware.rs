//! The simulated hardware: GPUs, GPU and compute instances, processes and XIDs, and NVML's
//! rules for changing them. The state file holds exactly [`SimState`].

use super::{CUDA_DRIVER_VERSION, DRIVER_VERSION, Fault, MAX_GPUS, STATE_VERSION, SimGpuSpec, SimOp, SimSpec};
use crate::gpu::{GpuError, GpuInfo, NvmlCode, Result, xid};
use crate::mig::catalog::{self, GiProfile, GpuModel};
use crate::mig::rules::{self, Placed, Refusal};
use serde::{Deserialize, Serialize};
use std::hash::{BuildHasher, RandomState};
use std::ops::RangeInclusive;

/// Everything the simulated hardware is; the state file holds exactly this (as JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimState {
    /// Format version, [`STATE_VERSION`].
    pub version: u32,
    /// Changes on [`SimBackend::reboot`](super::SimBackend::reboot); instances belong to one boot.
    pub boot_id: String,
    /// Seed of the deterministic generator behind UUIDs and GI IDs.
    pub seed: u64,
    /// Values drawn from the generator so far.
    pub counter: u64,
    /// In NVML index order.
    pub gpus: Vec<SimGpu>,
    #[serde(default)]
    pub processes: Vec<SimProcess>,
    /// Persistent faults (those from `MIGDRA_SIM_FAULTS` are kept in the process only).
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// XID events, oldest first, at most [`MAX_XIDS`]: what NVML's event sets deliver (the fake
    /// libnvidia-ml reads them from here).
    #[serde(default)]
    pub xids: Vec<SimXid>,
    /// Sequence number of the last XID ever recorded; a reboot does not reset it.
    #[serde(default)]
    pub xid_seq: u64,
}

/// The most XID events a state file keeps.
pub const MAX_XIDS: usize = 64;

/// One XID event: `nvmlEventData_t` with `eventType` XidCriticalError.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimXid {
    /// Increases by one per event, across reboots.
    pub seq: u64,
    /// NVML index of the GPU.
    pub gpu: u32,
    /// The GPU instance the error hit, or `None` for the whole GPU.
    pub gi: Option<u32>,
    pub xid: u64,
}

/// A simulated GPU: its identity, MIG mode, health and GPU instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimGpu {
    pub index: u32,
    pub minor: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    /// Catalog key.
    pub model: String,
    pub mig_enabled: bool,
    #[serde(default = "yes")]
    pub healthy: bool,
    #[serde(default)]
    pub gpu_instances: Vec<SimGi>,
}

/// A GPU instance: driver-assigned ID, profile ID, memory-slice placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimGi {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    #[serde(default = "yes")]
    pub healthy: bool,
    #[serde(default)]
    pub compute_instances: Vec<SimCi>,
}

/// A compute instance: ID inside its GI, CI profile ID, compute-slice placement, MIG UUID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimCi {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    pub uuid: String,
}

/// A simulated process running on a MIG device (it makes destroys fail with IN_USE).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimProcess {
    /// NVML index of the GPU.
    pub gpu: u32,
    pub gi: u32,
    pub ci: u32,
}

pub(super) fn yes() -> bool {
    true
}

/// PCI buses of an 8-GPU HGX board, in NVML (bus) order.
pub(super) const HGX_BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

/// The PCI bus of GPU `i` of `n`: an HGX board's buses for up to eight, evenly spaced beyond.
fn bus(i: usize, n: usize) -> u32 {
    if n <= HGX_BUSES.len() { HGX_BUSES[i] } else { 0x04 + 3 * i as u32 }
}

/// Where GPU `i` of `n` sits, as on an HGX board: each behind its own PCIe root complex (the
/// port above its switch, three buses up), the first half on NUMA node 0 and the rest on node 1.
fn topology(i: usize, n: usize) -> crate::mig::devices::Topology {
    crate::mig::devices::Topology {
        pcie_root: Some(format!("pci0000:{:02x}", bus(i, n) - 3)),
        numa_node: Some(u32::try_from(2 * i / n.max(1)).unwrap_or(0)),
    }
}

impl SimState {
    /// Fresh hardware for a spec: no instances, identity derived from `seed`.
    pub fn new(spec: &SimSpec, seed: u64) -> SimState {
        let mut st = SimState {
            version: STATE_VERSION,
            boot_id: String::new(),
            seed,
            counter: 0,
            gpus: Vec::new(),
            processes: Vec::new(),
            faults: Vec::new(),
            xids: Vec::new(),
            xid_seq: 0,
        };
        st.boot_id = st.new_boot_id();
        let n = spec.gpus.len();
        for (i, g) in spec.gpus.iter().enumerate() {
            // Minors swap in pairs (0↔1, 2↔3, …); an odd last GPU keeps its index.
            let minor = if i % 2 == 0 { if i + 1 < n { i + 1 } else { i } } else { i - 1 };
            let bus = bus(i, n);
            let (a, b) = (st.next_u64(), st.next_u64());
            st.gpus.push(SimGpu {
                index: i as u32,
                minor: minor as u32,
                uuid: format!("GPU-{}", hex_uuid(a, b)),
                pci_bus_id: format!("00000000:{bus:02X}:00.0"),
                model: g.model.clone(),
                mig_enabled: g.mig_enabled,
                healthy: true,
                gpu_instances: Vec::new(),
            });
        }
        st
    }

    /// The GPUs this state describes, as a spec (for comparison with `--sim`).
    pub fn spec(&self) -> SimSpec {
        SimSpec {
            gpus: self.gpus.iter().map(|g| SimGpuSpec { model: g.model.clone(), mig_enabled: g.mig_enabled }).collect(),
        }
    }

    /// The position of a GPU named by UUID (case-insensitive) or NVML index.
    pub fn resolve(&self, gpu: &str) -> Result<usize> {
        let g = gpu.trim();
        let found = match g.parse::<u32>() {
            Ok(i) => self.gpus.iter().position(|x| x.index == i),
            Err(_) => self.gpus.iter().position(|x| x.uuid.eq_ignore_ascii_case(g)),
        };
        found.ok_or_else(|| {
            let last = self.gpus.len().saturating_sub(1);
            GpuError::UnknownGpu(format!("{gpu} on this node; valid: an NVML index 0-{last} or a GPU UUID"))
        })
    }

    /// What discovery reports for one GPU.
    pub fn gpu_info(&self, i: usize) -> GpuInfo {
        let g = &self.gpus[i];
        let m = model_of(g);
        GpuInfo {
            index: g.index,
            minor: g.minor,
            uuid: g.uuid.clone(),
            pci_bus_id: g.pci_bus_id.clone(),
            model: g.model.clone(),
            product_name: m.product_name.clone(),
            memory_mib: m.memory_mib,
            mig_enabled: g.mig_enabled,
            driver_version: DRIVER_VERSION.to_string(),
            cuda_driver_version: CUDA_DRIVER_VERSION.to_string(),
            cuda_compute_capability: m.cuda_compute_capability,
            healthy: g.healthy,
            topology: topology(i, self.gpus.len()),
        }
    }

    /// The next value of the deterministic generator (splitmix64 over `seed` and `counter`).
    pub(super) fn next_u64(&mut self) -> u64 {
        self.counter += 1;
        splitmix64(self.seed.wrapping_add(self.counter.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
    }

    pub(super) fn new_boot_id(&mut self) -> String {
        let (a, b) = (self.next_u64(), self.next_u64());
        let u = hex_uuid((a & !0xF000) | 0x4000, (b & !(0xC << 60)) | (0x8 << 60));
        u.to_ascii_lowercase()
    }

    pub(super) fn mig_uuid(&mut self) -> String {
        let (a, b) = (self.next_u64(), self.next_u64());
        // Version nibble 5, RFC 4122 variant (y in 8..b), like every MIG UUID seen (docs/facts/mig-nvml.md §4).
        format!("MIG-{}", hex_uuid((a & !0xF000) | 0x5000, (b & !(0xC << 60)) | (0x8 << 60)))
    }

    /// A GPU that must have MIG on, else NOT_SUPPORTED.
    pub(super) fn mig_gpu(&self, gpu: &str, op: SimOp) -> Result<usize> {
        let i = self.resolve(gpu)?;
        if !self.gpus[i].mig_enabled {
            return Err(nvml(op, &self.gpus[i], NvmlCode::NotSupported));
        }
        Ok(i)
    }

    pub(super) fn gi_pos(&self, i: usize, gi_id: u32, op: SimOp) -> Result<usize> {
        let g = &self.gpus[i];
        g.gpu_instances.iter().position(|x| x.id == gi_id).ok_or_else(|| nvml(op, g, NvmlCode::NotFound))
    }

    /// Record an XID on GPU `i` (or one of its GIs) and apply it: a critical one marks the GPU or
    /// the GI unhealthy ([`xid::is_critical`]).
    pub(super) fn record_xid(&mut self, i: usize, gi: Option<u32>, xid: u64) -> Result<()> {
        let gi_pos = match gi {
            Some(id) => Some(self.gi_pos(i, id, SimOp::ListGi)?),
            None => None,
        };
        self.xid_seq += 1;
        self.xids.push(SimXid { seq: self.xid_seq, gpu: self.gpus[i].index, gi, xid });
        if self.xids.len() > MAX_XIDS {
            self.xids.remove(0);
        }
        if xid::is_critical(xid) {
            match gi_pos {
                Some(g) => self.gpus[i].gpu_instances[g].healthy = false,
                None => self.gpus[i].healthy = false,
            }
        }
        Ok(())
    }

    pub(super) fn has_process(&self, i: usize, gi: u32, ci: Option<u32>) -> bool {
        let idx = self.gpus[i].index;
        self.processes.iter().any(|p| p.gpu == idx && p.gi == gi && ci.is_none_or(|c| p.ci == c))
    }

    /// Everything that must hold in a state file; a failure means someone edited it badly.
    pub(super) fn validate(&self) -> std::result::Result<(), String> {
        if self.version != STATE_VERSION {
            return Err(format!(
                "format version {} is not supported (this migdra reads {STATE_VERSION})",
                self.version
            ));
        }
        if self.gpus.is_empty() || self.gpus.len() > MAX_GPUS {
            return Err(format!("it lists {} GPUs (1 to {MAX_GPUS} are supported)", self.gpus.len()));
        }
        for (i, g) in self.gpus.iter().enumerate() {
            if g.index as usize != i {
                return Err(format!("GPU {} is listed at position {i}", g.index));
            }
            let m = catalog::model(&g.model)
                .ok_or_else(|| format!("GPU {i} has unknown model '{}' (valid: {})", g.model, catalog::model_keys()))?;
            let placed: Vec<Placed> =
                g.gpu_instances.iter().map(|x| Placed { profile_id: x.profile_id, start: x.start }).collect();
            rules::admits_set(m, &placed).map_err(|e| format!("GPU {i}: its GPU instances could not coexist: {e}"))?;
            let mut ids: Vec<u32> = g.gpu_instances.iter().map(|x| x.id).collect();
            ids.sort_unstable();
            if ids.windows(2).any(|w| w[0] == w[1]) {
                return Err(format!("GPU {i} has two GPU instances with the same ID"));
            }
        }
        Ok(())
    }
}

pub(super) fn model_of(g: &SimGpu) -> &'static GpuModel {
    // validate() and SimState::new only admit catalog models.
    catalog::model(&g.model).expect("simulated GPU model is in the catalog")
}

pub(super) fn nvml(op: SimOp, g: &SimGpu, code: NvmlCode) -> GpuError {
    GpuError::Nvml { op: op.nvml_call(), gpu: g.uuid.clone(), code }
}

pub(super) fn refusal_code(r: &Refusal) -> NvmlCode {
    if r.is_insufficient_resources() { NvmlCode::InsufficientResources } else { NvmlCode::InvalidArgument }
}

pub(super) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 32 hex digits from two words, as 8-4-4-4-12.
pub(super) fn hex_uuid(a: u64, b: u64) -> String {
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xFFFF,
        a & 0xFFFF,
        b >> 48,
        b & 0xFFFF_FFFF_FFFF
    )
}

pub(super) fn random_seed() -> u64 {
    RandomState::new().hash_one((std::time::SystemTime::now(), std::process::id()))
}

/// The GI IDs the driver hands a profile out of (docs/facts/mig-nvml.md §0: observed IDs group by size; the exact
/// algorithm is undocumented, so the pick inside the bucket is pseudo-random).
pub(super) fn gi_id_bucket(model: &GpuModel, p: &GiProfile) -> RangeInclusive<u32> {
    if p.compute_slices >= model.compute_slices {
        return 0..=0;
    }
    match (model.compute_slices, p.compute_slices) {
        (7, 3 | 4) => 1..=2,
        (7, 2) => 3..=6,
        (7, 1) => 7..=14,
        (4, 2) => 1..=2,
        (4, 1) => 3..=6,
        _ => 1..=14,
    }
}
