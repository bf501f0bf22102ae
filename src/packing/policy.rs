//! Device orders: what migdra publishes, and in which order, for the allocator's first fit.
//!
//! Only the order among devices of one profile matters: a request selects a profile, so the
//! allocator skips every other device. Each policy therefore ranks, per device slice, the
//! placements of one profile.
//!
//! Safety (kubernetes#140802 and "a request that fits somewhere is never refused"):
//! - (a), (b) and (c) publish every device with its counters unchanged: a pure reorder.
//! - (d) also omits free placements; it keeps every allocated device published, and keeps at
//!   least one free placement of a profile wherever the profile fits anywhere on the node. That is
//!   enough for one-device requests; a request for several devices of one profile may find fewer
//!   published than fit, so (d) is a study, not a default.

use super::allocator::{Dev, Node};
use crate::mig::catalog::{GiProfile, GpuModel, MediaEngines};
use crate::mig::devices::Device;
use crate::mig::naming::DeviceName;
use crate::mig::rules::Placed;

/// A device order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// (a) Every profile's placements in ascending order: NVIDIA's driver, migdra until now.
    Ascending,
    /// (b) Static: profiles of at most two memory slices from the end of the GPU, larger ones
    /// from its start, so small partitions leave the start free for a 3g or 4g.
    Packed,
    /// (c) Re-ranked after every allocation and release: free placements that cost the GPUs the
    /// least future room first (fullest GPU first among equals), so the first fit is the best fit.
    BestFit,
    /// (d) [`Policy::BestFit`], and free placements of a profile published only on the GPU where
    /// it fits best, plus every allocated device: steers the choice even when slices come in
    /// random order.
    Steered,
}

impl Policy {
    pub const ALL: [Policy; 4] = [Self::Ascending, Self::Packed, Self::BestFit, Self::Steered];

    /// Short name, as `--device-order` spells the static ones.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ascending => "ascending",
            Self::Packed => "packed",
            Self::BestFit => "best-fit",
            Self::Steered => "steered",
        }
    }

    /// The letter for the policy.
    pub fn letter(self) -> char {
        match self {
            Self::Ascending => 'a',
            Self::Packed => 'b',
            Self::BestFit => 'c',
            Self::Steered => 'd',
        }
    }

    /// Whether the order depends on what is allocated (re-published after every change).
    pub fn is_dynamic(self) -> bool {
        matches!(self, Self::BestFit | Self::Steered)
    }
}

/// The orders migdra publishes (`--device-order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceOrder {
    /// (b) [`Policy::Packed`]: in the reference churn it accepts more requests, and more large
    /// ones, than ascending on 1.34/1.35 (every seed), and as many on 1.36; a pure reorder.
    #[default]
    Packed,
    /// (a) [`Policy::Ascending`]: NVIDIA's order.
    Ascending,
    /// (c) [`Policy::BestFit`]: re-ranked by what the node's claims hold, so the publisher must
    /// follow them; [`Policy::Packed`] while they are unknown.
    BestFit,
}

impl DeviceOrder {
    pub fn policy(self) -> Policy {
        match self {
            Self::Packed => Policy::Packed,
            Self::Ascending => Policy::Ascending,
            Self::BestFit => Policy::BestFit,
        }
    }

    /// The static order each GPU's devices are built in: the whole order for a static one, the
    /// order before the allocations are known for a dynamic one.
    pub fn static_policy(self) -> Policy {
        match self {
            Self::BestFit => Policy::Packed,
            other => other.policy(),
        }
    }
}

/// Whether a profile counts as small for [`Policy::Packed`]: at most two memory slices.
fn is_small(model: &GpuModel, profile: &GiProfile) -> bool {
    profile.memory_slices * 4 <= model.memory_slices
}

/// One profile's placements on a GPU in the order a static policy publishes them.
pub fn static_starts(model: &GpuModel, profile: &GiProfile, policy: Policy) -> Vec<u32> {
    let mut starts = profile.placements.clone();
    starts.sort_unstable();
    if policy == Policy::Packed && is_small(model, profile) {
        starts.reverse();
    }
    starts
}

