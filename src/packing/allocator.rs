//! The node as the scheduler sees it, and the scheduler's allocator for a one-device request.
//!
//! Feasibility is the counter model itself ([`counters::CounterSet`]),
//! held as dense vectors so the churn runs fast; a test checks it against [`counters::fits`] and
//! NVML's rules ([`rules::admits`]) on every placement of every state it meets.

use crate::mig::catalog::GpuModel;
use crate::mig::counters;
use crate::mig::fit;
use crate::mig::rules::{self, Placed};
use std::collections::BTreeMap;
use std::ops::Range;

/// One device of the node: the GPU's position in GPU order (0-based) and the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dev {
    pub gpu: usize,
    pub placed: Placed,
}

/// The order in which the allocator walks a pool's slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceOrder {
    /// Kubernetes 1.34 and 1.35 (and 1.36 with the `stable` allocator): a Go map's order, new for
    /// every pod.
    Random,
    /// Kubernetes 1.36 and later with default gates: by slice name, which migdra makes GPU order.
    ByName,
}

impl SliceOrder {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Random => "random slice order (1.34/1.35)",
            Self::ByName => "slices by name (1.36+)",
        }
    }
}

/// A small deterministic generator (xorshift64*), so a seed reproduces a run exactly.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // Zero is xorshift's fixed point; mix the seed so nearby seeds diverge at once.
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Exponentially distributed with this mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// One model's counter set as dense vectors: the capacity, and what each placement consumes.
#[derive(Debug, Clone)]
struct Table {
    capacity: Vec<u64>,
    consumption: BTreeMap<Placed, Vec<u64>>,
}

impl Table {
    fn new(model: &GpuModel) -> Self {
        let set = counters::CounterSet::for_model(model);
        let cap = set.capacity().clone();
        let keys: Vec<&String> = cap.keys().collect();
        let dense = |c: &counters::Counters| keys.iter().map(|k| c.get(*k).copied().unwrap_or(0)).collect();
        let mut consumption = BTreeMap::new();
        for p in &model.profiles {
            for &start in &p.placements {
                let c = set.mig(p, start);
                debug_assert!(c.keys().all(|k| cap.contains_key(k)), "a counter outside the set");
                consumption.insert(Placed { profile_id: p.id, start }, dense(&c));
            }
        }
        Self { capacity: dense(&cap), consumption }
    }
}

/// The node: identical GPUs of one model, grouped into device slices, and what is allocated.
#[derive(Debug, Clone)]
pub struct Node<'m> {
    model: &'m GpuModel,
    table: Table,
    allocated: Vec<Vec<Placed>>,
    /// Per GPU, the counters its allocated devices consume together.
    used: Vec<Vec<u64>>,
    gpus_per_slice: usize,
}

impl<'m> Node<'m> {
    /// `gpus` GPUs of `model`, `gpus_per_slice` of them in each device slice, in GPU order.
    pub fn new(model: &'m GpuModel, gpus: usize, gpus_per_slice: usize) -> Self {
        let table = Table::new(model);
        let zero = vec![0; table.capacity.len()];
        Self {
            model,
            table,
            allocated: vec![Vec::new(); gpus],
            used: vec![zero; gpus],
            gpus_per_slice: gpus_per_slice.max(1),
        }
    }

