//! Does a device fit beside what is allocated: the scheduler's shared-counter rule (KEP-4815),
//! once. A device fits when, for every counter it consumes, what is left of that counter in its
//! counter set is at least what it consumes. The publisher (`--publish fitting`), `kubectl
//! migdra`, the packing study and the tests all ask here; [`super::counters`] holds the counters
//! themselves and [`super::proof`] shows the rule equal to NVML's placement rules.
//!
//! Decided once, as the scheduler decides:
//! - a counter, or a whole counter set, the pool does not carry has nothing left: the API server
//!   refuses a slice whose device consumes it, so such a device is never allocated;
//! - an amount that cannot be read fits nowhere, and one an allocated device holds takes all of
//!   its counter: the API server refuses an unparsable quantity, so only a reader's gap makes
//!   one, and "no room" is the answer that never overlaps two partitions;
//! - sums never wrap, in a debug build or a release one: one past `u128::MAX` does not fit, and
//!   what is taken saturates there.

use std::collections::BTreeMap;

/// Counter set → counter → amount, in base units.
pub type Amounts = BTreeMap<String, BTreeMap<String, u128>>;

/// The rule on one counter: `need` more fits beside `used` of `capacity`; `None` is a counter the
/// pool lacks (capacity) or an amount that cannot be read (need).
pub fn counter_fits(capacity: Option<u128>, used: u128, need: Option<u128>) -> bool {
    matches!((capacity, need), (Some(cap), Some(need)) if used.checked_add(need).is_some_and(|total| total <= cap))
}

/// What a published device consumes: `(counter set, counter, amount)`, the amount `None` when it
/// cannot be read. The daemon's slice types and `kubectl migdra`'s lean ones both say it.
pub trait Consumer {
    fn consumes(&self) -> Vec<(&str, &str, Option<u128>)>;
}

/// One pool's counter sets: their capacity and what the devices taken so far consume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pool {
    capacity: BTreeMap<String, BTreeMap<String, Option<u128>>>,
    used: Amounts,
}

impl Pool {
    /// Counter sets as the slices carry them; an amount `None` cannot be read (nothing left).
    pub fn new(capacity: BTreeMap<String, BTreeMap<String, Option<u128>>>) -> Self {
        Self { capacity, used: Amounts::new() }
    }

    /// What is left of `counter` in `set`: 0 for one the pool lacks or cannot read.
    pub fn left(&self, set: &str, counter: &str) -> u128 {
        let cap = self.capacity.get(set).and_then(|c| c.get(counter)).copied().flatten().unwrap_or(0);
        cap.saturating_sub(self.used(set, counter))
    }

    /// What the devices taken consume of `counter` in `set`.
    pub fn used(&self, set: &str, counter: &str) -> u128 {
        self.used.get(set).and_then(|c| c.get(counter)).copied().unwrap_or(0)
    }

    /// Whether the scheduler could allocate `d` beside the devices taken.
    pub fn fits(&self, d: &impl Consumer) -> bool {
        d.consumes().into_iter().all(|(set, counter, need)| self.counter_fits(set, counter, need))
    }

    /// The counters `d` needs more of than is left, as `(set, counter)`.
    pub fn short<'d>(&self, d: &'d impl Consumer) -> Vec<(&'d str, &'d str)> {
        let consumes = d.consumes();
        consumes
            .into_iter()
            .filter(|&(set, counter, need)| !self.counter_fits(set, counter, need))
            .map(|(set, counter, _)| (set, counter))
            .collect()
    }

    fn counter_fits(&self, set: &str, counter: &str, need: Option<u128>) -> bool {
        let cap = self.capacity.get(set).and_then(|c| c.get(counter)).copied().flatten();
        counter_fits(cap, self.used(set, counter), need)
    }

    /// Count `d` as allocated: what it consumes is used from now on (all of a counter, for an
    /// amount that cannot be read).
    pub fn take(&mut self, d: &impl Consumer) {
        for (set, counter, need) in d.consumes() {
            let used = self.used.entry(set.to_string()).or_default().entry(counter.to_string()).or_default();
            *used = used.saturating_add(need.unwrap_or(u128::MAX));
        }
    }
}

