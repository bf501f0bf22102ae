//! Where shards and placements disagree: Slurm picks the GPU of a shard job by its free
//! *shards*, and the claim the bridge then pins to that GPU needs a free *placement*.
//!
//! A MIG device of `p` memory slices stands for ⌈p × S / M⌉ shards
//! ([`shards_for`], what migdra publishes as `slurmShards`). slurm-bridge asks Slurm for that
//! many (`--gres=shard:N`); Slurm puts all of one job's shards on one GPU and reports its index
//! (docs/facts/slurm-bridge.md §3.3, §5: two `--gres=shard:2` jobs went to IDX 0); the bridge
//! pins the claim to the device with that `slurmGpuIndex`. Slurm knows counts, not the placement
//! grid: a GPU with 1g.10gb at 0, 1, 4 and 5 has 4 of 8 shards free, but no 4-slice placement,
//! so a 3g.40gb pinned there cannot be allocated.
//!
//! GPU positions here are Slurm indexes: migdra orders a node's GPUs in Slurm's order.

use super::churn::{self, Workload, ratio};
use migdra::mig::catalog::{GiProfile, GpuModel};
use migdra::mig::devices::shards_for;
use migdra::mig::rules::Placed;
use migdra::packing::allocator::{self, Dev, Node, Rng, SliceOrder};
use migdra::packing::policy::{self, Policy};
use std::collections::BTreeMap;

/// How slurmctld picks the GPU for a one-node `--gres=shard:N` job (select/cons_tres). Both
/// take only GPUs with N free shards on one GPU (no `MULTIPLE_SHARING_GRES_PJ`); the job's
/// socket is not modelled (no `Cores=` in gres.conf, or every GPU on the job's socket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardPick {
    /// The default in every version since 22.05: the first GPU in GRES index order with N free
    /// shards (22.05 `_pick_specific_topo`, 23.11 and later `_pick_shared_gres_topo` walk the
    /// GPUs from index 0 and take the first with enough; the slurm.conf man page: "the default
    /// behavior where the first available device is used").
    FirstAvailable,
    /// `SelectTypeParameters=LL_SHARED_GRES` (23.11 and later): the GPU with the largest free
    /// fraction that has N free (`_get_sorted_topo_by_least_loaded`). Slurm's qsort leaves
    /// ties unordered; here the lower index wins.
    LeastLoaded,
}

impl ShardPick {
    pub const ALL: [ShardPick; 2] = [Self::FirstAvailable, Self::LeastLoaded];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::FirstAvailable => "first GPU with N free shards (Slurm's default)",
            Self::LeastLoaded => "least loaded GPU (SelectTypeParameters=LL_SHARED_GRES)",
        }
    }
}

/// Slurm's view of a node's shards: the same count on every GPU, and how it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardModel {
    /// Shards per GPU (S), at least 1.
    pub per_gpu: u32,
    pub pick: ShardPick,
}

impl ShardModel {
    /// `shards_per_gpu` as Slurm's configuration gives it, else the GPU's memory slices, as
    /// migdra defaults it.
    pub fn new(model: &GpuModel, shards_per_gpu: Option<u32>, pick: ShardPick) -> Self {
        Self { per_gpu: shards_per_gpu.unwrap_or(model.memory_slices).max(1), pick }
    }

    /// Shards a device of `profile` stands for: what the bridge asks Slurm for.
    pub fn need(&self, model: &GpuModel, profile: &GiProfile) -> u32 {
        shards_for(profile.memory_slices, model.memory_slices, self.per_gpu)
    }

    /// Shards Slurm has given out on GPU `g`: one job per allocated device, each holding its
    /// device's shards.
    pub fn held(&self, node: &Node, g: usize) -> u32 {
        let m = node.model();
        node.allocated(g).iter().filter_map(|p| m.profile(p.profile_id)).map(|p| self.need(m, p)).sum()
    }

    /// Shards Slurm still offers on GPU `g`. The ceiling in [`shards_for`] can make the held
    /// shards exceed S when S < M; Slurm then offers none.
    pub fn free(&self, node: &Node, g: usize) -> u32 {
        self.per_gpu.saturating_sub(self.held(node, g))
    }

