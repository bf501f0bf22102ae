//! KEP-4815 shared counters: one counter set per GPU that keeps MIG partitions disjoint.
//!
//! What a GPU holds is `multiprocessors`, `copy-engines`, `decoders`, `encoders`,
//! `jpeg-engines`, `ofa-engines`, `memory` (MiB) and `memory-slice-<k>` (value 1) per memory
//! slice ([`resources`]). Its published counter set `gpu-<minor>-counters` holds only what can
//! ever refuse a set of the partitions it publishes ([`CounterSet`]): every scheduler pass checks
//! each counter of each candidate device, so a counter that can never bind is pure cost. The
//! invariant, proven per model in [`super::proof`]: a set of devices fits the counters if and
//! only if NVML could create all of them at once.

use super::catalog::{GiProfile, GpuModel};
use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex, PoisonError};

/// Counter sets remembered by [`CounterSet::for_partitions`]; a node has a few models and
/// allowlists, so this is never reached in practice.
const MEMO_ENTRIES: usize = 64;

pub const MULTIPROCESSORS: &str = "multiprocessors";
pub const COPY_ENGINES: &str = "copy-engines";
pub const DECODERS: &str = "decoders";
pub const ENCODERS: &str = "encoders";
pub const JPEG_ENGINES: &str = "jpeg-engines";
pub const OFA_ENGINES: &str = "ofa-engines";
/// In MiB.
pub const MEMORY: &str = "memory";

/// The resources [`CounterSet`] tries to leave out, in that order.
const RESOURCES_BY_DROP_ORDER: [&str; 7] =
    [MEMORY, MULTIPROCESSORS, COPY_ENGINES, DECODERS, ENCODERS, JPEG_ENGINES, OFA_ENGINES];

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

/// What one GPU holds: for each resource, the most any profile spanning the whole placement grid
/// holds (7g; 4g on A30 and RTX PRO), and one of each memory slice.
pub fn resources(model: &GpuModel) -> Counters {
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

/// What a partition at `start` draws from [`resources`]; zero amounts are left out.
fn partition_resources(profile: &GiProfile, start: u32) -> Counters {
    let mut c: Counters =
        profile_amounts(profile).into_iter().filter(|(_, v)| *v > 0).map(|(k, v)| (k.to_string(), v)).collect();
    for k in start..start + profile.memory_slices {
        c.insert(memory_slice(k), 1);
    }
    c
}

/// The counters one GPU publishes for a given set of partitions, and what each device consumes
/// of them.
///
/// Kept are:
/// - the memory slices that tell partitions apart: slice k is left out when every published
///   partition that covers k also covers another kept slice, so any two that meet on k already
///   meet there;
/// - of the resources (SMs, engines, memory), those that some set of published partitions with
///   disjoint memory slices could overdraw (a weighted interval schedule over the slices; NVML's
///   other rules only shrink those sets, so a resource no such set overdraws never binds), and of
///   those only the ones [`super::proof`] shows are needed: leaving one out must make the counters
///   admit a set NVML refuses. On an H100 this keeps the OFA engine, which two `+me` partitions
///   would share, and nothing else.
///
/// So the set admits exactly what NVML admits, and dropping any counter of it would not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSet {
    capacity: Counters,
}

impl CounterSet {
    /// For every partition of the model.
    pub fn for_model(model: &GpuModel) -> Self {
        let all: Vec<(&GiProfile, u32)> =
            model.profiles.iter().flat_map(|p| p.placements.iter().map(move |&s| (p, s))).collect();
        Self::for_partitions(model, &all)
    }

