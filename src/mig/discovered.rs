//! A [`GpuModel`] for a MIG-capable GPU the catalog does not know, built from what NVML's own
//! queries return (docs/facts/mig-nvml.md §0, §2): GetGpuInstanceProfileInfoV for every profile index and
//! GetGpuInstancePossiblePlacements_v2 for every profile ID.
//!
//! Nothing here calls NVML: the NVML backend fills an [`NvmlDescription`] and this turns it into
//! the same shape the catalog uses, so the rest of migdra cannot tell the two apart.

use super::catalog::{Evidence, GpuModel};
use super::profile::gi;
use thiserror::Error;

/// What NVML reports about a whole GPU and its GPU instance profiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlDescription {
    /// `nvmlDeviceGetName`.
    pub name: String,
    /// The high 16 bits of `pciDeviceId`.
    pub pci_device_id: u16,
    /// Total device memory (`nvmlDeviceGetMemoryInfo`), in MiB.
    pub memory_mib: u64,
    pub multiprocessors: u32,
    pub cuda_compute_capability: (u32, u32),
    /// Every profile index NVML answered (NOT_SUPPORTED indexes left out).
    pub profiles: Vec<NvmlProfile>,
}

/// One `nvmlGpuInstanceProfileInfo_v3_t` plus its possible placements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlProfile {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index the info was queried with.
    pub index: u32,
    /// `info.id`, the profile ID every other call takes.
    pub id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
    pub multiprocessor_count: u32,
    pub copy_engine_count: u32,
    pub decoder_count: u32,
    pub encoder_count: u32,
    pub jpeg_count: u32,
    pub ofa_count: u32,
    pub memory_size_mb: u64,
    /// The v2/v3 name, e.g. `MIG 1g.10gb`, or empty when the driver gave none.
    pub name: String,
    /// `(start, size)` in memory slices, from GetGpuInstancePossiblePlacements_v2.
    pub placements: Vec<(u32, u32)>,
}

/// Why NVML's answers do not describe a usable GPU.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DescribeError {
    #[error("{gpu}: NVML reports no GPU instance profiles")]
    NoProfiles { gpu: String },
    #[error("{gpu}: profile {profile} (ID {id}) has no possible placements")]
    NoPlacements { gpu: String, profile: String, id: u32 },
    #[error("{gpu}: profile {profile} (ID {id}) has placements of different sizes {sizes:?}")]
    MixedPlacementSizes { gpu: String, profile: String, id: u32, sizes: Vec<u32> },
}

/// Build the model of an unknown MIG-capable GPU from NVML's answers. Every value is observed.
pub fn describe_from_nvml(query: &NvmlDescription) -> Result<GpuModel, DescribeError> {
    let gpu = query.name.trim().to_string();
    if query.profiles.is_empty() {
        return Err(DescribeError::NoProfiles { gpu });
    }
    let mut profiles = Vec::with_capacity(query.profiles.len());
    for p in &query.profiles {
        let name = match p.name.trim() {
            "" => profile_name(p.slice_count, p.memory_size_mb, query.memory_mib, p.index),
            v3 => v3.strip_prefix("MIG ").unwrap_or(v3).trim().to_string(),
        };
        let Some(&(_, size)) = p.placements.first() else {
            return Err(DescribeError::NoPlacements { gpu, profile: name, id: p.id });
        };
        if p.placements.iter().any(|&(_, s)| s != size) {
            let mut sizes: Vec<u32> = p.placements.iter().map(|&(_, s)| s).collect();
            sizes.sort_unstable();
            sizes.dedup();
            return Err(DescribeError::MixedPlacementSizes { gpu, profile: name, id: p.id, sizes });
        }
        let mut starts: Vec<u32> = p.placements.iter().map(|&(start, _)| start).collect();
        starts.sort_unstable();
        starts.dedup();
        let engines = [p.copy_engine_count, p.decoder_count, p.encoder_count, p.jpeg_count, p.ofa_count];
        profiles.push(gi(
            &name,
            p.index,
            p.id,
            p.slice_count,
            size,
            p.instance_count,
            p.memory_size_mb,
            p.multiprocessor_count,
            engines,
            &starts,
        ));
    }
    // nvidia-smi's lgip order: by compute slices, then memory, then profile ID.
    profiles.sort_by_key(|p| (p.compute_slices, p.memory_mib, p.id));
    let memory_slices = query.profiles.iter().flat_map(|p| &p.placements).map(|&(start, size)| start + size).max();
    let compute_slices = query.profiles.iter().map(|p| p.slice_count).max();
    Ok(GpuModel {
        key: model_key(&gpu),
        product_name: gpu,
        nvml_names: Vec::new(),
        pci_device_ids: vec![query.pci_device_id],
        architecture: architecture(query.cuda_compute_capability.0).to_string(),
        cuda_compute_capability: query.cuda_compute_capability,
        memory_mib: query.memory_mib,
        multiprocessors: query.multiprocessors,
        memory_slices: memory_slices.unwrap_or(0),
        compute_slices: compute_slices.unwrap_or(0),
        profiles,
        evidence: Evidence::Observed,
        note: "from NVML on this GPU".into(),
    })
}

