//! The catalog's data: one function per GPU model, transcribed from `shared/facts/mig-nvml.md`.
//!
//! Every number here is a fact from that file (section given per model). Rows it marks as
//! inferred or unverified carry `Evidence::Inferred`/`Unverified` and a note saying why.

use super::catalog::{CiProfile, Engines, Evidence, GiProfile, GpuModel, MediaEngines};

/// Every model migdra knows, in the order `migdra profiles` lists them.
pub(super) fn all() -> Vec<GpuModel> {
    vec![h100_80gb()]
}

/// A GPU instance profile row as lgip prints it: engines are `[CE, DEC, ENC, JPG, OFA]`.
#[allow(clippy::too_many_arguments)] // mirrors one lgip row, column for column
fn gi(
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
    fn marked(mut self, evidence: Evidence, note: &str) -> Self {
        self.evidence = evidence;
        self.note = note.to_string();
        self
    }
}

/// Compute-instance profiles inside a GI of `g` compute slices (facts §1.11): CI ID = NVML CI
/// profile index; the default CI spans the GI. Counts follow A100's lcip; SMs split evenly.
fn ci_profiles(gi_name: &str, g: u32, gi_sm: u32) -> Vec<CiProfile> {
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

/// H100 80GB (facts §1.4): real lgip from several drivers plus lgipp; newer-driver memory.
fn h100_80gb() -> GpuModel {
    const ALL7: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
    GpuModel {
        key: "h100-80gb".into(),
        product_name: "NVIDIA H100 80GB HBM3".into(),
        nvml_names: vec!["NVIDIA H100 PCIe".into(), "NVIDIA H800".into(), "NVIDIA H800 PCIe".into()],
        pci_device_ids: vec![0x2330, 0x2331, 0x2322, 0x2324],
        architecture: "Hopper".into(),
        cuda_compute_capability: (9, 0),
        memory_mib: 81559,
        multiprocessors: 132,
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            gi("1g.10gb", 0, 19, 1, 1, 7, 9984, 16, [1, 1, 0, 1, 0], ALL7),
            gi("1g.10gb+me", 7, 20, 1, 1, 1, 9984, 16, [1, 1, 0, 1, 1], ALL7),
            gi("1g.20gb", 9, 15, 1, 2, 4, 20096, 26, [1, 1, 0, 1, 0], &[0, 2, 4, 6]),
            gi("2g.20gb", 1, 14, 2, 2, 3, 20096, 32, [2, 2, 0, 2, 0], &[0, 2, 4]),
            gi("3g.40gb", 2, 9, 3, 4, 2, 40448, 60, [3, 3, 0, 3, 0], &[0, 4]),
            gi("4g.40gb", 3, 5, 4, 4, 1, 40448, 64, [4, 4, 0, 4, 0], &[0]),
            gi("7g.80gb", 4, 0, 7, 8, 1, 81152, 132, [8, 7, 0, 7, 1], &[0]),
        ],
        evidence: Evidence::Observed,
        note: "whole-GPU memory 81559 MiB is nvidia-smi's figure, not in the facts".into(),
    }
}
