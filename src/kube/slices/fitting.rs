//! Publishing only what can still be allocated: beside the devices claims hold, a device whose
//! counters no longer fit in what its counter set has left cannot be allocated, and the scheduler
//! would evaluate its selectors for every pod anyway.
//!
//! Counter sets stay as they are, so every device still published consumes exactly what it did:
//! only devices that cannot be allocated leave, never a held one (kubernetes#140802), and a
//! subset of an exact set of partitions is exact.

use crate::mig::devices::Quantity;
use crate::mig::fit::{Consumer, Pool};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use std::collections::{BTreeMap, BTreeSet};

fn amount(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<u128> {
    q.0.parse::<Quantity>().ok().map(Quantity::base)
}

/// A published device, as [`crate::mig::fit`] reads what it consumes.
struct Published<'a>(&'a Device);

impl Consumer for Published<'_> {
    fn consumes(&self) -> Vec<(&str, &str, Option<u128>)> {
        let sets = self.0.consumes_counters.iter().flatten();
        sets.flat_map(|c| c.counters.iter().map(move |(n, v)| (c.counter_set.as_str(), n.as_str(), amount(&v.value))))
            .collect()
    }
}

/// Leave out of `slices` every device that cannot be allocated beside the devices in `held`: one
/// of its counters does not fit in what its set has left ([`Pool::fits`]; a set these slices do
/// not carry has nothing left). Held devices and devices that consume no counters stay. Returns
/// how many left.
pub fn keep_fitting(slices: &mut [ResourceSlice], held: &BTreeSet<String>) -> usize {
    let mut capacity = BTreeMap::new();
    for set in slices.iter().flat_map(|s| s.spec.shared_counters.iter().flatten()) {
        let counters = set.counters.iter().map(|(n, c)| (n.clone(), amount(&c.value)));
        capacity.insert(set.name.clone(), counters.collect());
    }
    let mut pool = Pool::new(capacity);
    for d in slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).filter(|d| held.contains(&d.name)) {
        pool.take(&Published(d));
    }
    let mut left = 0;
    for devices in slices.iter_mut().filter_map(|s| s.spec.devices.as_mut()) {
        let before = devices.len();
        devices.retain(|d| held.contains(&d.name) || pool.fits(&Published(d)));
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

    /// What the API server never lets through is decided by the one rule: a device of a counter
    /// set no slice carries, or with an amount that cannot be read, cannot be allocated and
    /// leaves; a held one stays whatever it says.
    #[test]
    fn a_missing_counter_set_or_an_unreadable_amount_fits_nowhere() {
        let gpus = node(&[("h100-80gb", 1, GpuMode::Dynamic)]);
        let full = build("mig.slinky.slurm.net", "node-a", None, 1, Layout::Split, &gpus).unwrap();
        let one_g = DeviceName::mig(gpus[0].minor, "1g.10gb", 19, 0).to_string();
        let (mut orphan, mut unreadable, mut held) = (full.clone(), full.clone(), full.clone());
        for s in orphan.iter_mut().chain(held.iter_mut()) {
            s.spec.shared_counters = None;
        }
        for d in unreadable.iter_mut().flat_map(|s| s.spec.devices.iter_mut().flatten()).filter(|d| d.name == one_g) {
            for c in d.consumes_counters.iter_mut().flatten() {
                for v in c.counters.values_mut() {
                    v.value.0 = "lots".into();
                }
            }
        }
        assert!(keep_fitting(&mut orphan, &BTreeSet::new()) > 0);
        assert!(names(&orphan).iter().all(|n| !n.contains("-mig-")), "{:?}", names(&orphan));
        assert!(keep_fitting(&mut unreadable, &BTreeSet::new()) == 1 && !names(&unreadable).contains(&one_g));
        keep_fitting(&mut held, &BTreeSet::from([one_g.clone()]));
        assert!(names(&held).contains(&one_g));
    }
}