    /// For exactly these partitions (profile, placement start).
    pub fn for_partitions(model: &GpuModel, partitions: &[(&GiProfile, u32)]) -> Self {
        // The proof below costs up to tens of milliseconds per GPU, and a node asks again for the
        // same few combinations after every prepare: remember them.
        static MEMO: LazyLock<Mutex<HashMap<String, Counters>>> = LazyLock::new(Mutex::default);
        let placed: Vec<(u32, u32)> = partitions.iter().map(|(p, s)| (p.id, *s)).collect();
        let key = format!("{model:?}{placed:?}");
        if let Some(capacity) = MEMO.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return Self { capacity: capacity.clone() };
        }
        let set = Self::derive(model, partitions);
        let mut memo = MEMO.lock().unwrap_or_else(PoisonError::into_inner);
        if memo.len() >= MEMO_ENTRIES {
            memo.clear();
        }
        memo.insert(key, set.capacity.clone());
        set
    }

    fn derive(model: &GpuModel, partitions: &[(&GiProfile, u32)]) -> Self {
        let full = resources(model);
        let covers = |k: u32| -> Vec<usize> {
            (0..partitions.len())
                .filter(|&i| {
                    let (p, s) = partitions[i];
                    (s..s + p.memory_slices).contains(&k)
                })
                .collect()
        };
        let mut slices: Vec<u32> = (0..model.memory_slices).collect();
        for k in 0..model.memory_slices {
            let mine = covers(k);
            let implied = slices.iter().any(|&j| j != k && mine.iter().all(|i| covers(j).contains(i)));
            if implied {
                slices.retain(|&j| j != k);
            }
        }
        let mut capacity: Counters = slices.iter().map(|&k| (memory_slice(k), 1)).collect();
        for (name, cap) in full.iter().filter(|(n, _)| !n.starts_with("memory-slice-")) {
            let amount = |p: &GiProfile| profile_amounts(p).iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v);
            if most_disjoint(model.memory_slices, partitions, amount) > *cap {
                capacity.insert(name.clone(), *cap);
            }
        }
        // Engines of `+me` profiles can each stand for the same rule (one media partition per
        // GPU); keep the first the proof cannot do without, trying the OFA engine last.
        for name in RESOURCES_BY_DROP_ORDER {
            if capacity.contains_key(name) {
                let without = Self {
                    capacity: capacity.iter().filter(|(n, _)| *n != name).map(|(n, v)| (n.clone(), *v)).collect(),
                };
                if super::proof::prove_with(model, partitions, &without).is_ok() {
                    capacity = without.capacity;
                }
            }
        }
        Self { capacity }
    }

    /// Every resource and every memory slice: the set before it was made minimal, which the
    /// proof's own tests hold against it.
    pub fn every_resource(model: &GpuModel) -> Self {
        Self { capacity: resources(model) }
    }

    /// Only the counters `keep` names: for tests that show each kept counter is needed.
    pub fn restricted(&self, keep: impl Fn(&str) -> bool) -> Self {
        Self { capacity: self.capacity.iter().filter(|(n, _)| keep(n)).map(|(n, v)| (n.clone(), *v)).collect() }
    }

    /// The counters and their amounts on the GPU.
    pub fn capacity(&self) -> &Counters {
        &self.capacity
    }

    /// What a MIG partition at `start` consumes.
    pub fn mig(&self, profile: &GiProfile, start: u32) -> Counters {
        partition_resources(profile, start).into_iter().filter(|(n, _)| self.capacity.contains_key(n)).collect()
    }

    /// What the whole GPU consumes: everything, so it fits only alone; zero amounts are left out.
    pub fn whole_gpu(&self) -> Counters {
        self.capacity.iter().filter(|(_, v)| **v > 0).map(|(n, v)| (n.clone(), *v)).collect()
    }
}

/// The largest total of `amount` over sets of partitions whose memory slices do not overlap.
fn most_disjoint(slices: u32, partitions: &[(&GiProfile, u32)], amount: impl Fn(&GiProfile) -> u64) -> u64 {
    // best[e]: the largest total using slices below e.
    let mut best = vec![0u64; slices as usize + 1];
    for e in 1..=slices {
        let mut b = best[e as usize - 1];
        for &(p, s) in partitions.iter().filter(|(p, s)| s + p.memory_slices == e) {
            b = b.max(best[s as usize] + amount(p));
        }
        best[e as usize] = b;
    }
    best[slices as usize]
}

