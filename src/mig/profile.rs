//! What a GPU model is made of: its GPU instance profiles, their compute instance profiles and
//! engines, and how sure we are of each row; with the builders the catalog's rows and NVML's own
//! profile queries both use to make them.

use serde::Serialize;

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

/// A GPU instance profile row as lgip prints it: engines are `[CE, DEC, ENC, JPG, OFA]`.
#[allow(clippy::too_many_arguments)] // mirrors one lgip row, column for column
pub(super) fn gi(
    name: &str,
    index: u32,
    id: u32,
    compute_slices: u32,
    memory_slices: u32,
    max_instances: u32,
    memory_mib: u64,
    multiprocessors: u32,
    [copy, decoders, encoders, jpeg, ofa]: [u32; 5],
    placements: &[u32],
) -> GiProfile {
    let media = if name.ends_with("+me.all") {
        MediaEngines::AllMe
    } else if name.ends_with("+me") {
        MediaEngines::Me
    } else if name.ends_with("-me") {
        MediaEngines::NoMe
    } else {
        MediaEngines::Standard
    };
    GiProfile {
        name: name.to_string(),
        index,
        id,
        compute_slices,
        memory_slices,
        memory_mib,
        max_instances,
        multiprocessors,
        engines: Engines { copy, decoders, encoders, jpeg, ofa },
        media,
        gfx: name.ends_with("+gfx"),
        placements: placements.to_vec(),
        ci_profiles: ci_profiles(name, compute_slices, multiprocessors),
        evidence: Evidence::Observed,
        note: String::new(),
    }
}

impl GiProfile {
    /// Mark a row as not fully observed, saying what was inferred from what.
    pub(super) fn marked(mut self, evidence: Evidence, note: &str) -> Self {
        self.evidence = evidence;
        self.note = note.to_string();
        self
    }
}

/// Compute-instance profiles inside a GI of `g` compute slices (docs/facts/mig-nvml.md §1.11): CI ID = NVML CI
/// profile index; the default CI spans the GI. Counts follow A100's lcip; SMs split evenly.
pub(super) fn ci_profiles(gi_name: &str, g: u32, gi_sm: u32) -> Vec<CiProfile> {
    // (CI compute slices, CI profile ID, instances per GI) for each GI size.
    let table: &[(u32, u32, u32)] = match g {
        1 => &[(1, 0, 1)],
        2 => &[(1, 0, 2), (2, 1, 1)],
        3 => &[(1, 0, 3), (2, 1, 1), (3, 2, 1)],
        4 => &[(1, 0, 4), (2, 1, 2), (4, 3, 1)],
        7 => &[(1, 0, 7), (2, 1, 3), (3, 2, 2), (4, 3, 1), (7, 4, 1)],
        _ => &[],
    };
    let base = gi_name.split(['+', '-']).next().unwrap_or(gi_name);
    table
        .iter()
        .map(|&(c, id, count)| {
            let is_default = c == g;
            CiProfile {
                name: if is_default { gi_name.to_string() } else { format!("{c}c.{base}") },
                id,
                compute_slices: c,
                max_instances: count,
                multiprocessors: if is_default { gi_sm } else { gi_sm / g * c },
                is_default,
                evidence: if is_default { Evidence::Observed } else { Evidence::Inferred },
            }
        })
        .collect()
}