    /// The GPU Slurm gives a job of `need` shards; `None`: the job pends.
    pub fn choose(&self, node: &Node, need: u32) -> Option<usize> {
        let candidates = (0..node.gpus()).map(|g| (g, self.free(node, g))).filter(|&(_, f)| f >= need);
        match self.pick {
            ShardPick::FirstAvailable => candidates.map(|(g, _)| g).next(),
            // Every GPU has the same S, so the free fraction orders as the free count.
            ShardPick::LeastLoaded => candidates.max_by_key(|&(g, f)| (f, std::cmp::Reverse(g))).map(|(g, _)| g),
        }
    }
}

/// What becomes of a shard request whose claim is pinned to Slurm's GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinned {
    /// kube-scheduler allocated this device on Slurm's GPU.
    Placed(Dev),
    /// No GPU has the shards: the Slurm job pends.
    NoShards,
    /// Slurm picked `gpu`, which has the shards, but no published free device of the profile
    /// there fits: the pod stays pending while Slurm holds the shards.
    Mismatch {
        gpu: usize,
        /// A placement does fit on `gpu`, but the device order did not publish it (only (d)
        /// omits free devices).
        unpublished: bool,
        /// The first other GPU with the shards and a free placement: the mismatch was avoidable.
        elsewhere: Option<usize>,
    },
}

/// Whether a device of `profile` fits anywhere on GPU `g`, published or not.
fn fits_on(node: &Node, g: usize, profile: &GiProfile) -> bool {
    profile.placements.iter().any(|&start| node.fits(Dev { gpu: g, placed: Placed { profile_id: profile.id, start } }))
}

/// One shard request: Slurm picks the GPU, then the scheduler's first fit runs over what
/// `policy` publishes, with the claim's selector (`slurmGpuIndex == k`) admitting only GPU k's
/// devices.
pub fn place_pinned(node: &Node, shards: &ShardModel, policy: Policy, profile: &GiProfile) -> Pinned {
    let need = shards.need(node.model(), profile);
    let Some(k) = shards.choose(node, need) else { return Pinned::NoShards };
    let on_k: Vec<Vec<Dev>> = policy::publish(node, policy, profile.id)
        .into_iter()
        .map(|s| s.into_iter().filter(|d| d.gpu == k).collect())
        .collect();
    // GPU k's devices lie in one slice, so the slice order cannot matter and no shuffle is drawn.
    if let Some(dev) = allocator::first_fit(node, &on_k, profile.id, SliceOrder::ByName, &mut Rng::new(0)) {
        return Pinned::Placed(dev);
    }
    Pinned::Mismatch {
        gpu: k,
        unpublished: fits_on(node, k, profile),
        elsewhere: (0..node.gpus()).find(|&g| g != k && shards.free(node, g) >= need && fits_on(node, g, profile)),
    }
}

/// What happened to the counted shard requests under the pin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinnedStats {
    pub requests: u64,
    pub accepted: u64,
    /// Slurm found no GPU with the shards.
    pub no_shards: u64,
    /// Slurm's GPU had the shards but no allocatable device.
    pub mismatched: u64,
    /// Mismatches another GPU could have taken (shards and a free placement).
    pub avoidable: u64,
    /// Mismatches where a placement fit on Slurm's GPU but was not published.
    pub unpublished: u64,
    /// Per profile: (requests, mismatched).
    pub per_profile: BTreeMap<String, (u64, u64)>,
}

impl PinnedStats {
    pub fn acceptance(&self) -> f64 {
        ratio(self.accepted, self.requests)
    }

    /// Share of requests whose pinned claim could not be allocated.
    pub fn mismatch(&self) -> f64 {
        ratio(self.mismatched, self.requests)
    }

    /// Share of requests that hit an avoidable mismatch.
    pub fn avoidable_rate(&self) -> f64 {
        ratio(self.avoidable, self.requests)
    }

    pub fn no_shards_rate(&self) -> f64 {
        ratio(self.no_shards, self.requests)
    }

    /// Share of requests whose placement fit on Slurm's GPU but was not published.
    pub fn unpublished_rate(&self) -> f64 {
        ratio(self.unpublished, self.requests)
    }