/// The scheduler's walk over one node: `candidates` in the order it meets them, each taken when
/// `takes` says so beside the ones taken before, until `needs` are taken. Fewer than `needs`
/// back: the request does not fit here. [`first_fit`] is this walk over a [`Pool`]; the packing
/// study walks its dense model with it.
pub fn walk<T>(
    candidates: impl IntoIterator<Item = T>,
    needs: usize,
    mut takes: impl FnMut(&T, &[T]) -> bool,
) -> Vec<T> {
    let mut taken = Vec::new();
    for c in candidates {
        if taken.len() >= needs {
            break;
        }
        if takes(&c, &taken) {
            taken.push(c);
        }
    }
    taken
}

/// [`walk`] with the counter rule: each candidate `accept` takes (selectors, taints) that fits
/// beside the pool and the ones taken before.
pub fn first_fit<'a, D: Consumer>(
    pool: &Pool,
    candidates: impl IntoIterator<Item = &'a D>,
    needs: usize,
    mut accept: impl FnMut(&D) -> bool,
) -> Vec<&'a D> {
    let mut beside = pool.clone();
    walk(candidates, needs, |d, _| {
        let take = accept(d) && beside.fits(*d);
        if take {
            beside.take(*d);
        }
        take
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog;
    use crate::mig::counters::{self, CounterSet, Counters};
    use crate::mig::rules::{self, Placed};

    /// A device of one GPU's counter set `gpu`, in the model's units.
    struct Dev(Vec<(String, String, Option<u128>)>);

    impl Consumer for Dev {
        fn consumes(&self) -> Vec<(&str, &str, Option<u128>)> {
            self.0.iter().map(|(s, c, n)| (s.as_str(), c.as_str(), *n)).collect()
        }
    }

    fn dev(set: &str, c: &Counters) -> Dev {
        Dev(c.iter().map(|(k, &v)| (set.to_string(), k.clone(), Some(u128::from(v)))).collect())
    }

    fn pool(set: &str, cap: &Counters) -> Pool {
        let counters = cap.iter().map(|(k, &v)| (k.clone(), Some(u128::from(v)))).collect();
        Pool::new(BTreeMap::from([(set.to_string(), counters)]))
    }

    #[test]
    fn one_counter_fits_within_capacity_and_nothing_unknown_fits() {
        assert!(counter_fits(Some(4), 1, Some(3)));
        assert!(!counter_fits(Some(4), 2, Some(3)));
        assert!(!counter_fits(None, 0, Some(0)), "a counter the pool lacks");
        assert!(!counter_fits(Some(4), 0, None), "an amount that cannot be read");
        assert!(!counter_fits(Some(u128::MAX), u128::MAX, Some(1)), "overflows into no room, never wraps");
    }

    #[test]
    fn missing_sets_and_unreadable_amounts_are_decided_once() {
        let mut p =
            Pool::new(BTreeMap::from([("gpu-0-counters".into(), BTreeMap::from([("memory".into(), Some(8))]))]));
        let other_set = Dev(vec![("gpu-9-counters".into(), "memory".into(), Some(1))]);
        assert!(!p.fits(&other_set), "a counter set the slices do not carry");
        assert_eq!(p.short(&other_set), vec![("gpu-9-counters", "memory")]);
        let unreadable = Dev(vec![("gpu-0-counters".into(), "memory".into(), None)]);
        assert!(!p.fits(&unreadable));
        let one = Dev(vec![("gpu-0-counters".into(), "memory".into(), Some(1))]);
        assert!(p.fits(&one));
        // An allocated device whose amount cannot be read leaves nothing of its counter.
        p.take(&unreadable);
        assert_eq!(p.left("gpu-0-counters", "memory"), 0);
        assert!(!p.fits(&one));
        p.take(&unreadable);
        assert_eq!(p.used("gpu-0-counters", "memory"), u128::MAX, "no wrap");
        let unreadable_cap = Pool::new(BTreeMap::from([("s".into(), BTreeMap::from([("c".into(), None)]))]));
        assert_eq!(unreadable_cap.left("s", "c"), 0);
        assert!(!unreadable_cap.fits(&Dev(vec![("s".into(), "c".into(), Some(0))])));
        // A device that consumes nothing fits anywhere.
        assert!(p.fits(&Dev(Vec::new())));
    }

    /// Every placement of every model, beside every set of partitions a greedy walk reaches: the
    /// pool says what the counter model and NVML's rules say.
    #[test]
    fn the_pool_agrees_with_the_counters_and_the_rules_on_every_model() {
        let set = "gpu-0-counters";
        for model in catalog::models() {
            let counters = CounterSet::for_model(model);
            let all: Vec<Placed> = rules::every_placement(model);
            let consumption = |p: Placed| counters.mig(model.profile(p.profile_id).unwrap(), p.start);
            for first in &all {
                let mut placed = vec![*first];
                let mut p = pool(set, counters.capacity());
                p.take(&dev(set, &consumption(*first)));
                for next in &all {
                    let used: Vec<Counters> = placed.iter().chain([next]).map(|q| consumption(*q)).collect();
                    let by_counters = counters::fits(counters.capacity(), &used);
                    let by_rules = rules::admits(model, &placed, *next).is_ok();
                    let by_pool = p.fits(&dev(set, &consumption(*next)));
                    assert_eq!(by_pool, by_counters, "{}: {next:?} beside {placed:?}", model.key);
                    assert_eq!(by_pool, by_rules, "{}: {next:?} beside {placed:?}", model.key);
                    if by_pool {
                        p.take(&dev(set, &consumption(*next)));
                        placed.push(*next);
                    }
                }
            }
        }
    }

    proptest::proptest! {
        /// Partitions of a random model offered in a random order: the pool takes exactly what
        /// the counter model and NVML's rules admit beside what it took before.
        #[test]
        fn random_offers_agree_with_the_counters_and_the_rules(
            which in 0..catalog::models().len(),
            offers in proptest::collection::vec(0usize..1000, 1..30),
        ) {
            let model = &catalog::models()[which];
            let counters = CounterSet::for_model(model);
            let set = "gpu-0-counters";
            let all: Vec<Placed> = rules::every_placement(model);
            let consumption = |p: Placed| counters.mig(model.profile(p.profile_id).unwrap(), p.start);
            let (mut p, mut placed) = (pool(set, counters.capacity()), Vec::new());
            for offer in offers {
                let next = all[offer % all.len()];
                let used: Vec<Counters> = placed.iter().chain([&next]).map(|q| consumption(*q)).collect();
                let by_counters = counters::fits(counters.capacity(), &used);
                let by_pool = p.fits(&dev(set, &consumption(next)));
                proptest::prop_assert_eq!(by_pool, by_counters, "{}: {:?} beside {:?}", model.key, next, placed);
                proptest::prop_assert_eq!(by_pool, rules::admits(model, &placed, next).is_ok());
                if by_pool {
                    p.take(&dev(set, &consumption(next)));
                    placed.push(next);
                }
            }
        }
    }

    #[test]
    fn first_fit_takes_in_order_what_fits_beside_the_ones_before() {
        let model = catalog::model("h100-80gb").unwrap();
        let counters = CounterSet::for_model(model);
        let set = "gpu-0-counters";
        let of = |name: &str, start: u32| dev(set, &counters.mig(model.profile_by_name(name).unwrap(), start));
        let candidates = [of("4g.40gb", 0), of("3g.40gb", 0), of("3g.40gb", 4), of("1g.10gb", 6)];
        let p = pool(set, counters.capacity());
        let picked = first_fit(&p, &candidates, 2, |_| true);
        assert_eq!(picked.len(), 2);
        assert!(std::ptr::eq(picked[0], &candidates[0]) && std::ptr::eq(picked[1], &candidates[2]));
        // Refused by `accept`: the walk goes on to the next one.
        let picked = first_fit(&p, &candidates, 1, |d| !std::ptr::eq(d, &candidates[0]));
        assert!(std::ptr::eq(picked[0], &candidates[1]));
        // Three 3g.40gb-sized requests on one H100: two fit, the answer says so.
        let three = [of("3g.40gb", 0), of("3g.40gb", 4), of("3g.40gb", 0)];
        assert_eq!(first_fit(&p, &three, 3, |_| true).len(), 2);
    }
}
