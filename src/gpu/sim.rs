//! A faithful MIG simulator behind [`GpuBackend`] (docs/design.md, "Testing without a GPU").
//!
//! What makes it faithful (docs/facts/mig-nvml.md §0, §4, §5):
//! - real profile IDs, placements and engine counts from the catalog, and NVML's admission rules
//!   from [`rules::admits`], with NVML's error codes (overlap → INSUFFICIENT_RESOURCES, a bad
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

use super::{ComputeInstance, GpuBackend, GpuError, GpuInfo, GpuInstance, NvmlCode, Result, xid};
use crate::mig::catalog::{self, GiProfile, GpuModel};
use crate::mig::rules::{self, Placed, Refusal};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

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

const SPEC_FORM: &str = "expected MODEL:COUNT[:mig-off][,...], e.g. h100-80gb:2,a100-40gb:1:mig-off";
const FAULT_FORM: &str = "expected OP=ERROR[:COUNT] or OP=delay:DURATION[:COUNT], optionally followed by \
                          @PROBABILITY and #GPU, e.g. create-gi=insufficient-resources:1, destroy-gi=delay:1s, \
                          create-ci=in-use@0.05";

// ---------------------------------------------------------------------------------------------
// The --sim spec
// ---------------------------------------------------------------------------------------------

/// One simulated GPU of a [`SimSpec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimGpuSpec {
    /// Catalog key, e.g. `h100-80gb`.
    pub model: String,
    pub mig_enabled: bool,
}

/// The GPUs of a simulated node, from `--sim h100-80gb:2,a100-40gb:1:mig-off`. NVML indexes are
/// given in spec order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimSpec {
    pub gpus: Vec<SimGpuSpec>,
}

impl SimSpec {
    /// Parse `MODEL:COUNT[:mig-off][,...]`.
    pub fn parse(s: &str) -> Result<SimSpec> {
        let bad =
            |part: &str, why: &str| GpuError::Invalid(format!("--sim '{s}': bad part '{part}': {why}; {SPEC_FORM}"));
        if s.trim().is_empty() {
            return Err(GpuError::Invalid(format!("--sim is empty; {SPEC_FORM}")));
        }
        let mut gpus = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let fields: Vec<&str> = part.split(':').map(str::trim).collect();
            if fields.len() < 2 || fields.len() > 3 {
                return Err(bad(part, "wrong number of ':'-separated fields"));
            }
            let model = catalog::model(fields[0]).ok_or_else(|| {
                GpuError::Invalid(format!(
                    "--sim '{s}': unknown GPU model '{}'; valid models: {}",
                    fields[0],
                    catalog::model_keys()
                ))
            })?;
            let count: usize = fields[1].parse().map_err(|_| bad(part, "COUNT is not a number"))?;
            if !(1..=MAX_GPUS).contains(&count) {
                return Err(bad(part, &format!("COUNT must be 1 to {MAX_GPUS}")));
            }
            let mig_enabled = match fields.get(2).map(|m| m.to_ascii_lowercase()) {
                None => true,
                Some(m) if m == "mig-off" => false,
                Some(m) if m == "mig-on" => true,
                Some(_) => return Err(bad(part, "the third field may only be 'mig-off'")),
            };
            gpus.extend((0..count).map(|_| SimGpuSpec { model: model.key.clone(), mig_enabled }));
        }
        if gpus.len() > MAX_GPUS {
            return Err(GpuError::Invalid(format!(
                "--sim '{s}': {} GPUs in all, at most {MAX_GPUS} are supported",
                gpus.len()
            )));
        }
        Ok(SimSpec { gpus })
    }

    /// The catalog model of each GPU, in NVML index order.
    pub fn models(&self) -> impl Iterator<Item = &'static GpuModel> + '_ {
        self.gpus.iter().map(|g| catalog::model(&g.model).expect("parsed specs name catalog models"))
    }
}

impl FromStr for SimSpec {
    type Err = GpuError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl fmt::Display for SimSpec {
    /// The compact form `parse` reads: runs of equal GPUs become `MODEL:COUNT`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        let mut i = 0;
        while i < self.gpus.len() {
            let g = &self.gpus[i];
            let run = self.gpus[i..].iter().take_while(|o| *o == g).count();
            let off = if g.mig_enabled { "" } else { ":mig-off" };
            parts.push(format!("{}:{run}{off}", g.model));
            i += run;
        }
        f.write_str(&parts.join(","))
    }
}

// ---------------------------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------------------------

/// A simulated operation a fault can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SimOp {
    /// `gpus()`.
    Discover,
    /// `gpu_instances()`.
    ListGi,
    CreateGi,
    DestroyGi,
    /// `compute_instances()`.
    ListCi,
    CreateCi,
    DestroyCi,
}

impl SimOp {
    pub const ALL: [SimOp; 7] =
        [Self::Discover, Self::ListGi, Self::CreateGi, Self::DestroyGi, Self::ListCi, Self::CreateCi, Self::DestroyCi];

    /// The kebab-case name (`create-gi`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Discover => "discover",
            Self::ListGi => "list-gi",
            Self::CreateGi => "create-gi",
            Self::DestroyGi => "destroy-gi",
            Self::ListCi => "list-ci",
            Self::CreateCi => "create-ci",
            Self::DestroyCi => "destroy-ci",
        }
    }

    /// The NVML call this operation stands for, for error messages.
    pub fn nvml_call(self) -> &'static str {
        match self {
            Self::Discover => "nvmlDeviceGetHandleByIndex",
            Self::ListGi => "nvmlDeviceGetGpuInstances",
            Self::CreateGi => "nvmlDeviceCreateGpuInstanceWithPlacement",
            Self::DestroyGi => "nvmlGpuInstanceDestroy",
            Self::ListCi => "nvmlGpuInstanceGetComputeInstances",
            Self::CreateCi => "nvmlGpuInstanceCreateComputeInstance",
            Self::DestroyCi => "nvmlComputeInstanceDestroy",
        }
    }

    pub fn parse(s: &str) -> Option<SimOp> {
        let s = s.trim().to_ascii_lowercase().replace('_', "-");
        Self::ALL.into_iter().find(|o| o.name() == s)
    }

    /// The valid names, for error messages.
    pub fn names() -> String {
        let names: Vec<&str> = Self::ALL.iter().map(|o| o.name()).collect();
        names.join(", ")
    }
}

impl fmt::Display for SimOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a fault does to the operation it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Fail with this NVML code; nothing changes.
    Fail(NvmlCode),
    /// Sleep this long (holding no lock), then do the operation.
    Delay(Duration),
}