    /// Per profile, the share of its requests that hit a mismatch.
    pub fn mismatch_by_profile(&self) -> impl Iterator<Item = (&str, f64)> {
        self.per_profile.iter().map(|(p, (n, m))| (p.as_str(), ratio(*m, *n)))
    }

    fn count(&mut self, profile: &str, outcome: &Pinned) {
        self.requests += 1;
        let e = self.per_profile.entry(profile.to_string()).or_default();
        e.0 += 1;
        match *outcome {
            Pinned::Placed(_) => self.accepted += 1,
            Pinned::NoShards => self.no_shards += 1,
            Pinned::Mismatch { unpublished, elsewhere, .. } => {
                self.mismatched += 1;
                self.avoidable += u64::from(elsewhere.is_some());
                self.unpublished += u64::from(unpublished);
                e.1 += 1;
            }
        }
    }

    /// Add another run's counts.
    pub fn add(&mut self, o: &PinnedStats) {
        self.requests += o.requests;
        self.accepted += o.accepted;
        self.no_shards += o.no_shards;
        self.mismatched += o.mismatched;
        self.avoidable += o.avoidable;
        self.unpublished += o.unpublished;
        for (p, (r, m)) in &o.per_profile {
            let e = self.per_profile.entry(p.clone()).or_default();
            e.0 += r;
            e.1 += m;
        }
    }
}

/// The churn of [`churn::run`] (same arrivals for a seed) with every request a shard job whose
/// claim is pinned to Slurm's GPU. A request that is not placed is refused: the bridge releases
/// the Slurm job. The slice layout is migdra's (2 GPUs a slice); under the pin it does not matter.
pub fn run_pinned(workload: &Workload, policy: Policy, shards: ShardModel, seed: u64) -> PinnedStats {
    let mut stats = PinnedStats::default();
    churn::drive(workload, 2, seed, |node, a| {
        let outcome = place_pinned(node, &shards, policy, a.profile);
        if a.counted {
            stats.count(&a.profile.name, &outcome);
        }
        match outcome {
            Pinned::Placed(dev) => Some(dev),
            Pinned::NoShards | Pinned::Mismatch { .. } => None,
        }
    });
    stats
}

