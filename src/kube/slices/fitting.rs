//! Publishing only what can still be allocated: beside the devices claims hold, a device whose
//! counters no longer fit in what its counter set has left cannot be allocated, and the scheduler
//! would evaluate its selectors for every pod anyway.
//!
//! Counter sets stay as they are, so every device still published consumes exactly what it did:
//! only devices that cannot be allocated leave, never a held one (kubernetes#140802), and a
//! subset of an exact set of partitions is exact.

use crate::mig::devices::Quantity;
use k8s_openapi::api::resource::v1::{DeviceCounterConsumption, ResourceSlice};
use std::collections::{BTreeMap, BTreeSet};

/// Counter set → counter → amount, in base units.
type Amounts = BTreeMap<String, BTreeMap<String, u128>>;

fn amount(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<u128> {
    q.0.parse::<Quantity>().ok().map(Quantity::base)
}

fn add(into: &mut Amounts, consumes: &[DeviceCounterConsumption]) {
    for c in consumes {
        let set = into.entry(c.counter_set.clone()).or_default();
        for (name, counter) in &c.counters {
            *set.entry(name.clone()).or_default() += amount(&counter.value).unwrap_or(0);
        }
    }
}

/// Leave out of `slices` every device that cannot be allocated beside the devices in `held`:
/// one of its counters does not fit in what its set has left. Held devices, devices that consume
/// no counters and devices of counter sets these slices do not carry stay. Returns how many left.
pub fn keep_fitting(slices: &mut [ResourceSlice], held: &BTreeSet<String>) -> usize {
    let mut capacity = Amounts::new();
    for set in slices.iter().flat_map(|s| s.spec.shared_counters.iter().flatten()) {
        let counters = set.counters.iter().map(|(n, c)| (n.clone(), amount(&c.value).unwrap_or(0)));
        capacity.insert(set.name.clone(), counters.collect());
    }
    let mut used = Amounts::new();
    for d in slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).filter(|d| held.contains(&d.name)) {
        add(&mut used, d.consumes_counters.as_deref().unwrap_or_default());
    }
    let fits = |consumes: &[DeviceCounterConsumption]| {
        consumes.iter().all(|c| {
            let Some(cap) = capacity.get(&c.counter_set) else { return true };
            let taken = used.get(&c.counter_set);
            c.counters.iter().all(|(name, counter)| {
                let have = cap.get(name).copied().unwrap_or(0);
                let taken = taken.and_then(|t| t.get(name)).copied().unwrap_or(0);
                taken + amount(&counter.value).unwrap_or(u128::MAX) <= have
            })
        })
    };
    let mut left = 0;
    for devices in slices.iter_mut().filter_map(|s| s.spec.devices.as_mut()) {
        let before = devices.len();
        devices.retain(|d| {
            held.contains(&d.name) || d.consumes_counters.as_deref().is_none_or(|c| c.is_empty() || fits(c))
        });
        left += before - devices.len();
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::slices::tests::node;
    use crate::kube::slices::{Layout, build};
    use crate::mig::devices::GpuMode;
    use crate::mig::naming::DeviceName;
    use crate::mig::rules::{self, Placed};

    fn names(slices: &[ResourceSlice]) -> BTreeSet<String> {
        slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.clone()).collect()
    }

    #[test]
    fn what_a_held_device_blocks_leaves_and_the_rest_stays_unchanged() {
        let model = crate::mig::catalog::model("h100-80gb").unwrap();
        let gpus = node(&[("h100-80gb", 2, GpuMode::Dynamic)]);
        let minor = gpus[0].minor;
        for layout in [Layout::Split, Layout::Combined] {
            let full = build("mig.slinky.slurm.net", "node-a", None, 1, layout, &gpus).unwrap();
            let all = names(&full);
            let held_3g = DeviceName::mig(minor, "3g.40gb", 9, 0).to_string();
            assert!(all.contains(&held_3g));
            let held = BTreeSet::from([held_3g.clone()]);
            let mut kept = full.clone();
            let left = keep_fitting(&mut kept, &held);
            let now = names(&kept);
            assert_eq!(left, all.len() - now.len());
            assert!(now.contains(&held_3g), "{layout:?}");
            // The oracle: NVML's placement rules beside the held 3g.40gb at 0.
            let beside = [Placed { profile_id: 9, start: 0 }];
            for name in &all {
                let stays = match DeviceName::parse(name).unwrap() {
                    _ if *name == held_3g => true,
                    DeviceName::Mig { parent_minor, profile_id, start, .. } if parent_minor == minor => {
                        rules::admits(model, &beside, Placed { profile_id, start }).is_ok()
                    }
                    DeviceName::Gpu { minor: m } if m == minor => false,
                    _ => true,
                };
                assert_eq!(now.contains(name), stays, "{layout:?} {name}");
            }
            assert!(left >= 10, "{layout:?}: {left}");
            // Every device left is byte for byte what it was, and the counter sets too.
            let devices = |s: &[ResourceSlice]| -> BTreeMap<String, String> {
                s.iter()
                    .flat_map(|s| s.spec.devices.iter().flatten())
                    .map(|d| (d.name.clone(), serde_json::to_string(d).unwrap()))
                    .collect()
            };
            let (before, after) = (devices(&full), devices(&kept));
            assert!(after.iter().all(|(n, d)| before[n] == *d));
            let sets = |s: &[ResourceSlice]| s.iter().map(|s| s.spec.shared_counters.clone()).collect::<Vec<_>>();
            assert_eq!(sets(&kept), sets(&full));
            // Nothing held: nothing leaves.
            let mut same = full.clone();
            assert_eq!(keep_fitting(&mut same, &BTreeSet::new()), 0);
        }
    }
}