/// An injected fault, written `OP=ERROR[:COUNT][@PROBABILITY][#GPU]` or
/// `OP=delay:DURATION[:COUNT][@PROBABILITY][#GPU]`. It is stored in the state file in that form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Fault {
    pub op: SimOp,
    pub action: FaultAction,
    /// How many more times it fires; `None` is forever. Dropped when it reaches 0.
    pub remaining: Option<u32>,
    /// Chance that it fires on a matching operation; `None` is always.
    pub probability: Option<f64>,
    /// Only operations on this GPU (UUID or NVML index); `None` is every GPU.
    pub gpu: Option<String>,
}

impl Fault {
    /// Parse one fault.
    pub fn parse(s: &str) -> Result<Fault> {
        let orig = s.trim();
        let bad = |why: &str| {
            GpuError::Invalid(format!(
                "fault '{orig}': {why}; {FAULT_FORM}; ops: {}; errors: {}",
                SimOp::names(),
                NvmlCode::names()
            ))
        };
        let mut body = orig;
        let (mut probability, mut gpu) = (None, None);
        while let Some(i) = body.rfind(['@', '#']) {
            let (head, tail) = body.split_at(i);
            let value = tail[1..].trim();
            if tail.starts_with('#') {
                if gpu.is_some() || value.is_empty() {
                    return Err(bad("'#GPU' must name one GPU (UUID or index)"));
                }
                gpu = Some(value.to_string());
            } else {
                let p: f64 = value.parse().map_err(|_| bad("'@PROBABILITY' must be a number from 0 to 1"))?;
                if probability.is_some() || !(0.0..=1.0).contains(&p) {
                    return Err(bad("'@PROBABILITY' must be a number from 0 to 1"));
                }
                probability = Some(p);
            }
            body = head;
        }
        let (op, action) = body.split_once('=').ok_or_else(|| bad("missing '='"))?;
        let op = SimOp::parse(op).ok_or_else(|| bad(&format!("unknown operation '{}'", op.trim())))?;
        if op == SimOp::Discover && gpu.is_some() {
            return Err(bad("discover covers the whole node, so it takes no '#GPU'"));
        }
        let fields: Vec<&str> = action.split(':').map(str::trim).collect();
        let (action, rest) = if fields[0].eq_ignore_ascii_case("delay") {
            let d = fields.get(1).ok_or_else(|| bad("delay needs a duration, e.g. delay:300ms"))?;
            let d = crate::duration::parse(d).map_err(|e| bad(&e.to_string()))?;
            (FaultAction::Delay(d), &fields[2..])
        } else {
            let code = NvmlCode::parse(fields[0]).ok_or_else(|| bad(&format!("unknown error '{}'", fields[0])))?;
            (FaultAction::Fail(code), &fields[1..])
        };
        let remaining = match rest {
            [] => None,
            [n] => match n.parse::<u32>() {
                Ok(n) if n >= 1 => Some(n),
                _ => return Err(bad(&format!("COUNT '{n}' must be a whole number of at least 1"))),
            },
            _ => return Err(bad("too many ':'-separated fields")),
        };
        Ok(Fault { op, action, remaining, probability, gpu })
    }

    /// Parse a comma-separated list (the `MIGDRA_SIM_FAULTS` format); empty entries are skipped.
    pub fn parse_list(s: &str) -> Result<Vec<Fault>> {
        s.split(',').filter(|p| !p.trim().is_empty()).map(Fault::parse).collect()
    }

    fn matches(&self, op: SimOp, gpu: Option<usize>, state: &SimState) -> bool {
        if self.op != op {
            return false;
        }
        match &self.gpu {
            None => true,
            Some(sel) => gpu.is_some() && state.resolve(sel).ok() == gpu,
        }
    }
}

impl FromStr for Fault {
    type Err = GpuError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=", self.op)?;
        match self.action {
            FaultAction::Fail(code) => f.write_str(code.name())?,
            FaultAction::Delay(d) => write!(f, "delay:{}", crate::duration::format(d))?,
        }
        if let Some(n) = self.remaining {
            write!(f, ":{n}")?;
        }
        if let Some(p) = self.probability {
            write!(f, "@{p}")?;
        }
        if let Some(g) = &self.gpu {
            write!(f, "#{g}")?;
        }
        Ok(())
    }
}

impl TryFrom<String> for Fault {
    type Error = GpuError;
    fn try_from(s: String) -> Result<Self> {
        Self::parse(&s)
    }
}