    pub fn model(&self) -> &'m GpuModel {
        self.model
    }

    pub fn gpus(&self) -> usize {
        self.allocated.len()
    }

    /// The partitions allocated on GPU `g`.
    pub fn allocated(&self, g: usize) -> &[Placed] {
        &self.allocated[g]
    }

    /// Every allocated device.
    pub fn all_allocated(&self) -> impl Iterator<Item = Dev> + '_ {
        self.allocated.iter().enumerate().flat_map(|(gpu, ps)| ps.iter().map(move |&placed| Dev { gpu, placed }))
    }

    /// The GPUs of each device slice, in slice-name order.
    pub fn slices(&self) -> Vec<Range<usize>> {
        (0..self.gpus()).step_by(self.gpus_per_slice).map(|s| s..(s + self.gpus_per_slice).min(self.gpus())).collect()
    }

    /// Compute slices in use on GPU `g`.
    pub fn compute_used(&self, g: usize) -> u32 {
        self.allocated[g].iter().filter_map(|p| self.model.profile(p.profile_id)).map(|p| p.compute_slices).sum()
    }

    /// Whether `dev` is allocated already (the allocator's "in use").
    pub fn is_allocated(&self, dev: Dev) -> bool {
        self.allocated[dev.gpu].contains(&dev.placed)
    }

    /// Whether the allocator would take `dev` now: not in use, and its counters fit beside what
    /// GPU `dev.gpu` has allocated.
    pub fn fits(&self, dev: Dev) -> bool {
        !self.is_allocated(dev) && self.fits_beside(&self.used[dev.gpu], dev.placed)
    }

    /// Whether `p` fits beside a GPU whose allocations consume `used`.
    pub fn fits_beside(&self, used: &[u64], p: Placed) -> bool {
        let Some(c) = self.table.consumption.get(&p) else { return false };
        let fits = |((u, c), cap): ((&u64, &u64), &u64)| {
            fit::counter_fits(Some(u128::from(*cap)), u128::from(*u), Some(u128::from(*c)))
        };
        used.iter().zip(c).zip(&self.table.capacity).all(fits)
    }

    /// What GPU `g`'s allocations consume, plus `p`.
    pub fn used_with(&self, g: usize, p: Placed) -> Vec<u64> {
        let mut used = self.used[g].clone();
        if let Some(c) = self.table.consumption.get(&p) {
            used.iter_mut().zip(c).for_each(|(u, c)| *u += c);
        }
        used
    }

    /// What GPU `g`'s allocations consume.
    pub fn used(&self, g: usize) -> &[u64] {
        &self.used[g]
    }

    /// Allocate `dev`.
    ///
    /// # Panics
    /// If it does not fit: the allocator never takes such a device.
    pub fn allocate(&mut self, dev: Dev) {
        assert!(self.fits(dev), "{dev:?} does not fit beside {:?}", self.allocated[dev.gpu]);
        self.used[dev.gpu] = self.used_with(dev.gpu, dev.placed);
        self.allocated[dev.gpu].push(dev.placed);
    }

    /// Release `dev`.
    ///
    /// # Panics
    /// If it is not allocated.
    pub fn release(&mut self, dev: Dev) {
        let list = &mut self.allocated[dev.gpu];
        let i = list.iter().position(|p| *p == dev.placed).expect("releasing a device that is not allocated");
        list.swap_remove(i);
        let c = &self.table.consumption[&dev.placed];
        self.used[dev.gpu].iter_mut().zip(c).for_each(|(u, c)| *u -= c);
    }

    /// Whether `profile_id` would fit on GPU `g` if its own partitions could be moved: the
    /// fragmentation test (a refusal that this says yes to was caused by placement, not capacity).
    pub fn fits_after_repack(&self, g: usize, profile_id: u32) -> bool {
        let mut wanted: Vec<u32> = self.allocated[g].iter().map(|p| p.profile_id).collect();
        wanted.push(profile_id);
        let size = |id: &u32| self.model.profile(*id).map_or(0, |p| p.memory_slices * 16 + p.compute_slices);
        wanted.sort_by_key(|id| std::cmp::Reverse(size(id)));
        fn search(model: &GpuModel, wanted: &[u32], layout: &mut Vec<Placed>) -> bool {
            let Some((&first, rest)) = wanted.split_first() else { return true };
            let Some(p) = model.profile(first) else { return false };
            for &start in &p.placements {
                let new = Placed { profile_id: first, start };
                if rules::admits(model, layout, new).is_ok() {
                    layout.push(new);
                    if search(model, rest, layout) {
                        return true;
                    }
                    layout.pop();
                }
            }
            false
        }
        search(self.model, &wanted, &mut Vec::new())
    }
}