/// Put one GPU's devices in the order of a static `policy`: the whole GPU first, then profile
/// by profile in catalog order, each profile's placements as [`static_starts`] orders them.
/// A pure reorder: the same devices, unchanged.
///
/// # Panics
/// If `policy` is dynamic: the device list alone does not say what is allocated.
pub fn order_devices(model: &GpuModel, devices: &mut [Device], policy: Policy) {
    assert!(!policy.is_dynamic(), "{} needs the allocations", policy.name());
    let rank = |d: &Device| match DeviceName::parse(&d.name) {
        Ok(DeviceName::Mig { profile_id, start, .. }) => {
            let p = model.profiles.iter().position(|p| p.id == profile_id).unwrap_or(usize::MAX);
            let s = model
                .profile(profile_id)
                .and_then(|prof| static_starts(model, prof, policy).iter().position(|&x| x == start))
                .unwrap_or(usize::MAX);
            (1, p, s)
        }
        _ => (0, 0, 0),
    };
    devices.sort_by_key(rank);
}

/// How much room GPU-wide the placements that still fit beside `used` stand for: each profile's
/// free placements, weighted by the square of its size, so losing a 7g or a 3g costs more than
/// losing 1g slots. `+me` variants are left out: they share their base profile's room.
fn room(node: &Node, used: &[u64]) -> u64 {
    let model = node.model();
    model
        .profiles
        .iter()
        .filter(|p| p.media == MediaEngines::Standard)
        .map(|p| {
            let w = u64::from(p.memory_slices * p.memory_slices);
            let n = p.placements.iter().filter(|&&start| node.fits_beside(used, Placed { profile_id: p.id, start }));
            w * n.count() as u64
        })
        .sum()
}

/// A device's rank under best fit, lowest first, before ties: a placement that fits now before
/// one that does not (in use, or blocked), then the room it costs its GPU, then fuller GPUs first.
/// Only the GPU of `d` is read, so the publisher ranks each GPU on a node of its own.
pub fn best_fit_rank(node: &Node, d: Dev) -> (bool, u64, u32) {
    if !node.fits(d) {
        return (true, 0, 0);
    }
    let before = room(node, node.used(d.gpu));
    let after = room(node, &node.used_with(d.gpu, d.placed));
    (false, before - after, u32::MAX - node.compute_used(d.gpu))
}

/// [`best_fit_rank`], ties broken by GPU and start (deterministic).
fn best_fit_key(node: &Node, d: Dev) -> ((bool, u64, u32), usize, u32) {
    (best_fit_rank(node, d), d.gpu, d.placed.start)
}