/// One way NVML's answer for a GPU differs from the catalog's model of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Difference {
    /// The profile's name (the catalog's when it has one), or `GPU` for the slice grid.
    pub profile: String,
    pub field: &'static str,
    pub catalog: String,
    pub nvml: String,
}

/// What differs between the catalog's model of a GPU and the model built from NVML's answers:
/// the slice grid, then each profile by ID (missing on either side, or any field that shapes a
/// partition or a published attribute). Empty when NVML confirms every figure.
pub fn differences(catalog: &GpuModel, nvml: &GpuModel) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut field = |profile: &str, field: &'static str, c: String, n: String| {
        if c != n {
            out.push(Difference { profile: profile.to_string(), field, catalog: c, nvml: n });
        }
    };
    field("GPU", "memory slices", catalog.memory_slices.to_string(), nvml.memory_slices.to_string());
    field("GPU", "compute slices", catalog.compute_slices.to_string(), nvml.compute_slices.to_string());
    for c in &catalog.profiles {
        let Some(n) = nvml.profile(c.id) else {
            field(&c.name, "profile", format!("ID {}", c.id), "absent".into());
            continue;
        };
        let f = &mut field;
        f(&c.name, "name", c.name.clone(), n.name.clone());
        f(&c.name, "index", c.index.to_string(), n.index.to_string());
        f(&c.name, "compute slices", c.compute_slices.to_string(), n.compute_slices.to_string());
        f(&c.name, "memory slices", c.memory_slices.to_string(), n.memory_slices.to_string());
        f(&c.name, "memory MiB", c.memory_mib.to_string(), n.memory_mib.to_string());
        f(&c.name, "instances", c.max_instances.to_string(), n.max_instances.to_string());
        f(&c.name, "multiprocessors", c.multiprocessors.to_string(), n.multiprocessors.to_string());
        f(&c.name, "engines CE/DEC/ENC/JPG/OFA", engines(c), engines(n));
        f(&c.name, "placements", placements(c), placements(n));
    }
    for n in nvml.profiles.iter().filter(|n| catalog.profile(n.id).is_none()) {
        field(&n.name, "profile", "absent".into(), format!("ID {}", n.id));
    }
    out
}

/// Placement starts in order, with their size: NVML's order is its own.
fn placements(p: &super::profile::GiProfile) -> String {
    let mut starts = p.placements.clone();
    starts.sort_unstable();
    let starts: Vec<String> = starts.iter().map(u32::to_string).collect();
    format!("{{{}}}:{}", starts.join(","), p.memory_slices)
}

fn engines(p: &super::profile::GiProfile) -> String {
    let e = &p.engines;
    format!("{}/{}/{}/{}/{}", e.copy, e.decoders, e.encoders, e.jpeg, e.ofa)
}

/// The model key for an NVML name: lower case, runs of other characters as one `-`.
pub fn model_key(name: &str) -> String {
    let mut key = String::with_capacity(name.len());
    for c in name.trim().chars() {
        if c.is_ascii_alphanumeric() {
            key.push(c.to_ascii_lowercase());
        } else if !key.is_empty() && !key.ends_with('-') {
            key.push('-');
        }
    }
    key.trim_end_matches('-').to_string()
}