/// Whether these consumptions together fit in `capacity` (how the scheduler checks counters).
pub fn fits<'a>(capacity: &Counters, consumptions: impl IntoIterator<Item = &'a Counters>) -> bool {
    let mut used: BTreeMap<&str, u128> = BTreeMap::new();
    for c in consumptions {
        for (name, &amount) in c {
            let u = used.entry(name).or_default();
            if !super::fit::counter_fits(capacity.get(name).map(|&c| c.into()), *u, Some(amount.into())) {
                return false;
            }
            *u += u128::from(amount);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog::model;

    #[test]
    fn h100_keeps_the_slices_that_tell_partitions_apart_and_the_ofa_engine() {
        let m = model("h100-80gb").unwrap();
        let full = resources(m);
        assert_eq!(full[MULTIPROCESSORS], 132);
        assert_eq!(full[COPY_ENGINES], 8);
        assert_eq!(full[MEMORY], 81152);
        assert_eq!(full.len(), 7 + 8);
        let set = CounterSet::for_model(m);
        let names: Vec<&str> = set.capacity().keys().map(String::as_str).collect();
        // Slice 7 is only ever taken with slice 6 (no 1g.10gb starts at 7); only the OFA engine can
        // be overdrawn by partitions on disjoint slices (two 1g.10gb+me).
        assert_eq!(
            names,
            [
                "memory-slice-0",
                "memory-slice-1",
                "memory-slice-2",
                "memory-slice-3",
                "memory-slice-4",
                "memory-slice-5",
                "memory-slice-6",
                OFA_ENGINES
            ]
        );
        assert!(set.capacity().keys().all(|k| crate::names::is_dns_label(k)));
        let three_g = m.profile(9).unwrap();
        let used = set.mig(three_g, 4);
        assert_eq!(used.keys().collect::<Vec<_>>(), ["memory-slice-4", "memory-slice-5", "memory-slice-6"]);
        assert!(fits(set.capacity(), [&used, &set.mig(three_g, 0)]));
        assert!(!fits(set.capacity(), [&used, &set.whole_gpu()]));
        let me = m.profiles.iter().find(|p| p.name == "1g.10gb+me").unwrap();
        assert!(!fits(set.capacity(), [&set.mig(me, 0), &set.mig(me, 3)]), "one OFA engine per GPU");
    }

    #[test]
    fn remembered_sets_follow_the_model_not_its_name() {
        let m = model("h100-80gb").unwrap();
        assert!(CounterSet::for_model(m).capacity().contains_key(OFA_ENGINES));
        let mut plain = m.clone();
        plain.profiles.retain(|p| !p.name.contains("+me"));
        assert_eq!(plain.key, m.key);
        assert!(!CounterSet::for_model(&plain).capacity().contains_key(OFA_ENGINES), "no +me, no OFA counter");
        assert!(CounterSet::for_model(m).capacity().contains_key(OFA_ENGINES));
    }

    #[test]
    fn fewer_partitions_need_fewer_counters() {
        let m = model("h100-80gb").unwrap();
        let only = |names: &[&str]| -> Vec<(&GiProfile, u32)> {
            m.profiles
                .iter()
                .filter(|p| names.contains(&p.name.as_str()))
                .flat_map(|p| p.placements.iter().map(move |&s| (p, s)))
                .collect()
        };
        let set = CounterSet::for_partitions(m, &only(&["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]));
        assert!(set.capacity().keys().all(|k| k.starts_with("memory-slice-")), "{:?}", set.capacity());
        let set = CounterSet::for_partitions(m, &only(&["7g.80gb"]));
        assert_eq!(set.capacity().len(), 1, "one partition needs one slice: {:?}", set.capacity());
    }

    #[test]
    fn the_interval_schedule_finds_the_largest_disjoint_total() {
        let m = model("h100-80gb").unwrap();
        let all: Vec<(&GiProfile, u32)> =
            m.profiles.iter().flat_map(|p| p.placements.iter().map(move |&s| (p, s))).collect();
        // Seven 1g partitions on slices 0..7: 7 of each engine they hold, one SM block each.
        let one_g = m.profiles.iter().find(|p| p.name == "1g.10gb").unwrap();
        assert_eq!(most_disjoint(8, &all, |p| u64::from(p.id == one_g.id)), 7);
        assert_eq!(most_disjoint(8, &all, |_| 1), 7, "most partitions at once");
        assert!(most_disjoint(8, &all, |p| p.multiprocessors.into()) <= resources(m)[MULTIPROCESSORS]);
    }
}