/// [`run_pinned`] over `seeds`, summed.
pub fn run_pinned_seeds(workload: &Workload, policy: Policy, shards: ShardModel, seeds: &[u64]) -> PinnedStats {
    let mut total = PinnedStats::default();
    for &s in seeds {
        total.add(&run_pinned(workload, policy, shards, s));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use migdra::mig::catalog::model;

    fn h100() -> &'static GpuModel {
        model("h100-80gb").unwrap()
    }

    fn profile(name: &str) -> &'static GiProfile {
        h100().profile_by_name(name).unwrap()
    }

    fn dev(gpu: usize, name: &str, start: u32) -> Dev {
        Dev { gpu, placed: Placed { profile_id: profile(name).id, start } }
    }

    fn node(gpus: usize, devs: &[Dev]) -> Node<'static> {
        let mut n = Node::new(h100(), gpus, 2);
        devs.iter().for_each(|d| n.allocate(*d));
        n
    }

    fn slurm(pick: ShardPick) -> ShardModel {
        ShardModel::new(h100(), None, pick)
    }

    /// S defaults to the memory slices (8 on an H100), and each device holds ⌈p × S / M⌉.
    #[test]
    fn shards_held_and_free_follow_the_published_arithmetic() {
        let s = slurm(ShardPick::FirstAvailable);
        assert_eq!(s.per_gpu, 8);
        let needs: Vec<u32> = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
            .iter()
            .map(|p| s.need(h100(), profile(p)))
            .collect();
        assert_eq!(needs, [1, 2, 2, 4, 4, 8]);
        let n = node(1, &[dev(0, "1g.10gb", 0), dev(0, "3g.40gb", 4)]);
        assert_eq!((s.held(&n, 0), s.free(&n, 0)), (5, 3));
        // S = 7: 3g + 4g hold ⌈28/8⌉ + ⌈28/8⌉ = 8 > 7; Slurm offers none, not a negative count.
        let s7 = ShardModel::new(h100(), Some(7), ShardPick::FirstAvailable);
        let n = node(1, &[dev(0, "4g.40gb", 0), dev(0, "3g.40gb", 4)]);
        assert_eq!((s7.held(&n, 0), s7.free(&n, 0)), (8, 0));
    }

    /// Two 2-shard jobs land on index 0 (docs/facts/slurm-bridge.md §5); a job that does not fit
    /// on index 0 goes to the next with enough; least loaded spreads.
    #[test]
    fn slurm_takes_the_first_gpu_with_enough_shards_or_the_least_loaded() {
        let first = slurm(ShardPick::FirstAvailable);
        let least = slurm(ShardPick::LeastLoaded);
        let mut n = node(4, &[]);
        assert_eq!(first.choose(&n, 2), Some(0));
        n.allocate(dev(0, "2g.20gb", 0));
        assert_eq!(first.choose(&n, 2), Some(0), "the second 2-shard job packs onto index 0");
        assert_eq!(least.choose(&n, 2), Some(1), "least loaded: the empty GPU with the lowest index");
        n.allocate(dev(0, "3g.40gb", 4));
        // GPU 0 now holds 2 + 4 = 6 of 8.
        assert_eq!(first.choose(&n, 2), Some(0));
        assert_eq!(first.choose(&n, 3), Some(1), "3 shards no longer fit on index 0");
        n.allocate(dev(1, "7g.80gb", 0));
        n.allocate(dev(2, "3g.40gb", 0));
        // Free: 2, 0, 4, 8.
        assert_eq!(first.choose(&n, 4), Some(2));
        assert_eq!(least.choose(&n, 4), Some(3));
        assert_eq!(least.choose(&n, 1), Some(3));
        assert_eq!(first.choose(&n, 9), None, "no GPU has 9 shards: the job pends");
        assert_eq!(least.choose(&n, 9), None);
    }

    /// The case: 1g.10gb at 0, 1, 4 and 5 leave 4 shards, and no 4-slice placement for a
    /// 3g.40gb. Slurm's default picks that GPU anyway; the empty GPU 1 could have taken it.
    #[test]
    fn four_free_shards_without_a_four_slice_placement_is_a_mismatch() {
        let frag = [0, 1, 4, 5].map(|s| dev(0, "1g.10gb", s));
        let n = node(2, &frag);
        let three_g = profile("3g.40gb");
        let first = slurm(ShardPick::FirstAvailable);
        assert_eq!(first.free(&n, 0), 4);
        for policy in Policy::ALL {
            assert_eq!(
                place_pinned(&n, &first, policy, three_g),
                Pinned::Mismatch { gpu: 0, unpublished: false, elsewhere: Some(1) },
                "{policy:?}"
            );
            let least = place_pinned(&n, &slurm(ShardPick::LeastLoaded), policy, three_g);
            assert!(matches!(least, Pinned::Placed(d) if d.gpu == 1), "{policy:?}: least loaded picks the empty GPU");
        }
        let least = slurm(ShardPick::LeastLoaded);
        assert_eq!(place_pinned(&n, &least, Policy::Ascending, three_g), Pinned::Placed(dev(1, "3g.40gb", 0)));
        // Best fit keeps the start free for a 4g or 7g: the 3g goes to 4.
        assert_eq!(place_pinned(&n, &least, Policy::BestFit, three_g), Pinned::Placed(dev(1, "3g.40gb", 4)));
        // A 2g.20gb (2 shards; starts 0, 2 and 4) still fits at 2.
        assert_eq!(
            place_pinned(&n, &first, Policy::Ascending, profile("2g.20gb")),
            Pinned::Placed(dev(0, "2g.20gb", 2))
        );
        // The same fragmentation on both GPUs: unavoidable.
        let both: Vec<Dev> = frag.iter().flat_map(|d| [*d, Dev { gpu: 1, ..*d }]).collect();
        let n = node(2, &both);
        assert_eq!(
            place_pinned(&n, &first, Policy::Packed, three_g),
            Pinned::Mismatch { gpu: 0, unpublished: false, elsewhere: None }
        );
        // Slurm refuses only when no GPU has the shards.
        let n = node(1, &[dev(0, "4g.40gb", 0), dev(0, "1g.10gb", 4)]);
        assert_eq!(place_pinned(&n, &first, Policy::Packed, three_g), Pinned::NoShards);
    }

    /// When Slurm's GPU has a free placement, the pinned claim gets it, in published order, even
    /// if another GPU is emptier.
    #[test]
    fn a_pinned_claim_takes_the_first_published_placement_on_slurms_gpu() {
        let n = node(2, &[dev(0, "1g.10gb", 0), dev(0, "1g.10gb", 1)]);
        let first = slurm(ShardPick::FirstAvailable);
        assert_eq!(
            place_pinned(&n, &first, Policy::Ascending, profile("3g.40gb")),
            Pinned::Placed(dev(0, "3g.40gb", 4))
        );
        assert_eq!(
            place_pinned(&n, &first, Policy::Ascending, profile("1g.10gb")),
            Pinned::Placed(dev(0, "1g.10gb", 2))
        );
        assert_eq!(place_pinned(&n, &first, Policy::Packed, profile("1g.10gb")), Pinned::Placed(dev(0, "1g.10gb", 6)));
    }

    /// Steering (d) publishes a profile's free placements on one GPU only; if Slurm picked
    /// another, the pinned claim finds nothing although a placement fits.
    #[test]
    fn steering_hides_the_placement_slurm_pinned() {
        let n = node(2, &[dev(1, "3g.40gb", 0)]);
        let first = slurm(ShardPick::FirstAvailable);
        let one_g = profile("1g.10gb");
        assert_eq!(first.choose(&n, 1), Some(0));
        assert_eq!(
            place_pinned(&n, &first, Policy::Steered, one_g),
            Pinned::Mismatch { gpu: 0, unpublished: true, elsewhere: Some(1) }
        );
        assert!(matches!(place_pinned(&n, &first, Policy::BestFit, one_g), Pinned::Placed(d) if d.gpu == 0));
    }

    /// With S = M a placement that fits always has its shards: at the default, Slurm refuses
    /// nothing the GPUs could take, and a mismatch is the only disagreement.
    #[test]
    fn at_the_default_shard_count_a_fitting_placement_always_has_its_shards() {
        let m = h100();
        let s = slurm(ShardPick::FirstAvailable);
        let all: Vec<Dev> = (0..2)
            .flat_map(|gpu| {
                m.profiles.iter().flat_map(move |p| {
                    p.placements.iter().map(move |&start| Dev { gpu, placed: Placed { profile_id: p.id, start } })
                })
            })
            .collect();
        let mut rng = Rng::new(9);
        let mut n = node(2, &[]);
        for _ in 0..2000 {
            for d in all.iter().filter(|d| n.fits(**d)) {
                let p = m.profile(d.placed.profile_id).unwrap();
                assert!(s.free(&n, d.gpu) >= s.need(m, p), "{d:?} fits beside {:?}", n.allocated(d.gpu));
            }
            let free: Vec<Dev> = all.iter().copied().filter(|d| n.fits(*d)).collect();
            let live: Vec<Dev> = n.all_allocated().collect();
            if free.is_empty() || (!live.is_empty() && rng.below(3) == 0) {
                n.release(live[rng.below(live.len())]);
            } else {
                n.allocate(free[rng.below(free.len())]);
            }
        }
    }

    #[test]
    fn a_seed_reproduces_a_pinned_run_and_the_counts_add_up() {
        let w = Workload::reference(600);
        for policy in Policy::ALL {
            for pick in ShardPick::ALL {
                let s = slurm(pick);
                let r = run_pinned(&w, policy, s, 3);
                assert_eq!(r, run_pinned(&w, policy, s, 3));
                assert_eq!(r.requests, 600);
                assert_eq!(r.accepted + r.no_shards + r.mismatched, r.requests, "{policy:?} {pick:?}");
                assert!(r.avoidable <= r.mismatched && r.unpublished <= r.mismatched);
                if policy != Policy::Steered {
                    assert_eq!(r.unpublished, 0, "{policy:?} publishes every device");
                }
                assert_eq!(r.per_profile.values().map(|(_, m)| m).sum::<u64>(), r.mismatched);
            }
        }
    }
}