/// The devices of `profile_id` the node publishes now under `policy`, per device slice, in
/// published order.
pub fn publish(node: &Node, policy: Policy, profile_id: u32) -> Vec<Vec<Dev>> {
    let model = node.model();
    let Some(profile) = model.profile(profile_id) else { return vec![Vec::new(); node.slices().len()] };
    let in_slice = |gpus: std::ops::Range<usize>| -> Vec<Dev> {
        gpus.flat_map(|gpu| {
            profile.placements.iter().map(move |&start| Dev { gpu, placed: Placed { profile_id, start } })
        })
        .collect()
    };
    match policy {
        Policy::Ascending | Policy::Packed => node
            .slices()
            .into_iter()
            .map(|gpus| {
                gpus.flat_map(|gpu| {
                    static_starts(model, profile, policy)
                        .into_iter()
                        .map(move |start| Dev { gpu, placed: Placed { profile_id, start } })
                })
                .collect()
            })
            .collect(),
        Policy::BestFit => node
            .slices()
            .into_iter()
            .map(|gpus| {
                let mut devs = in_slice(gpus);
                // Free ones that fit by best-fit rank; the rest (in use, or blocked) after them,
                // still published.
                devs.sort_by_cached_key(|&d| best_fit_key(node, d));
                devs
            })
            .collect(),
        Policy::Steered => {
            let best = node
                .slices()
                .into_iter()
                .flat_map(in_slice)
                .filter(|&d| node.fits(d))
                .min_by_key(|&d| best_fit_key(node, d))
                .map(|d| d.gpu);
            node.slices()
                .into_iter()
                .map(|gpus| {
                    let mut devs: Vec<Dev> = in_slice(gpus)
                        .into_iter()
                        .filter(|&d| node.is_allocated(d) || (Some(d.gpu) == best && node.fits(d)))
                        .collect();
                    devs.sort_by_cached_key(|&d| best_fit_key(node, d));
                    devs
                })
                .collect()
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::mig::catalog::model;
    use crate::mig::devices::{GpuIdentity, GpuMode, gpu_devices};
    use crate::packing::allocator::Rng;
    use std::collections::BTreeSet;

    fn h100() -> &'static GpuModel {
        model("h100-80gb").unwrap()
    }

    /// A node of 4 H100s, two per slice, with random allocations made by the allocator's rules.
    pub(crate) fn random_nodes(seed: u64) -> Vec<Node<'static>> {
        let m = h100();
        let mut rng = Rng::new(seed);
        let all: Vec<Dev> = (0..4)
            .flat_map(|gpu| {
                m.profiles.iter().flat_map(move |p| {
                    p.placements.iter().map(move |&start| Dev { gpu, placed: Placed { profile_id: p.id, start } })
                })
            })
            .collect();
        let mut out = Vec::new();
        let mut node = Node::new(m, 4, 2);
        for _ in 0..200 {
            let free: Vec<Dev> = all.iter().copied().filter(|d| node.fits(*d)).collect();
            let live: Vec<Dev> = node.all_allocated().collect();
            if free.is_empty() || (!live.is_empty() && rng.below(3) == 0) {
                node.release(live[rng.below(live.len())]);
            } else {
                node.allocate(free[rng.below(free.len())]);
            }
            out.push(node.clone());
        }
        out
    }

    /// (a), (b) and (c) publish every device of the profile, in every state; (d) publishes every
    /// allocated device, and a free one that fits wherever one fits anywhere.
    #[test]
    fn reorders_publish_everything_and_steering_hides_no_fit() {
        for node in random_nodes(11) {
            for p in &h100().profiles {
                let every: BTreeSet<Dev> = (0..4)
                    .flat_map(|gpu| {
                        p.placements.iter().map(move |&start| Dev { gpu, placed: Placed { profile_id: p.id, start } })
                    })
                    .collect();
                for policy in [Policy::Ascending, Policy::Packed, Policy::BestFit] {
                    let published = publish(&node, policy, p.id);
                    let flat: Vec<Dev> = published.iter().flatten().copied().collect();
                    assert_eq!(flat.len(), every.len(), "{policy:?} publishes each device once");
                    assert_eq!(flat.into_iter().collect::<BTreeSet<_>>(), every, "{policy:?}");
                    assert_eq!(published.len(), 2);
                    assert!(published[0].iter().all(|d| d.gpu < 2) && published[1].iter().all(|d| d.gpu >= 2));
                }
                let steered: BTreeSet<Dev> = publish(&node, Policy::Steered, p.id).into_iter().flatten().collect();
                for d in node.all_allocated().filter(|d| d.placed.profile_id == p.id) {
                    assert!(steered.contains(&d), "allocated {d:?} stays published");
                }
                let fits_anywhere = every.iter().any(|d| node.fits(*d));
                let fits_published = steered.iter().any(|d| node.fits(*d));
                assert_eq!(fits_anywhere, fits_published, "{} fits somewhere, so it stays schedulable", p.name);
            }
        }
    }

    /// Under (c) the first published device that fits is the best-fit choice.
    #[test]
    fn best_fit_puts_a_small_partition_on_the_fuller_gpu_and_off_the_large_placements() {
        let m = h100();
        let mut node = Node::new(m, 2, 2);
        node.allocate(Dev { gpu: 1, placed: Placed { profile_id: 9, start: 0 } });
        let first = |node: &Node, id| publish(node, Policy::BestFit, id)[0].iter().copied().find(|d| node.fits(*d));
        let one_g = first(&node, 19).unwrap();
        assert_eq!(one_g.gpu, 1, "keep GPU 0 whole for a 7g");
        assert!(one_g.placed.start >= 4, "beside the 3g, not inside the 3g's other placement");
        // The static orders: ascending takes GPU 0 at 0; packed takes GPU 0 at 6.
        let ascending = publish(&node, Policy::Ascending, 19);
        assert_eq!(ascending[0][0], Dev { gpu: 0, placed: Placed { profile_id: 19, start: 0 } });
        let packed = publish(&node, Policy::Packed, 19);
        assert_eq!(packed[0][0], Dev { gpu: 0, placed: Placed { profile_id: 19, start: 6 } });
        assert_eq!(publish(&node, Policy::Packed, 9)[0][0].placed.start, 0, "large profiles from the start");
    }

    #[test]
    fn static_orders_reorder_a_gpus_devices_and_keep_them_unchanged() {
        let m = h100();
        let gpu = GpuIdentity {
            index: 0,
            minor: 0,
            uuid: "GPU-0".into(),
            pci_bus_id: "00000000:01:00.0".into(),
            product_name: m.product_name.clone(),
            memory_mib: m.memory_mib,
            driver_version: "580.95.05".into(),
            cuda_compute_capability: m.cuda_compute_capability,
            slurm_index: Some(0),
            slurm_index_source: "nvml".into(),
            shards_per_gpu: 8,
            topology: Default::default(),
        };
        let devices = gpu_devices(
            m,
            &gpu,
            GpuMode::Dynamic,
            true,
            &[],
            crate::mig::naming::NameStyle::Minor,
            &crate::mig::allowlist::Allowlist::all(),
        );
        let mut ascending = devices.clone();
        order_devices(m, &mut ascending, Policy::Ascending);
        assert_eq!(ascending, devices, "ascending is the order gpu_devices builds");
        let mut packed = devices.clone();
        order_devices(m, &mut packed, Policy::Packed);
        let names: Vec<&str> = packed.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names[0], "gpu-0");
        assert_eq!(names[1], "gpu-0-mig-1g10gb-19-6");
        assert!(names.contains(&"gpu-0-mig-3g40gb-9-0"));
        let pos = |n: &str| names.iter().position(|x| *x == n).unwrap();
        assert!(pos("gpu-0-mig-3g40gb-9-0") < pos("gpu-0-mig-3g40gb-9-4"));
        assert!(pos("gpu-0-mig-2g20gb-14-4") < pos("gpu-0-mig-2g20gb-14-0"));
        let set = |v: &[Device]| v.iter().map(|d| format!("{d:?}")).collect::<BTreeSet<_>>();
        assert_eq!(set(&packed), set(&devices), "the same devices, unchanged");
    }

    /// What a publication may leave out, exhaustively: on every model of the catalog, in every
    /// state a GPU can reach, the largest number of one standard profile's partitions that fit
    /// together is the number that fit one at a time. So each partition that fits is needed by a
    /// claim for that many devices on its GPU (a Slurm-pinned one, or one with a same-GPU
    /// constraint), and publishing only what fits ([`crate::kube::slices::keep_fitting`]) is
    /// already the fewest that serve every such claim. Profiles that take media engines (`+me`,
    /// `+me.all`) are the exception: one per GPU at most, however many placements fit.
    #[test]
    fn every_partition_that_fits_is_needed_by_a_claim_for_several() {
        let (mut states, mut spare) = (0, 0);
        for m in crate::mig::catalog::models() {
            let all: Vec<Placed> = m
                .profiles
                .iter()
                .flat_map(|p| p.placements.iter().map(move |&start| Placed { profile_id: p.id, start }))
                .collect();
            let mut seen: BTreeSet<Vec<Placed>> = BTreeSet::new();
            let mut todo = vec![Vec::<Placed>::new()];
            while let Some(mut state) = todo.pop() {
                state.sort();
                if !seen.insert(state.clone()) {
                    continue;
                }
                let mut node = Node::new(m, 1, 1);
                state.iter().for_each(|&placed| node.allocate(Dev { gpu: 0, placed }));
                for p in &m.profiles {
                    let fit: Vec<Dev> = p
                        .placements
                        .iter()
                        .map(|&start| Dev { gpu: 0, placed: Placed { profile_id: p.id, start } })
                        .filter(|&d| node.fits(d))
                        .collect();
                    let together = (0u32..1 << fit.len())
                        .filter(|mask| {
                            let mut n = node.clone();
                            fit.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).all(|(_, &d)| {
                                let fits = n.fits(d);
                                if fits {
                                    n.allocate(d);
                                }
                                fits
                            })
                        })
                        .map(u32::count_ones)
                        .max()
                        .unwrap_or(0) as usize;
                    let me = matches!(p.media, MediaEngines::Me | MediaEngines::AllMe);
                    let want = if me { fit.len().min(1) } else { fit.len() };
                    assert_eq!(together, want, "{} beside {state:?}: {} of {} fitting", m.key, p.name, fit.len());
                    spare += fit.len() - together;
                }
                states += 1;
                todo.extend(all.iter().filter(|&&placed| node.fits(Dev { gpu: 0, placed })).map(|&placed| {
                    let mut next = state.clone();
                    next.push(placed);
                    next
                }));
            }
        }
        assert!(states > 20_000, "{states} states");
        assert!(spare > 0, "media-engine placements beyond the one that can be used: {spare}");
    }
}