/// The scheduler's choice for a request of one device of `profile_id` (a CEL selector on the
/// profile): slices in `order`, each slice's devices as `published`, the first device of that
/// profile that is free and whose counters fit. `None`: unschedulable on this node.
pub fn first_fit(
    node: &Node,
    published: &[Vec<Dev>],
    profile_id: u32,
    order: SliceOrder,
    rng: &mut Rng,
) -> Option<Dev> {
    let mut slices: Vec<usize> = (0..published.len()).collect();
    if order == SliceOrder::Random {
        rng.shuffle(&mut slices);
    }
    let candidates = slices.into_iter().flat_map(|s| published[s].iter().copied());
    fit::walk(candidates, 1, |d, _| d.placed.profile_id == profile_id && node.fits(*d)).pop()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog::model;

    fn h100() -> &'static GpuModel {
        model("h100-80gb").unwrap()
    }

    fn dev(gpu: usize, profile_id: u32, start: u32) -> Dev {
        Dev { gpu, placed: Placed { profile_id, start } }
    }

    /// The dense counter check says exactly what the counter model and NVML's rules say, on
    /// every placement, beside every reachable set of partitions of one H100 built greedily.
    #[test]
    fn dense_counters_agree_with_the_counter_model_and_the_rules() {
        let m = h100();
        let set = counters::CounterSet::for_model(m);
        let cap = set.capacity().clone();
        let mut rng = Rng::new(7);
        let all: Vec<Placed> = rules::every_placement(m);
        for _ in 0..300 {
            let mut node = Node::new(m, 1, 1);
            for _ in 0..8 {
                for &p in &all {
                    let existing = node.allocated(0).to_vec();
                    let mut used: Vec<counters::Counters> =
                        existing.iter().map(|e| set.mig(m.profile(e.profile_id).unwrap(), e.start)).collect();
                    used.push(set.mig(m.profile(p.profile_id).unwrap(), p.start));
                    let by_counters = counters::fits(&cap, &used);
                    assert_eq!(node.fits(dev(0, p.profile_id, p.start)), by_counters, "{p:?} beside {existing:?}");
                    assert_eq!(rules::admits(m, &existing, p).is_ok(), by_counters, "{p:?} beside {existing:?}");
                }
                let free: Vec<Placed> = all.iter().copied().filter(|p| node.fits(Dev { gpu: 0, placed: *p })).collect();
                if free.is_empty() {
                    break;
                }
                node.allocate(Dev { gpu: 0, placed: free[rng.below(free.len())] });
            }
        }
    }

    #[test]
    fn first_fit_takes_the_first_free_device_in_published_order() {
        let mut node = Node::new(h100(), 2, 1);
        let published = vec![vec![dev(0, 19, 0), dev(0, 19, 1)], vec![dev(1, 19, 6), dev(1, 19, 0)]];
        let mut rng = Rng::new(1);
        assert_eq!(first_fit(&node, &published, 19, SliceOrder::ByName, &mut rng), Some(dev(0, 19, 0)));
        node.allocate(dev(0, 19, 0));
        assert_eq!(first_fit(&node, &published, 19, SliceOrder::ByName, &mut rng), Some(dev(0, 19, 1)));
        node.allocate(dev(0, 9, 4));
        node.allocate(dev(0, 19, 1));
        node.allocate(dev(0, 19, 2));
        // GPU 0 now has 6 of 7 compute slices in use; the 1g at 3 still fits, but it is not published.
        assert_eq!(first_fit(&node, &published, 19, SliceOrder::ByName, &mut rng), Some(dev(1, 19, 6)));
        assert_eq!(first_fit(&node, &published, 0, SliceOrder::ByName, &mut rng), None, "no 7g is published");
        node.release(dev(0, 19, 0));
        assert_eq!(first_fit(&node, &published, 19, SliceOrder::ByName, &mut rng), Some(dev(0, 19, 0)));
    }

    #[test]
    fn random_slice_order_visits_every_slice_first_sometimes() {
        let node = Node::new(h100(), 4, 1);
        let published: Vec<Vec<Dev>> = (0..4).map(|g| vec![dev(g, 19, 0)]).collect();
        let mut rng = Rng::new(3);
        let mut firsts = [0; 4];
        for _ in 0..400 {
            firsts[first_fit(&node, &published, 19, SliceOrder::Random, &mut rng).unwrap().gpu] += 1;
        }
        assert!(firsts.iter().all(|&n| n > 60), "{firsts:?}");
    }

    #[test]
    fn repacking_finds_room_that_first_fit_does_not() {
        let mut node = Node::new(h100(), 1, 1);
        node.allocate(dev(0, 19, 0));
        node.allocate(dev(0, 19, 4));
        assert!(!node.fits(dev(0, 9, 0)) && !node.fits(dev(0, 9, 4)), "both 3g placements are blocked");
        assert!(node.fits_after_repack(0, 9));
        assert!(!node.fits_after_repack(0, 0), "a 7g needs the GPU empty");
        assert_eq!(node.slices(), vec![0..1]);
        assert_eq!(Node::new(h100(), 5, 2).slices(), vec![0..2, 2..4, 4..5]);
    }
}
