//! Best fit (`--device-order best-fit`): the scheduler takes the first device that fits, so
//! listing first, in each slice, the placements that cost their GPU the least room steers each
//! request to the best fit without scoring.
//!
//! A pure reorder of MIG partitions within their slice: the same devices with the same counters,
//! so re-ranking after an allocation changes no allocated device (kubernetes#140802). The rank
//! is the packing model's own ([`policy::best_fit_rank`]), so the model predicts what the
//! scheduler does with these slices.

use crate::mig::catalog::GpuModel;
use crate::mig::naming::DeviceName;
use crate::mig::rules::Placed;
use crate::packing::allocator::{Dev, Node};
use crate::packing::policy;
use k8s_openapi::api::resource::v1::ResourceSlice;
use std::collections::{BTreeMap, BTreeSet};

/// Reorder each slice's MIG partitions of the GPUs in `models` (minor → model: the GPUs whose
/// partitions are made on demand) by best fit beside the partitions `held` names; ties go by the
/// GPU's place in the slice, then by start. Whole GPUs, pre-created instances and every other
/// device keep their positions.
pub fn rank_best_fit(slices: &mut [ResourceSlice], models: &BTreeMap<u32, &GpuModel>, held: &BTreeSet<String>) {
    // One node per GPU: a rank reads only its own GPU.
    let mut gpus: BTreeMap<u32, Node> = models.iter().map(|(&minor, &model)| (minor, Node::new(model, 1, 1))).collect();
    for name in held {
        if let Ok(DeviceName::Mig { parent_minor, profile_id, start, .. }) = DeviceName::parse(name)
            && let Some(node) = gpus.get_mut(&parent_minor)
        {
            let d = Dev { gpu: 0, placed: Placed { profile_id, start } };
            // A held placement that does not fit beside the others is a claim the API server
            // already let overlap; the rank ignores it rather than fail a publication.
            if node.fits(d) {
                node.allocate(d);
            }
        }
    }
    for devices in slices.iter_mut().filter_map(|s| s.spec.devices.as_mut()) {
        let mut order: Vec<u32> = Vec::new();
        let mut ranked = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            let Ok(DeviceName::Mig { parent_minor, profile_id, start, .. }) = DeviceName::parse(&d.name) else {
                continue;
            };
            let Some(node) = gpus.get(&parent_minor) else { continue };
            if node.model().profile(profile_id).is_none_or(|p| !p.placements.contains(&start)) {
                continue;
            }
            let place = order.iter().position(|&m| m == parent_minor).unwrap_or_else(|| {
                order.push(parent_minor);
                order.len() - 1
            });
            let dev = Dev { gpu: 0, placed: Placed { profile_id, start } };
            ranked.push((i, (policy::best_fit_rank(node, dev), place, start)));
        }
        let slots: Vec<usize> = ranked.iter().map(|(i, _)| *i).collect();
        ranked.sort_by_key(|(_, key)| *key);
        let moved: Vec<_> = ranked.iter().map(|(i, _)| devices[*i].clone()).collect();
        for (slot, device) in slots.into_iter().zip(moved) {
            devices[slot] = device;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::slices::tests::node;
    use crate::kube::slices::{Layout, build, keep_fitting};
    use crate::mig::devices::GpuMode;
    use crate::packing::policy::tests::random_nodes;
    use crate::packing::policy::{Policy, publish};

    /// The publisher's order of each profile, in every state of a random walk of allocations and
    /// releases, is the packing model's best fit: the model's prediction is what is published.
    #[test]
    fn each_profile_is_published_in_the_models_best_fit_order() {
        let model = crate::mig::catalog::model("h100-80gb").unwrap();
        let gpus = node(&[("h100-80gb", 4, GpuMode::Dynamic)]);
        let minors: Vec<u32> = gpus.iter().map(|g| g.minor).collect();
        let models: BTreeMap<u32, &GpuModel> = minors.iter().map(|&m| (m, model)).collect();
        let full = build("mig.slinky.slurm.net", "node-a", None, 1, Layout::Split, &gpus).unwrap();
        let per_slice: Vec<Vec<u32>> = full
            .iter()
            .filter_map(|s| s.spec.devices.as_ref())
            .map(|ds| {
                let mut m: Vec<u32> = ds
                    .iter()
                    .filter_map(|d| match DeviceName::parse(&d.name) {
                        Ok(DeviceName::Mig { parent_minor, .. }) => Some(parent_minor),
                        _ => None,
                    })
                    .collect();
                m.dedup();
                m
            })
            .filter(|m| !m.is_empty())
            .collect();
        assert_eq!(per_slice.concat(), minors, "GPUs in order, each in one slice");
        assert!(per_slice.iter().all(|g| g.len() == 2), "two H100s per slice, as the model's node has");
        let (mut checked, mut moved) = (0, 0);
        for sim in random_nodes(5) {
            let name = |d: &Dev| {
                let p = model.profile(d.placed.profile_id).unwrap();
                DeviceName::mig(minors[d.gpu], &p.name, p.id, d.placed.start).to_string()
            };
            let held: BTreeSet<String> = sim.all_allocated().map(|d| name(&d)).collect();
            for fitting in [false, true] {
                let mut ranked = full.clone();
                if fitting {
                    keep_fitting(&mut ranked, &held);
                }
                let before = ranked.clone();
                rank_best_fit(&mut ranked, &models, &held);
                moved += usize::from(ranked != before);
                for p in &model.profiles {
                    let want: Vec<String> = publish(&sim, Policy::BestFit, p.id)
                        .iter()
                        .flatten()
                        .filter(|d| !fitting || sim.fits(**d) || sim.is_allocated(**d))
                        .map(name)
                        .collect();
                    let of_profile = |n: &String| {
                        matches!(
                            DeviceName::parse(n),
                            Ok(DeviceName::Mig { profile_id, .. }) if profile_id == p.id
                        )
                    };
                    let got: Vec<String> = ranked
                        .iter()
                        .flat_map(|s| s.spec.devices.iter().flatten())
                        .map(|d| d.name.clone())
                        .filter(of_profile)
                        .collect();
                    assert_eq!(got, want, "{} beside {held:?}", p.name);
                    checked += 1;
                }
                // A reorder: the same devices, byte for byte, and the same counter sets.
                let bytes = |s: &[ResourceSlice]| {
                    let mut v: Vec<String> = s
                        .iter()
                        .flat_map(|s| s.spec.devices.iter().flatten())
                        .map(|d| serde_json::to_string(d).unwrap())
                        .collect();
                    v.sort();
                    (v, s.iter().map(|s| s.spec.shared_counters.clone()).collect::<Vec<_>>())
                };
                assert_eq!(bytes(&ranked), bytes(&before));
            }
        }
        assert!(checked > 1000 && moved > 100, "{checked} orders checked, {moved} publications re-ranked");
    }

    #[test]
    fn a_small_partition_goes_to_the_fuller_gpu_beside_what_it_holds() {
        let model = crate::mig::catalog::model("h100-80gb").unwrap();
        let gpus = node(&[("h100-80gb", 2, GpuMode::Dynamic)]);
        let models: BTreeMap<u32, &GpuModel> = gpus.iter().map(|g| (g.minor, model)).collect();
        let (a, b) = (gpus[0].minor, gpus[1].minor);
        let mut slices = build("mig.slinky.slurm.net", "node-a", None, 1, Layout::Combined, &gpus).unwrap();
        let held = BTreeSet::from([DeviceName::mig(b, "3g.40gb", 9, 0).to_string()]);
        rank_best_fit(&mut slices, &models, &held);
        let first = |slug: &str| {
            let mut names = slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.clone());
            names.find(|n| n.contains(slug)).unwrap()
        };
        let Ok(DeviceName::Mig { parent_minor, start, .. }) = DeviceName::parse(&first("-mig-1g10gb-19-")) else {
            panic!("not a partition")
        };
        assert_eq!(parent_minor, b, "the first GPU stays whole for a 7g");
        assert!(start >= 4, "beside the 3g, off the other 3g's placement: {start}");
        assert_eq!(first("-mig-7g80gb-"), DeviceName::mig(a, "7g.80gb", 0, 0).to_string());
        // The held 3g comes last among its profile, the other 3g of its GPU first.
        let threes: Vec<String> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .map(|d| d.name.clone())
            .filter(|n| n.contains("-mig-3g40gb-9-"))
            .collect();
        assert_eq!(threes.first(), Some(&DeviceName::mig(b, "3g.40gb", 9, 4).to_string()));
        assert_eq!(threes.last(), held.first());
    }
}