/// The architecture of a CUDA compute capability major version.
pub fn architecture(cc_major: u32) -> &'static str {
    match cc_major {
        8 => "Ampere",
        9 => "Hopper",
        10 | 12 => "Blackwell",
        _ => "Unknown",
    }
}

/// A profile name the way go-nvlib builds it when the driver gives none (docs/facts/mig-nvml.md §0): memory as
/// eighths of the GPU rounded up, times the GPU's GiB rounded up, rounded to whole GB; suffix by
/// NVML profile index.
pub fn profile_name(slices: u32, memory_size_mb: u64, total_mib: u64, index: u32) -> String {
    let total_mib = total_mib.max(1);
    let eighths = (memory_size_mb * 8).div_ceil(total_mib);
    let total_gib = total_mib.div_ceil(1024);
    // round(eighths / 8 * total_gib), halves away from zero as Go's math.Round.
    let gb = (eighths * total_gib * 2 + 8) / 16;
    let suffix = match index {
        7 | 8 => "+me",              // *_REV1
        10 | 11 | 12 | 17 => "+gfx", // *_GFX (17 = 3_SLICE_GFX, header v13)
        13 | 14 => "-me",            // *_NO_ME
        15 | 16 => "+me.all",        // *_ALL_ME
        _ => "",
    };
    format!("{slices}g.{gb}gb{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog::{self, GpuModel};

    /// What NVML would answer on the catalog's model, in NVML index order.
    fn query_of(m: &GpuModel, with_names: bool) -> NvmlDescription {
        let mut profiles: Vec<NvmlProfile> = m
            .profiles
            .iter()
            .map(|p| NvmlProfile {
                index: p.index,
                id: p.id,
                slice_count: p.compute_slices,
                instance_count: p.max_instances,
                multiprocessor_count: p.multiprocessors,
                copy_engine_count: p.engines.copy,
                decoder_count: p.engines.decoders,
                encoder_count: p.engines.encoders,
                jpeg_count: p.engines.jpeg,
                ofa_count: p.engines.ofa,
                memory_size_mb: p.memory_mib,
                name: if with_names { format!("MIG {}", p.name) } else { String::new() },
                placements: p.placements.iter().rev().map(|&s| (s, p.memory_slices)).collect(),
            })
            .collect();
        profiles.sort_by_key(|p| p.index);
        NvmlDescription {
            name: m.product_name.clone(),
            pci_device_id: m.pci_device_ids[0],
            memory_mib: m.memory_mib,
            multiprocessors: m.multiprocessors,
            cuda_compute_capability: m.cuda_compute_capability,
            profiles,
        }
    }

    fn assert_same_structure(got: &GpuModel, want: &GpuModel) {
        let ids = |m: &GpuModel| m.profiles.iter().map(|p| p.id).collect::<Vec<_>>();
        let names = |m: &GpuModel| m.profiles.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        let placements = |m: &GpuModel| m.profiles.iter().map(|p| p.placements_text()).collect::<Vec<_>>();
        assert_eq!(ids(got), ids(want));
        assert_eq!(names(got), names(want));
        assert_eq!(placements(got), placements(want));
        assert_eq!((got.memory_slices, got.compute_slices), (want.memory_slices, want.compute_slices));
        assert_eq!(got.architecture, want.architecture);
        for (g, w) in got.profiles.iter().zip(&want.profiles) {
            assert_eq!(
                (g.index, g.max_instances, g.memory_mib, g.multiprocessors),
                (w.index, w.max_instances, w.memory_mib, w.multiprocessors)
            );
            assert_eq!((g.engines, g.media, g.gfx), (w.engines, w.media, w.gfx));
            assert_eq!(g.ci_profiles.len(), w.ci_profiles.len());
            assert_eq!(g.evidence, Evidence::Observed);
        }
    }

    #[test]
    fn h100_from_nvml_matches_the_catalog() {
        let h100 = catalog::model("h100-80gb").unwrap();
        for with_names in [false, true] {
            let got = describe_from_nvml(&query_of(h100, with_names)).unwrap();
            assert_same_structure(&got, h100);
            assert_eq!(got.key, "nvidia-h100-80gb-hbm3");
            assert_eq!(got.pci_device_ids, [0x2330]);
            assert_eq!(got.evidence, Evidence::Observed);
        }
    }

    #[test]
    fn nvml_confirming_the_catalog_differs_in_nothing() {
        for m in catalog::models() {
            let got = describe_from_nvml(&query_of(m, true)).unwrap();
            assert_eq!(differences(m, &got), [], "{}", m.key);
        }
    }

    #[test]
    fn each_figure_nvml_answers_otherwise_is_one_difference() {
        let h100 = catalog::model("h100-80gb").unwrap();
        let mut q = query_of(h100, true);
        let small = q.profiles.iter_mut().find(|p| p.name == "MIG 1g.10gb").unwrap();
        small.memory_size_mb += 128;
        small.ofa_count = 1;
        small.placements.pop();
        let gone = q.profiles.iter().position(|p| p.name == "MIG 7g.80gb").unwrap();
        q.profiles.remove(gone);
        let got = differences(h100, &describe_from_nvml(&q).unwrap());
        let text: Vec<String> =
            got.iter().map(|d| format!("{} {}: {} / {}", d.profile, d.field, d.catalog, d.nvml)).collect();
        assert_eq!(
            text,
            [
                "GPU compute slices: 7 / 4",
                "1g.10gb memory MiB: 9856 / 9984",
                "1g.10gb engines CE/DEC/ENC/JPG/OFA: 1/1/0/1/0 / 1/1/0/1/1",
                "1g.10gb placements: {0,1,2,3,4,5,6}:1 / {1,2,3,4,5,6}:1",
                "7g.80gb profile: ID 0 / absent",
            ]
        );
    }

    #[test]
    fn every_catalog_model_round_trips() {
        // Also checks each model's whole-GPU memory against go-nvlib's naming of its profiles.
        for m in catalog::models() {
            for with_names in [false, true] {
                let got = describe_from_nvml(&query_of(m, with_names)).unwrap();
                assert_same_structure(&got, m);
            }
        }
    }

    #[test]
    fn go_nvlib_names() {
        assert_eq!(profile_name(1, 16384, 143771, 0), "1g.18gb"); // docs/facts/mig-nvml.md §0: H200 16.00 GiB
        assert_eq!(profile_name(1, 4864, 40960, 7), "1g.5gb+me");
        assert_eq!(profile_name(2, 47616, 97887, 16), "2g.48gb+me.all");
        assert_eq!(profile_name(1, 23680, 97887, 13), "1g.24gb-me");
        assert_eq!(profile_name(4, 97408, 97887, 12), "4g.96gb+gfx");
        assert_eq!(profile_name(1, 22144, 95830, 9), "1g.24gb"); // 23.5 rounds up
    }

    #[test]
    fn keys_and_architectures() {
        assert_eq!(model_key("NVIDIA A100-SXM4-40GB"), "nvidia-a100-sxm4-40gb");
        assert_eq!(model_key(" NVIDIA RTX PRO 6000 Blackwell (Max-Q) "), "nvidia-rtx-pro-6000-blackwell-max-q");
        assert_eq!(architecture(8), "Ampere");
        assert_eq!(architecture(9), "Hopper");
        assert_eq!(architecture(10), "Blackwell");
        assert_eq!(architecture(12), "Blackwell");
        assert_eq!(architecture(7), "Unknown");
    }

    #[test]
    fn bad_answers_are_refused() {
        let h100 = catalog::model("h100-80gb").unwrap();
        let mut q = query_of(h100, false);
        q.profiles.clear();
        assert!(matches!(describe_from_nvml(&q), Err(DescribeError::NoProfiles { .. })));

        let mut q = query_of(h100, false);
        q.profiles[0].placements.clear();
        let err = describe_from_nvml(&q).unwrap_err();
        assert!(matches!(&err, DescribeError::NoPlacements { id: 19, profile, .. } if profile == "1g.10gb"), "{err}");

        let mut q = query_of(h100, true);
        let three_g = q.profiles.iter_mut().find(|p| p.id == 9).unwrap();
        three_g.placements = vec![(0, 4), (4, 3)];
        let err = describe_from_nvml(&q).unwrap_err();
        assert_eq!(
            err,
            DescribeError::MixedPlacementSizes {
                gpu: h100.product_name.clone(),
                profile: "3g.40gb".into(),
                id: 9,
                sizes: vec![3, 4]
            }
        );
    }
}
