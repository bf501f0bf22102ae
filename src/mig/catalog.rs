//! The GPU model catalog: every MIG fact migdra relies on, as data.
//!
//! Values come from `docs/facts/mig-nvml.md` §1 (real `nvidia-smi mig -lgip/-lgipp` output where it
//! exists). Rows the facts mark inferred or unverified keep that mark in [`Evidence`], and
//! `migdra profiles` prints it, so an operator can tell measured facts from educated guesses.

use serde::Serialize;
use std::sync::LazyLock;

/// How sure we are of a catalog row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Evidence {
    /// Seen in real `nvidia-smi` output or NVIDIA's guide.
    Observed,
    /// Derived from another model with the same IDs and slice sizes, or from a formula.
    Inferred,
    /// Not seen anywhere; a placeholder the simulator needs. Real hardware is queried instead.
    Unverified,
}

/// Media engines of a profile: the `+me`, `+me.all` and `-me` suffixes of the profile name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MediaEngines {
    /// The plain profile.
    Standard,
    /// `+me` (NVML `*_REV1`): holds the GPU's single OFA; at most one per GPU.
    Me,
    /// `+me.all` (`*_ALL_ME`): holds every media engine; only `-me` profiles may sit beside it.
    AllMe,
    /// `-me` (`*_NO_ME`): no media engines at all.
    NoMe,
}

/// Copy and media engine counts of a GPU instance profile (lgip CE/DEC/ENC/JPEG/OFA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Engines {
    pub copy: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg: u32,
    pub ofa: u32,
}

/// A compute instance profile inside a GPU instance (`nvidia-smi mig -lcip`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CiProfile {
    /// e.g. `1c.3g.20gb`, or the GI's own name for the default (full) CI.
    pub name: String,
    /// NVML CI profile ID (equal to the `NVML_COMPUTE_INSTANCE_PROFILE_*` index).
    pub id: u32,
    /// Compute slices this CI takes inside its GI.
    pub compute_slices: u32,
    /// How many of them fit in one GI.
    pub max_instances: u32,
    pub multiprocessors: u32,
    /// The CI that takes the whole GI; migdra always creates this one.
    pub is_default: bool,
    pub evidence: Evidence,
}

/// A GPU instance profile (`nvidia-smi mig -lgip` row plus its `-lgipp` placements).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GiProfile {
    /// e.g. `1g.10gb+me`.
    pub name: String,
    /// `NVML_GPU_INSTANCE_PROFILE_*`: only ever passed to GetGpuInstanceProfileInfo.
    pub index: u32,
    /// The profile ID every other NVML call takes (19, 20, 15, 14, 9, 5, 0 on H100).
    pub id: u32,
    pub compute_slices: u32,
    /// Placement size, in memory slices.
    pub memory_slices: u32,
    pub memory_mib: u64,
    pub max_instances: u32,
    pub multiprocessors: u32,
    pub engines: Engines,
    pub media: MediaEngines,
    /// `+gfx` profiles (graphics capable, RTX PRO only).
    pub gfx: bool,
    /// Valid placement starts, in memory slices; every placement has size `memory_slices`.
    pub placements: Vec<u32>,
    pub ci_profiles: Vec<CiProfile>,
    pub evidence: Evidence,
    /// What is inferred or unverified in this row, and from what.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub note: String,
}

/// A GPU model: identity, the whole-GPU resources, and its MIG profiles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuModel {
    /// The `--sim`/`--model` key, e.g. `h100-80gb`.
    pub key: String,
    /// What NVML's `nvmlDeviceGetName` returns, e.g. `NVIDIA H100 80GB HBM3`.
    pub product_name: String,
    /// Other NVML names of the same model (PCIe, NVL, H800 …), matched case-insensitively.
    pub nvml_names: Vec<String>,
    /// PCI device IDs (the high 16 bits of NVML `pciDeviceId`).
    pub pci_device_ids: Vec<u16>,
    /// `Ampere`, `Hopper`, `Blackwell`.
    pub architecture: String,
    /// CUDA compute capability (major, minor).
    pub cuda_compute_capability: (u32, u32),
    /// Total device memory as NVML reports it for the whole GPU.
    pub memory_mib: u64,
    /// Multiprocessors of the whole GPU.
    pub multiprocessors: u32,
    /// Memory slices of the placement grid: 8, 4 on A30, 12 on RTX PRO 6000.
    pub memory_slices: u32,
    /// Compute slices of the GPU: 7, 4 on A30 and RTX PRO 6000.
    pub compute_slices: u32,
    pub profiles: Vec<GiProfile>,
    pub evidence: Evidence,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub note: String,
}

impl GpuModel {
    /// The profile with this NVML profile ID.
    pub fn profile(&self, id: u32) -> Option<&GiProfile> {
        self.profiles.iter().find(|p| p.id == id)
    }

    /// The profile with this name (`3g.40gb`), case-insensitive.
    pub fn profile_by_name(&self, name: &str) -> Option<&GiProfile> {
        self.profiles.iter().find(|p| p.name.eq_ignore_ascii_case(name))
    }

    /// Whether MIG mode may be toggled without a reboot: Hopper and newer (docs/facts/mig-nvml.md §5).
    pub fn supports_mig_mode_toggle(&self) -> bool {
        self.architecture != "Ampere"
    }

    /// Comma-separated profile names, for "valid choices" in error messages.
    pub fn profile_names(&self) -> String {
        let names: Vec<String> = self.profiles.iter().map(|p| format!("{} (ID {})", p.name, p.id)).collect();
        names.join(", ")
    }
}

impl GiProfile {
    /// The compute instance migdra creates in this GI: the one spanning all of it.
    pub fn default_ci(&self) -> Option<&CiProfile> {
        self.ci_profiles.iter().find(|c| c.is_default)
    }

    /// Placement starts as `{0,2,4}:2`, the way `nvidia-smi mig -lgipp` prints them.
    pub fn placements_text(&self) -> String {
        let starts: Vec<String> = self.placements.iter().map(u32::to_string).collect();
        format!("{{{}}}:{}", starts.join(","), self.memory_slices)
    }
}

static MODELS: LazyLock<Vec<GpuModel>> = LazyLock::new(super::models::all);

/// Every model in the catalog.
pub fn models() -> &'static [GpuModel] {
    &MODELS
}

/// The model with this `--sim`/`--model` key.
pub fn model(key: &str) -> Option<&'static GpuModel> {
    models().iter().find(|m| m.key.eq_ignore_ascii_case(key))
}

/// The valid model keys, for error messages.
pub fn model_keys() -> String {
    let keys: Vec<&str> = models().iter().map(|m| m.key.as_str()).collect();
    keys.join(", ")
}

/// Recognize a model by the PCI device ID (high 16 bits of NVML `pciDeviceId`).
pub fn model_by_pci_device_id(device_id: u16) -> Option<&'static GpuModel> {
    models().iter().find(|m| m.pci_device_ids.contains(&device_id))
}

/// Recognize a model by the name NVML reports.
pub fn model_by_nvml_name(name: &str) -> Option<&'static GpuModel> {
    let name = name.trim();
    models().iter().find(|m| {
        m.product_name.eq_ignore_ascii_case(name) || m.nvml_names.iter().any(|n| n.eq_ignore_ascii_case(name))
    })
}