impl From<Fault> for String {
    fn from(f: Fault) -> String {
        f.to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------------

/// Everything the simulated hardware is; the state file holds exactly this (as JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimState {
    /// Format version, [`STATE_VERSION`].
    pub version: u32,
    /// Changes on [`SimBackend::reboot`]; instances belong to one boot.
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

fn yes() -> bool {
    true
}

/// PCI buses of an 8-GPU HGX board, in NVML (bus) order.
const HGX_BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

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
            let bus = if n <= HGX_BUSES.len() { HGX_BUSES[i] } else { 0x04 + 3 * i as u32 };
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
        }
    }

    /// The next value of the deterministic generator (splitmix64 over `seed` and `counter`).
    fn next_u64(&mut self) -> u64 {
        self.counter += 1;
        splitmix64(self.seed.wrapping_add(self.counter.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
    }

    fn new_boot_id(&mut self) -> String {
        let (a, b) = (self.next_u64(), self.next_u64());
        let u = hex_uuid((a & !0xF000) | 0x4000, (b & !(0xC << 60)) | (0x8 << 60));
        u.to_ascii_lowercase()
    }

    fn mig_uuid(&mut self) -> String {
        let (a, b) = (self.next_u64(), self.next_u64());
        // Version nibble 5, RFC 4122 variant (y in 8..b), like every MIG UUID seen (docs/facts/mig-nvml.md §4).
        format!("MIG-{}", hex_uuid((a & !0xF000) | 0x5000, (b & !(0xC << 60)) | (0x8 << 60)))
    }

    /// A GPU that must have MIG on, else NOT_SUPPORTED.
    fn mig_gpu(&self, gpu: &str, op: SimOp) -> Result<usize> {
        let i = self.resolve(gpu)?;
        if !self.gpus[i].mig_enabled {
            return Err(nvml(op, &self.gpus[i], NvmlCode::NotSupported));
        }
        Ok(i)
    }

    fn gi_pos(&self, i: usize, gi_id: u32, op: SimOp) -> Result<usize> {
        let g = &self.gpus[i];
        g.gpu_instances.iter().position(|x| x.id == gi_id).ok_or_else(|| nvml(op, g, NvmlCode::NotFound))
    }

    /// Record an XID on GPU `i` (or one of its GIs) and apply it: a critical one marks the GPU or
    /// the GI unhealthy ([`xid::is_critical`]).
    fn record_xid(&mut self, i: usize, gi: Option<u32>, xid: u64) -> Result<()> {
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

    fn has_process(&self, i: usize, gi: u32, ci: Option<u32>) -> bool {
        let idx = self.gpus[i].index;
        self.processes.iter().any(|p| p.gpu == idx && p.gi == gi && ci.is_none_or(|c| p.ci == c))
    }

    /// Everything that must hold in a state file; a failure means someone edited it badly.
    fn validate(&self) -> std::result::Result<(), String> {
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

fn model_of(g: &SimGpu) -> &'static GpuModel {
    // validate() and SimState::new only admit catalog models.
    catalog::model(&g.model).expect("simulated GPU model is in the catalog")
}

fn nvml(op: SimOp, g: &SimGpu, code: NvmlCode) -> GpuError {
    GpuError::Nvml { op: op.nvml_call(), gpu: g.uuid.clone(), code }
}

fn refusal_code(r: &Refusal) -> NvmlCode {
    if r.is_insufficient_resources() { NvmlCode::InsufficientResources } else { NvmlCode::InvalidArgument }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 32 hex digits from two words, as 8-4-4-4-12.
fn hex_uuid(a: u64, b: u64) -> String {
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xFFFF,
        a & 0xFFFF,
        b >> 48,
        b & 0xFFFF_FFFF_FFFF
    )
}

fn random_seed() -> u64 {
    RandomState::new().hash_one((std::time::SystemTime::now(), std::process::id()))
}

/// The GI IDs the driver hands a profile out of (docs/facts/mig-nvml.md §0: observed IDs group by size; the exact
/// algorithm is undocumented, so the pick inside the bucket is pseudo-random).
fn gi_id_bucket(model: &GpuModel, p: &GiProfile) -> RangeInclusive<u32> {
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

// ---------------------------------------------------------------------------------------------
// The backend
// ---------------------------------------------------------------------------------------------

/// The simulator. In memory, or backed by a state file shared between processes.
pub struct SimBackend {
    file: Option<StateFile>,
    local: Mutex<Local>,
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(file) => f.debug_struct("SimBackend").field("path", &file.path).finish_non_exhaustive(),
            None => f.debug_struct("SimBackend").field("path", &"(in memory)").finish_non_exhaustive(),
        }
    }
}

struct StateFile {
    path: PathBuf,
    lock: PathBuf,
}

struct Local {
    /// The state of an in-memory simulator.
    memory: Option<SimState>,
    extra: Extra,
}

/// Process-local fault state.
struct Extra {
    env_faults: Vec<Fault>,
    /// Generator for fault probabilities (not part of the state: read-only ops must not write).
    rng: u64,
}

/// What the faults decided for one operation.
struct Decision {
    delay: Duration,
    fail: Option<NvmlCode>,
    gpu_label: String,
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

    fn from_parts(file: Option<StateFile>, memory: Option<SimState>) -> Self {
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

    fn lock_local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One transaction: lock, read, run `f` on a copy, write the copy back if `f` succeeded and
    /// changed it, unlock. A failed `f` leaves everything as it was.
    fn txn<T>(&self, f: impl FnOnce(&mut SimState, &mut Extra) -> Result<T>) -> Result<T> {
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
    fn op<T>(&self, op: SimOp, gpu: Option<&str>, f: impl FnOnce(&mut SimState) -> Result<T>) -> Result<T> {
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

/// Which faults hit this operation. Every fault that fires counts down; delays add up; the first
/// failure wins (later failures do not fire).
fn decide(st: &mut SimState, extra: &mut Extra, op: SimOp, gpu: Option<&str>) -> Decision {
    let pos = gpu.and_then(|g| st.resolve(g).ok());
    let gpu_label = match (pos, gpu) {
        (Some(i), _) => st.gpus[i].uuid.clone(),
        (None, Some(g)) => g.to_string(),
        (None, None) => "all".to_string(),
    };
    let mut d = Decision { delay: Duration::ZERO, fail: None, gpu_label };
    let mut persisted = std::mem::take(&mut st.faults);
    for list in [&mut persisted, &mut extra.env_faults] {
        list.retain_mut(|f| {
            if !f.matches(op, pos, st) {
                return true;
            }
            if matches!(f.action, FaultAction::Fail(_)) && d.fail.is_some() {
                return true;
            }
            if f.probability.is_some_and(|p| roll(&mut extra.rng) >= p) {
                return true;
            }
            match f.action {
                FaultAction::Fail(code) => d.fail = Some(code),
                FaultAction::Delay(t) => d.delay += t,
            }
            match &mut f.remaining {
                Some(n) => {
                    *n -= 1;
                    *n > 0
                }
                None => true,
            }
        });
    }
    st.faults = persisted;
    d
}

/// A uniform draw from [0, 1).
fn roll(rng: &mut u64) -> f64 {
    *rng = rng.wrapping_add(1);
    (splitmix64(*rng) >> 11) as f64 / (1u64 << 53) as f64
}

impl StateFile {
    fn new(path: &Path) -> Self {
        let mut lock = path.as_os_str().to_owned();
        lock.push(".lock");
        StateFile { path: path.to_path_buf(), lock: PathBuf::from(lock) }
    }

    fn error(&self, reason: String) -> GpuError {
        GpuError::SimState { path: self.path.display().to_string(), reason }
    }

    fn io_error(&self, what: &str, e: io::Error) -> GpuError {
        self.error(format!("{what}: {e}"))
    }

    /// Hold an exclusive flock on `<path>.lock` until the returned file is dropped.
    fn lock_file(&self) -> Result<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.lock)
            .map_err(|e| self.io_error(&format!("cannot open lock file {}", self.lock.display()), e))?;
        f.lock().map_err(|e| self.io_error(&format!("cannot lock {}", self.lock.display()), e))?;
        Ok(f)
    }

    /// The state, or `None` when there is no file. Call with the lock held.
    fn read_opt(&self) -> Result<Option<SimState>> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io_error("cannot read it", e)),
        };
        let fix = "delete it, or recreate it with --sim MODEL:COUNT[:mig-off][,...]";
        let st: SimState = serde_json::from_slice(&bytes)
            .map_err(|e| self.error(format!("not a valid simulator state ({e}); {fix}")))?;
        st.validate().map_err(|e| self.error(format!("not a valid simulator state: {e}; {fix}")))?;
        Ok(Some(st))
    }

    /// Replace the file atomically, so a reader in another process never sees half a state.
    fn write(&self, st: &SimState) -> Result<()> {
        let mut json =
            serde_json::to_vec_pretty(st).map_err(|e| self.error(format!("cannot encode the state: {e}")))?;
        json.push(b'\n');
        crate::files::write_atomic(&self.path, &json, 0o644).map_err(|e| self.error(e.to_string()))
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
        Ok(super::SIM_CAPS_MAJOR)
    }

    fn mig_capability_minors(&self, gpu_minor: u32, gi_id: u32, ci_id: u32) -> Result<(u32, u32)> {
        Ok(super::capability_minors(gpu_minor, gi_id, ci_id))
    }

    fn unhealthy_reason(&self, gpu: &str, gi: Option<u32>) -> Option<String> {
        let st = self.state().ok()?;
        let index = st.gpus[st.resolve(gpu).ok()?].index;
        let x = st.xids.iter().rev().find(|x| x.gpu == index && x.gi == gi && xid::is_critical(x.xid))?;
        Some(format!("XID {}", x.xid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const H100: u32 = 8; // memory slices
    const P1G: u32 = 19; // 1g.10gb
    const P2G: u32 = 14; // 2g.20gb
    const P3G: u32 = 9; // 3g.40gb
    const P4G: u32 = 5; // 4g.40gb
    const P7G: u32 = 0; // 7g.80gb

    fn spec(s: &str) -> SimSpec {
        SimSpec::parse(s).unwrap()
    }

    fn sim(s: &str) -> SimBackend {
        SimBackend::in_memory_seeded(&spec(s), 42)
    }

    fn code<T: fmt::Debug>(r: Result<T>) -> NvmlCode {
        r.unwrap_err().code().expect("an NVML error")
    }

    fn invalid_msg<T: fmt::Debug>(r: Result<T>) -> String {
        match r.unwrap_err() {
            GpuError::Invalid(m) => m,
            e => panic!("expected Invalid, got {e:?}"),
        }
    }

    fn hex(s: &str, lens: &[usize]) -> bool {
        let parts: Vec<&str> = s.split('-').collect();
        parts.len() == lens.len()
            && parts.iter().zip(lens).all(|(p, n)| p.len() == *n && p.chars().all(|c| c.is_ascii_hexdigit()))
    }

    #[test]
    fn backend_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<SimBackend>();
    }

    #[test]
    fn spec_parses_models_counts_and_mig_off_in_order() {
        let s = spec("h100-80gb:2, H100-80GB:1:mig-off");
        assert_eq!(s.gpus.len(), 3);
        assert!(s.gpus.iter().all(|g| g.model == "h100-80gb"));
        assert_eq!(s.gpus.iter().map(|g| g.mig_enabled).collect::<Vec<_>>(), [true, true, false]);
        assert_eq!(s.to_string(), "h100-80gb:2,h100-80gb:1:mig-off");
        assert_eq!(spec(&s.to_string()), s);
        assert_eq!(s.models().count(), 3);
        assert_eq!(spec("h100-80gb:64").gpus.len(), 64);
    }

    #[test]
    fn spec_errors_name_the_bad_part_and_the_expected_form() {
        let m = invalid_msg(SimSpec::parse("h100-80gb:1,z900-1gb:2"));
        assert!(m.contains("z900-1gb") && m.contains("h100-80gb"), "{m}");
        for (bad, part) in [
            ("h100-80gb", "h100-80gb"),
            ("h100-80gb:0", "h100-80gb:0"),
            ("h100-80gb:65", "h100-80gb:65"),
            ("h100-80gb:two", "h100-80gb:two"),
            ("h100-80gb:1:mig-of", "h100-80gb:1:mig-of"),
            ("h100-80gb:1:mig-off:x", "h100-80gb:1:mig-off:x"),
            ("h100-80gb:1,", "''"),
        ] {
            let m = invalid_msg(SimSpec::parse(bad));
            assert!(m.contains(part) && m.contains("MODEL:COUNT[:mig-off]"), "{bad}: {m}");
            assert!(!m.contains('\n'));
        }
        assert!(invalid_msg(SimSpec::parse("  ")).contains("MODEL:COUNT"));
        assert!(invalid_msg(SimSpec::parse("h100-80gb:40,h100-80gb:40")).contains("80 GPUs"));
    }

    #[test]
    fn identity_minors_differ_from_indexes_and_ids_look_like_nvml() {
        let s = sim("h100-80gb:2,h100-80gb:1:mig-off");
        let gpus = s.gpus().unwrap();
        assert_eq!(gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(gpus.iter().map(|g| g.minor).collect::<Vec<_>>(), [1, 0, 2]);
        let four = sim("h100-80gb:4").gpus().unwrap();
        assert_eq!(four.iter().map(|g| g.minor).collect::<Vec<_>>(), [1, 0, 3, 2]);
        for g in &gpus {
            assert!(g.uuid.starts_with("GPU-") && hex(&g.uuid[4..], &[8, 4, 4, 4, 12]), "{}", g.uuid);
            assert!(g.pci_bus_id.starts_with("00000000:") && g.pci_bus_id.ends_with(":00.0"), "{}", g.pci_bus_id);
            assert_eq!(g.driver_version, DRIVER_VERSION);
            assert_eq!(g.product_name, "NVIDIA H100 80GB HBM3");
            assert_eq!(g.cuda_compute_capability, (9, 0));
            assert!(g.healthy);
        }
        assert!(gpus[0].mig_enabled && !gpus[2].mig_enabled);
        let mut buses: Vec<&str> = gpus.iter().map(|g| g.pci_bus_id.as_str()).collect();
        assert!(buses.windows(2).all(|w| w[0] < w[1]), "NVML index is PCI bus order");
        buses.dedup();
        assert_eq!(buses.len(), 3);
        let mut uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        uuids.dedup();
        assert_eq!(uuids.len(), 3);
        // Deterministic from the seed; different seeds give different hardware.
        assert_eq!(sim("h100-80gb:2,h100-80gb:1:mig-off").gpus().unwrap(), gpus);
        let other = SimBackend::in_memory_seeded(&spec("h100-80gb:1"), 7).gpus().unwrap();
        assert_ne!(other[0].uuid, gpus[0].uuid);
        // Many GPUs still get distinct buses.
        let big = SimBackend::in_memory_seeded(&spec("h100-80gb:64"), 1).gpus().unwrap();
        let mut b: Vec<&str> = big.iter().map(|g| g.pci_bus_id.as_str()).collect();
        b.sort();
        b.dedup();
        assert_eq!(b.len(), 64);
    }

    #[test]
    fn gpus_resolve_by_uuid_or_index() {
        let s = sim("h100-80gb:2");
        let uuid = s.gpus().unwrap()[1].uuid.clone();
        assert_eq!(s.resolve(&uuid).unwrap(), 1);
        assert_eq!(s.resolve(&uuid.to_ascii_lowercase()).unwrap(), 1);
        assert_eq!(s.resolve("0").unwrap(), 0);
        assert!(matches!(s.resolve("5"), Err(GpuError::UnknownGpu(_))));
        assert!(matches!(s.resolve("GPU-nope"), Err(GpuError::UnknownGpu(_))));
        let gi = s.create_gpu_instance(&uuid, P7G, 0).unwrap();
        assert_eq!(s.gpu_instances("1").unwrap(), vec![gi]);
        assert!(matches!(s.create_gpu_instance("GPU-nope", P1G, 0), Err(GpuError::UnknownGpu(_))));
        assert_eq!(s.model("1").unwrap().key, "h100-80gb");
    }

    #[test]
    fn overlap_and_busy_gpu_give_insufficient_resources() {
        let s = sim("h100-80gb:1");
        let gi = s.create_gpu_instance("0", P3G, 0).unwrap();
        assert_eq!((gi.profile_id, gi.start, gi.size), (P3G, 0, 4));
        assert_eq!(code(s.create_gpu_instance("0", P4G, 0)), NvmlCode::InsufficientResources);
        assert_eq!(code(s.create_gpu_instance("0", P1G, 1)), NvmlCode::InsufficientResources);
        assert_eq!(code(s.create_gpu_instance("0", P7G, 0)), NvmlCode::InsufficientResources);
        s.create_gpu_instance("0", P3G, 4).unwrap();
        // A third 3g: both placements taken (and the maximum reached).
        assert_eq!(code(s.create_gpu_instance("0", P3G, 4)), NvmlCode::InsufficientResources);
        // Media engines: one +me per GPU.
        let s = sim("h100-80gb:1");
        s.create_gpu_instance("0", 20, 0).unwrap();
        assert_eq!(code(s.create_gpu_instance("0", 20, 1)), NvmlCode::InsufficientResources);
    }

    #[test]
    fn bad_profile_or_placement_gives_invalid_argument() {
        let s = sim("h100-80gb:1");
        assert_eq!(code(s.create_gpu_instance("0", P3G, 2)), NvmlCode::InvalidArgument);
        assert_eq!(code(s.create_gpu_instance("0", P1G, 7)), NvmlCode::InvalidArgument);
        assert_eq!(code(s.create_gpu_instance("0", 99, 0)), NvmlCode::InvalidArgument);
        assert!(s.gpu_instances("0").unwrap().is_empty());
    }

    #[test]
    fn gi_ids_come_from_size_buckets_not_from_placement() {
        for seed in 0..16 {
            let s = SimBackend::in_memory_seeded(&spec("h100-80gb:1"), seed);
            let ids: Vec<u32> = (0..4).map(|start| s.create_gpu_instance("0", P1G, start).unwrap().id).collect();
            let mut d = ids.clone();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), 4, "{ids:?}");
            assert!(ids.iter().all(|id| (7..=14).contains(id)), "{ids:?}");
            let big = s.create_gpu_instance("0", P3G, 4).unwrap().id;
            assert!((1..=2).contains(&big));
        }
        let s = sim("h100-80gb:1");
        assert_eq!(s.create_gpu_instance("0", P7G, 0).unwrap().id, 0);
        let s = sim("h100-80gb:1");
        assert!((3..=6).contains(&s.create_gpu_instance("0", P2G, 2).unwrap().id));
        // Across seeds, placement order does not predict ID order.
        let unordered = (0..32).any(|seed| {
            let s = SimBackend::in_memory_seeded(&spec("h100-80gb:1"), seed);
            let ids: Vec<u32> = (0..4).map(|start| s.create_gpu_instance("0", P1G, start).unwrap().id).collect();
            ids.windows(2).any(|w| w[0] > w[1])
        });
        assert!(unordered);
    }

    #[test]
    fn compute_instances_follow_the_gi_profile() {
        let s = sim("h100-80gb:1");
        let gi = s.create_gpu_instance("0", P3G, 0).unwrap();
        // 3g: CI profiles 0 (1c ×3), 1 (2c ×1), 2 (3g ×1); 3 is a 4g-only profile.
        assert_eq!(code(s.create_compute_instance("0", gi.id, 3)), NvmlCode::InvalidArgument);
        assert_eq!(code(s.create_compute_instance("0", 13, 0)), NvmlCode::NotFound);
        let a = s.create_compute_instance("0", gi.id, 1).unwrap();
        assert_eq!((a.id, a.gi_id, a.start, a.size), (0, gi.id, 0, 2));
        assert!(a.uuid.starts_with("MIG-") && hex(&a.uuid[4..], &[8, 4, 4, 4, 12]), "{}", a.uuid);
        assert_eq!(&a.uuid[18..19], "5", "version nibble: {}", a.uuid);
        assert!("89ab".contains(&a.uuid[23..24]), "variant: {}", a.uuid);
        assert_eq!(code(s.create_compute_instance("0", gi.id, 1)), NvmlCode::InsufficientResources);
        assert_eq!(code(s.create_compute_instance("0", gi.id, 2)), NvmlCode::InsufficientResources);
        let b = s.create_compute_instance("0", gi.id, 0).unwrap();
        assert_eq!((b.id, b.start, b.size), (1, 2, 1));
        assert_eq!(code(s.create_compute_instance("0", gi.id, 0)), NvmlCode::InsufficientResources);
        assert_eq!(s.compute_instances("0", gi.id).unwrap(), vec![a.clone(), b.clone()]);
        // IDs: lowest free; UUIDs stable for an instance's lifetime.
        s.destroy_compute_instance("0", gi.id, 0).unwrap();
        let c = s.create_compute_instance("0", gi.id, 0).unwrap();
        assert_eq!((c.id, c.start), (0, 0));
        assert_ne!(c.uuid, a.uuid);
        assert_eq!(s.compute_instances("0", gi.id).unwrap()[1].uuid, b.uuid);
        assert_eq!(code(s.destroy_compute_instance("0", gi.id, 7)), NvmlCode::NotFound);
        assert_eq!(code(s.compute_instances("0", 13)), NvmlCode::NotFound);
    }

    #[test]
    fn destroying_a_gi_with_a_ci_is_in_use() {
        let s = sim("h100-80gb:1");
        let gi = s.create_gpu_instance("0", P2G, 0).unwrap();
        let ci = s.create_compute_instance("0", gi.id, 1).unwrap();
        assert_eq!(code(s.destroy_gpu_instance("0", gi.id)), NvmlCode::InUse);
        assert_eq!(s.gpu_instances("0").unwrap().len(), 1);
        s.destroy_compute_instance("0", gi.id, ci.id).unwrap();
        s.destroy_gpu_instance("0", gi.id).unwrap();
        assert!(s.gpu_instances("0").unwrap().is_empty());
        assert_eq!(code(s.destroy_gpu_instance("0", gi.id)), NvmlCode::NotFound);
    }

    #[test]
    fn a_process_on_a_ci_makes_its_destroy_in_use() {
        let s = sim("h100-80gb:1");
        let gi = s.create_gpu_instance("0", P1G, 3).unwrap();
        let ci = s.create_compute_instance("0", gi.id, 0).unwrap();
        s.add_process("0", gi.id, ci.id).unwrap();
        assert_eq!(code(s.add_process("0", gi.id, 5)), NvmlCode::NotFound);
        assert_eq!(code(s.destroy_compute_instance("0", gi.id, ci.id)), NvmlCode::InUse);
        assert_eq!(s.state().unwrap().processes.len(), 1);
        s.clear_processes("0").unwrap();
        s.destroy_compute_instance("0", gi.id, ci.id).unwrap();
        s.destroy_gpu_instance("0", gi.id).unwrap();
    }

    #[test]
    fn mig_off_gpus_do_not_support_instances() {
        let s = sim("h100-80gb:1:mig-off");
        assert_eq!(code(s.create_gpu_instance("0", P1G, 0)), NvmlCode::NotSupported);
        assert_eq!(code(s.gpu_instances("0")), NvmlCode::NotSupported);
        assert_eq!(code(s.compute_instances("0", 0)), NvmlCode::NotSupported);
        assert_eq!(code(s.destroy_gpu_instance("0", 0)), NvmlCode::NotSupported);
        assert_eq!(code(s.create_compute_instance("0", 0, 0)), NvmlCode::NotSupported);
        assert_eq!(code(s.destroy_compute_instance("0", 0, 0)), NvmlCode::NotSupported);
        assert_eq!(s.model("0").unwrap().key, "h100-80gb");
    }

    #[test]
    fn health_flags_show_in_discovery_and_state() {
        let s = sim("h100-80gb:2");
        s.set_gpu_health("1", false).unwrap();
        assert_eq!(s.gpus().unwrap().iter().map(|g| g.healthy).collect::<Vec<_>>(), [true, false]);
        let gi = s.create_gpu_instance("0", P7G, 0).unwrap();
        s.set_instance_health("0", gi.id, false).unwrap();
        assert!(!s.state().unwrap().gpus[0].gpu_instances[0].healthy);
        assert_eq!(code(s.set_instance_health("0", 9, false)), NvmlCode::NotFound);
    }

    #[test]
    fn reboot_clears_instances_and_changes_the_boot_id() {
        let s = sim("h100-80gb:2,h100-80gb:1:mig-off");
        let gpus = s.gpus().unwrap();
        let boot = s.boot_id().unwrap();
        let gi = s.create_gpu_instance("1", P4G, 0).unwrap();
        let ci = s.create_compute_instance("1", gi.id, 3).unwrap();
        s.add_process("1", gi.id, ci.id).unwrap();
        s.set_gpu_health("0", false).unwrap();
        s.add_fault(Fault::parse("destroy-gi=in-use").unwrap()).unwrap();
        s.reboot().unwrap();
        assert_ne!(s.boot_id().unwrap(), boot);
        assert!(s.gpu_instances("1").unwrap().is_empty());
        let st = s.state().unwrap();
        assert!(st.processes.is_empty());
        assert_eq!(st.faults.len(), 1, "faults are configuration, they survive");
        // Identity and MIG mode stay; health comes back.
        assert_eq!(s.gpus().unwrap(), gpus);
    }

    #[test]
    fn xids_are_recorded_in_order_and_only_critical_ones_hurt() {
        let s = sim("h100-80gb:2");
        let gi = s.create_gpu_instance("1", P3G, 0).unwrap();
        s.xid("0", None, 13).unwrap();
        assert!(s.gpus().unwrap()[0].healthy, "XID 13 is the application's fault");
        s.xid("1", Some(gi.id), 48).unwrap();
        assert!(s.gpus().unwrap()[1].healthy, "an instance XID leaves the GPU healthy");
        assert!(!s.gpu_instances("1").unwrap()[0].healthy);
        s.set_gpu_health("0", false).unwrap();
        assert!(!s.gpus().unwrap()[0].healthy);
        s.set_gpu_health("0", true).unwrap();
        assert!(s.gpus().unwrap()[0].healthy);
        assert_eq!(s.unhealthy_reason("1", Some(gi.id)).as_deref(), Some("XID 48"));
        assert_eq!(s.unhealthy_reason("0", None).as_deref(), Some("XID 79"));
        assert_eq!(s.unhealthy_reason("1", None), None);
        let st = s.state().unwrap();
        let seen: Vec<(u64, u32, Option<u32>, u64)> = st.xids.iter().map(|x| (x.seq, x.gpu, x.gi, x.xid)).collect();
        assert_eq!(seen, [(1, 0, None, 13), (2, 1, Some(gi.id), 48), (3, 0, None, xid::XID_FALLEN_OFF_BUS)]);
        assert_eq!(code(s.xid("1", Some(9), 48)), NvmlCode::NotFound);
        assert!(matches!(s.xid("5", None, 48), Err(GpuError::UnknownGpu(_))));
        for _ in 0..MAX_XIDS {
            s.xid("0", None, 31).unwrap();
        }
        let st = s.state().unwrap();
        assert_eq!((st.xids.len(), st.xid_seq, st.xids[0].seq), (MAX_XIDS, 3 + MAX_XIDS as u64, 4));
        s.reboot().unwrap();
        let st = s.state().unwrap();
        assert!(st.xids.is_empty());
        assert_eq!(st.xid_seq, 3 + MAX_XIDS as u64, "sequence numbers never repeat");
    }

    #[test]
    fn faults_parse_print_and_reject_bad_input() {
        let f = Fault::parse("create-gi=insufficient-resources:1").unwrap();
        assert_eq!(f.op, SimOp::CreateGi);
        assert_eq!(f.action, FaultAction::Fail(NvmlCode::InsufficientResources));
        assert_eq!(f.remaining, Some(1));
        // The one duration syntax of flags: minutes work here as they do for `--grace`.
        assert_eq!(Fault::parse("create-gi=delay:2m").unwrap().action, FaultAction::Delay(Duration::from_secs(120)));
        let f = Fault::parse("destroy-gi=delay:1s").unwrap();
        assert_eq!((f.action, f.remaining), (FaultAction::Delay(Duration::from_secs(1)), None));
        let f = Fault::parse("create-ci=in-use@0.05").unwrap();
        assert_eq!((f.action, f.probability), (FaultAction::Fail(NvmlCode::InUse), Some(0.05)));
        let f = Fault::parse("list-ci=delay:300ms:2@0.5#GPU-abc").unwrap();
        assert_eq!(f.action, FaultAction::Delay(Duration::from_millis(300)));
        assert_eq!((f.remaining, f.probability, f.gpu.as_deref()), (Some(2), Some(0.5), Some("GPU-abc")));
        let g = Fault::parse("destroy-ci=IN_USE#1@1").unwrap();
        assert_eq!((g.gpu.as_deref(), g.probability), (Some("1"), Some(1.0)));
        for s in ["create-gi=insufficient-resources:1", "list-ci=delay:300ms:2@0.5#GPU-abc", "discover=delay:1500us"] {
            assert_eq!(Fault::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(Fault::parse_list(" create-gi=in-use:1, ,destroy-ci=23 ").unwrap().len(), 2);
        assert!(Fault::parse_list("").unwrap().is_empty());
        for (bad, names) in [
            ("create-gi", "create-gi"),
            ("make-gi=in-use", "make-gi"),
            ("create-gi=on-fire", "on-fire"),
            ("create-gi=in-use:0", "'0'"),
            ("create-gi=in-use:x", "'x'"),
            ("create-gi=in-use:1:2", "create-gi=in-use:1:2"),
            ("create-gi=delay", "duration"),
            ("create-gi=delay:3d", "3d"),
            ("create-gi=in-use@1.5", "PROBABILITY"),
            ("create-gi=in-use#", "GPU"),
            ("discover=in-use#0", "discover"),
        ] {
            let m = invalid_msg(Fault::parse(bad));
            assert!(m.contains(names), "{bad}: {m}");
            assert!(m.contains("create-gi, destroy-gi") && m.contains("insufficient-resources"), "{m}");
            assert!(!m.contains('\n'));
        }
        assert!(Fault::parse_list("create-gi=in-use,bogus").is_err());
    }

    #[test]
    fn counted_faults_fire_that_many_times_then_go_away() {
        let s = sim("h100-80gb:1");
        s.add_fault(Fault::parse("create-gi=in-use:2").unwrap()).unwrap();
        assert_eq!(code(s.create_gpu_instance("0", P1G, 0)), NvmlCode::InUse);
        assert_eq!(s.state().unwrap().faults[0].remaining, Some(1));
        assert_eq!(code(s.create_gpu_instance("0", P1G, 0)), NvmlCode::InUse);
        assert!(s.state().unwrap().faults.is_empty());
        s.create_gpu_instance("0", P1G, 0).unwrap();
        // Other ops and other GPUs are not hit.
        let s = sim("h100-80gb:2");
        s.add_fault(Fault::parse("create-gi=gpu-is-lost#1").unwrap()).unwrap();
        s.create_gpu_instance("0", P7G, 0).unwrap();
        let uuid1 = s.gpus().unwrap()[1].uuid.clone();
        let e = s.create_gpu_instance(&uuid1, P7G, 0).unwrap_err();
        assert_eq!(e.code(), Some(NvmlCode::GpuIsLost));
        assert!(e.to_string().contains(&uuid1), "{e}");
        assert!(matches!(s.add_fault(Fault::parse("create-gi=in-use#7").unwrap()), Err(GpuError::UnknownGpu(_))));
        s.clear_faults().unwrap();
        s.create_gpu_instance(&uuid1, P7G, 0).unwrap();
        // Probability 0 never fires, 1 always does.
        let s = sim("h100-80gb:1");
        s.add_fault(Fault::parse("list-gi=not-found@0").unwrap()).unwrap();
        for _ in 0..20 {
            s.gpu_instances("0").unwrap();
        }
        s.add_fault(Fault::parse("list-gi=unknown:3@1").unwrap()).unwrap();
        assert_eq!(code(s.gpu_instances("0")), NvmlCode::Unknown);
        assert_eq!(s.state().unwrap().faults.len(), 2);
    }

    #[test]
    fn injected_failures_change_nothing() {
        let s = sim("h100-80gb:1");
        let gi = s.create_gpu_instance("0", P2G, 0).unwrap();
        let ci = s.create_compute_instance("0", gi.id, 1).unwrap();
        let faults = "create-gi=insufficient-resources,destroy-gi=in-use,create-ci=unknown,destroy-ci=no-permission";
        for f in Fault::parse_list(faults).unwrap() {
            s.add_fault(f).unwrap();
        }
        let before = s.state().unwrap();
        assert_eq!(code(s.create_gpu_instance("0", P2G, 2)), NvmlCode::InsufficientResources);
        assert_eq!(code(s.destroy_compute_instance("0", gi.id, ci.id)), NvmlCode::NoPermission);
        assert_eq!(code(s.create_compute_instance("0", gi.id, 0)), NvmlCode::Unknown);
        assert_eq!(code(s.destroy_gpu_instance("0", gi.id)), NvmlCode::InUse);
        assert_eq!(s.state().unwrap(), before);
        // Real refusals change nothing either (not even the generator).
        s.clear_faults().unwrap();
        let before = s.state().unwrap();
        assert!(s.create_gpu_instance("0", P3G, 0).is_err());
        assert_eq!(s.state().unwrap(), before);
    }

    #[test]
    fn delays_are_applied() {
        let s = sim("h100-80gb:1").with_env_faults(Some("create-gi=delay:150ms:1")).unwrap();
        let t = Instant::now();
        s.create_gpu_instance("0", P1G, 0).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(150));
        let t = Instant::now();
        s.create_gpu_instance("0", P1G, 1).unwrap();
        assert!(t.elapsed() < Duration::from_millis(150), "the counted delay is used up");
    }

    #[test]
    fn env_faults_are_not_persisted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.json");
        let s = SimBackend::open(&path, Some(&spec("h100-80gb:1")))
            .unwrap()
            .with_env_faults(Some("create-gi=in-use"))
            .unwrap();
        assert_eq!(code(s.create_gpu_instance("0", P1G, 0)), NvmlCode::InUse);
        assert!(s.state().unwrap().faults.is_empty());
        let other = SimBackend::open(&path, None).unwrap();
        other.create_gpu_instance("0", P1G, 0).unwrap();
        assert!(matches!(sim("h100-80gb:1").with_env_faults(Some("create-gi=nope")), Err(GpuError::Invalid(_))));
        assert!(matches!(sim("h100-80gb:1").with_env_faults(Some("create-gi=in-use#3")), Err(GpuError::UnknownGpu(_))));
        assert!(sim("h100-80gb:1").with_env_faults(None).is_ok());
    }

    #[test]
    fn two_opens_of_one_file_see_each_others_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.json");
        let a = SimBackend::open(&path, Some(&spec("h100-80gb:2"))).unwrap();
        let b = SimBackend::open(&path, None).unwrap();
        let c = SimBackend::open(&path, Some(&spec("h100-80gb:2"))).unwrap();
        assert_eq!(a.gpus().unwrap(), b.gpus().unwrap());
        let gi = a.create_gpu_instance("1", P3G, 4).unwrap();
        assert_eq!(b.gpu_instances("1").unwrap(), vec![gi.clone()]);
        let ci = b.create_compute_instance("1", gi.id, 2).unwrap();
        assert_eq!(c.compute_instances("1", gi.id).unwrap(), vec![ci.clone()]);
        b.add_fault(Fault::parse("destroy-ci=in-use:1").unwrap()).unwrap();
        assert_eq!(code(c.destroy_compute_instance("1", gi.id, ci.id)), NvmlCode::InUse);
        a.destroy_compute_instance("1", gi.id, ci.id).unwrap();
        assert_eq!(a.boot_id().unwrap(), c.boot_id().unwrap());
        c.reboot().unwrap();
        assert_eq!(a.boot_id().unwrap(), c.boot_id().unwrap());
        assert!(a.gpu_instances("1").unwrap().is_empty());
        assert_eq!(a.path(), Some(path.as_path()));
    }

    #[test]
    fn read_only_operations_never_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.json");
        let s = SimBackend::open(&path, Some(&spec("h100-80gb:1"))).unwrap();
        s.create_gpu_instance("0", P7G, 0).unwrap();
        let bytes = fs::read(&path).unwrap();
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        s.state().unwrap();
        s.gpus().unwrap();
        s.gpu_instances("0").unwrap();
        s.compute_instances("0", 0).unwrap();
        s.boot_id().unwrap();
        s.model("0").unwrap();
        assert!(s.create_gpu_instance("0", P1G, 0).is_err());
        assert_eq!(fs::read(&path).unwrap(), bytes);
        assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), mtime);
    }

    #[test]
    fn open_needs_a_spec_or_a_matching_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.json");
        let m = invalid_msg(SimBackend::open(&path, None));
        assert!(m.contains("--sim"), "{m}");
        assert!(!path.exists());
        SimBackend::open(&path, Some(&spec("h100-80gb:2"))).unwrap();
        let m = invalid_msg(SimBackend::open(&path, Some(&spec("h100-80gb:3"))));
        assert!(m.contains("h100-80gb:2") && m.contains("h100-80gb:3"), "{m}");
        let m = invalid_msg(SimBackend::open(&path, Some(&spec("h100-80gb:1,h100-80gb:1:mig-off"))));
        assert!(m.contains("mig-off"), "{m}");
        // Unknown fields (from a newer migdra) are tolerated.
        let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        v["future_field"] = serde_json::json!({"x": 1});
        v["gpus"][0]["future"] = serde_json::json!(true);
        fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(SimBackend::open(&path, None).unwrap().gpus().unwrap().len(), 2);
    }

    #[test]
    fn a_corrupt_file_is_reported_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.json");
        for junk in [
            &b"{\"version\": 1, \"gpus\": [tru"[..],
            b"",
            b"{\"version\": 9, \"boot_id\": \"x\", \"seed\": 1, \"counter\": 0, \"gpus\": []}",
        ] {
            fs::write(&path, junk).unwrap();
            for r in [
                SimBackend::open(&path, None).map(|_| ()),
                SimBackend::open(&path, Some(&spec("h100-80gb:1"))).map(|_| ()),
            ] {
                match r {
                    Err(GpuError::SimState { path: p, reason }) => {
                        assert_eq!(p, path.display().to_string());
                        assert!(reason.contains("delete it") && reason.contains("--sim"), "{reason}");
                    }
                    other => panic!("expected SimState, got {other:?}"),
                }
            }
            assert_eq!(fs::read(&path).unwrap(), junk);
        }
        // Corrupted under a running simulator: operations fail, nothing is written.
        fs::remove_file(&path).unwrap();
        let s = SimBackend::open(&path, Some(&spec("h100-80gb:1"))).unwrap();
        fs::write(&path, b"garbage").unwrap();
        assert!(matches!(s.create_gpu_instance("0", P7G, 0), Err(GpuError::SimState { .. })));
        assert_eq!(fs::read(&path).unwrap(), b"garbage");
        fs::remove_file(&path).unwrap();
        assert!(matches!(s.gpus(), Err(GpuError::SimState { .. })));
    }

    #[test]
    fn delays_on_different_gpus_overlap_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.json");
        let s = SimBackend::open(&path, Some(&spec("h100-80gb:8"))).unwrap();
        s.add_fault(Fault::parse("create-gi=delay:300ms").unwrap()).unwrap();
        let t = Instant::now();
        std::thread::scope(|scope| {
            for gpu in 0..8 {
                let s = &s;
                scope.spawn(move || s.create_gpu_instance(&gpu.to_string(), P7G, 0).unwrap());
            }
        });
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_millis(1200), "{took:?}");
        let st = s.state().unwrap();
        assert!(st.gpus.iter().all(|g| g.gpu_instances.len() == 1));
        // In memory too.
        let s = SimBackend::in_memory(&spec("h100-80gb:8")).with_env_faults(Some("create-gi=delay:300ms")).unwrap();
        let t = Instant::now();
        std::thread::scope(|scope| {
            for gpu in 0..8 {
                let s = &s;
                scope.spawn(move || s.create_gpu_instance(&gpu.to_string(), P7G, 0).unwrap());
            }
        });
        assert!(t.elapsed() < Duration::from_millis(1200), "{:?}", t.elapsed());
    }

    #[test]
    fn concurrent_creates_from_many_threads_never_double_allocate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.json");
        let s = SimBackend::open(&path, Some(&spec("h100-80gb:1"))).unwrap();
        let other = SimBackend::open(&path, None).unwrap();
        let wins = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|scope| {
            for t in 0..8 {
                let (s, other, wins) = (&s, &other, &wins);
                scope.spawn(move || {
                    let b = if t % 2 == 0 { s } else { other };
                    for start in 0..H100 - 1 {
                        if b.create_gpu_instance("0", P1G, start).is_ok() {
                            wins.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(wins.into_inner(), 7);
        assert_eq!(s.gpu_instances("0").unwrap().len(), 7);
    }

    #[test]
    fn state_round_trips_through_json() {
        let s = sim("h100-80gb:2");
        let gi = s.create_gpu_instance("0", P4G, 0).unwrap();
        s.create_compute_instance("0", gi.id, 1).unwrap();
        s.add_fault(Fault::parse("create-ci=delay:5ms:3@0.25#1").unwrap()).unwrap();
        let st = s.state().unwrap();
        let json = serde_json::to_string(&st).unwrap();
        assert!(json.contains("\"create-ci=delay:5ms:3@0.25#1\""), "{json}");
        let back: SimState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, st);
        assert!(back.validate().is_ok());
    }
}
