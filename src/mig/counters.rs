//! KEP-4815 shared counters: one counter set per GPU that keeps MIG partitions disjoint.
//!
//! Counter set `gpu-<minor>-counters` holds `multiprocessors`, `copy-engines`, `decoders`,
//! `encoders`, `jpeg-engines`, `ofa-engines`, `memory` (MiB) and `memory-slice-<k>` (value 1) per
//! memory slice. A MIG device consumes its profile's amounts plus the memory slices it covers; the
//! whole GPU consumes everything. The invariant, proven per model in [`super::proof`]: a set of
//! devices fits the counters if and only if NVML could create all of them at once.

use super::catalog::{GiProfile, GpuModel};
use std::collections::BTreeMap;

pub const MULTIPROCESSORS: &str = "multiprocessors";
pub const COPY_ENGINES: &str = "copy-engines";
pub const DECODERS: &str = "decoders";
pub const ENCODERS: &str = "encoders";
pub const JPEG_ENGINES: &str = "jpeg-engines";
pub const OFA_ENGINES: &str = "ofa-engines";
/// In MiB.
pub const MEMORY: &str = "memory";

/// `memory-slice-<k>`.
pub fn memory_slice(k: u32) -> String {
    format!("memory-slice-{k}")
}

/// The counter set of the GPU with this minor.
pub fn counter_set_name(minor: u32) -> String {
    format!("gpu-{minor}-counters")
}

/// Counter name → amount. Units: MiB for `memory`, plain counts otherwise.
pub type Counters = BTreeMap<String, u64>;

/// Amounts of one GI profile, without its memory slices.
fn profile_amounts(p: &GiProfile) -> [(&'static str, u64); 7] {
    [
        (MULTIPROCESSORS, p.multiprocessors.into()),
        (COPY_ENGINES, p.engines.copy.into()),
        (DECODERS, p.engines.decoders.into()),
        (ENCODERS, p.engines.encoders.into()),
        (JPEG_ENGINES, p.engines.jpeg.into()),
        (OFA_ENGINES, p.engines.ofa.into()),
        (MEMORY, p.memory_mib),
    ]
}

/// What one GPU offers: for each resource, the most any profile spanning the whole placement
/// grid holds (7g; 4g on A30 and RTX PRO), and one of each memory slice.
pub fn capacity(model: &GpuModel) -> Counters {
    let mut c = Counters::new();
    for p in model.profiles.iter().filter(|p| p.memory_slices == model.memory_slices) {
        for (name, amount) in profile_amounts(p) {
            let e = c.entry(name.to_string()).or_default();
            *e = (*e).max(amount);
        }
    }
    for k in 0..model.memory_slices {
        c.insert(memory_slice(k), 1);
    }
    c
}

/// What a MIG partition at `start` consumes; zero amounts are left out.
pub fn mig_consumption(profile: &GiProfile, start: u32) -> Counters {
    let mut c: Counters =
        profile_amounts(profile).into_iter().filter(|(_, v)| *v > 0).map(|(k, v)| (k.to_string(), v)).collect();
    for k in start..start + profile.memory_slices {
        c.insert(memory_slice(k), 1);
    }
    c
}

/// What the whole GPU consumes: everything, so it fits only alone.
pub fn full_gpu_consumption(model: &GpuModel) -> Counters {
    capacity(model).into_iter().filter(|(_, v)| *v > 0).collect()
}

/// Whether these consumptions together fit in `capacity` (how the scheduler checks counters).
pub fn fits<'a>(capacity: &Counters, consumptions: impl IntoIterator<Item = &'a Counters>) -> bool {
    let mut used = Counters::new();
    for c in consumptions {
        for (name, amount) in c {
            let Some(&cap) = capacity.get(name) else { return false };
            let u = used.entry(name.clone()).or_default();
            *u += amount;
            if *u > cap {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog::model;

    #[test]
    fn h100_counters_match_the_7g_profile_and_the_grid() {
        let m = model("h100-80gb").unwrap();
        let c = capacity(m);
        assert_eq!(c[MULTIPROCESSORS], 132);
        assert_eq!(c[COPY_ENGINES], 8);
        assert_eq!(c[MEMORY], 81152);
        assert_eq!(c.len(), 7 + 8);
        assert!(c.keys().all(|k| crate::names::is_dns_label(k)));
        let three_g = m.profile(9).unwrap();
        let used = mig_consumption(three_g, 4);
        assert_eq!(used[&memory_slice(4)], 1);
        assert_eq!(used[&memory_slice(7)], 1);
        assert!(!used.contains_key(&memory_slice(3)));
        assert!(!used.contains_key(ENCODERS), "zero amounts are left out");
        assert!(fits(&c, [&used, &mig_consumption(three_g, 0)]));
        assert!(!fits(&c, [&used, &full_gpu_consumption(m)]));
    }
}
