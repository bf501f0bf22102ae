//! The exactness proof of the counter model: for one GPU model, every set of devices fits the
//! shared counters if and only if NVML's rules ([`super::rules`]) admit it. [`prove`] checks the
//! counter set migdra publishes for every partition; [`prove_with`] any set for any partitions
//! (an allowlist's, or a set with one counter left out, which must then fail).
//!
//! A depth-first search adds devices in a fixed order. Both predicates are monotone (a superset of
//! a refused set is refused), so a branch refused by both can be pruned without missing a
//! disagreement: any set where they disagree has every prefix accepted by both, or a prefix
//! where they already disagree.

use super::catalog::{GiProfile, GpuModel};
use super::counters::{self, CounterSet, Counters};
use super::rules::{self, Placed};

/// One device of the enumeration: the whole GPU, or a MIG partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidate {
    FullGpu,
    Mig(Placed),
}

/// What the search covered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProofReport {
    pub model: String,
    /// Devices on one GPU: the whole GPU plus every partition proven.
    pub devices: usize,
    /// Counters in the set.
    pub counters: usize,
    /// Sets evaluated by both predicates (the empty set included).
    pub sets_checked: u64,
    /// Sets both accepted.
    pub sets_admitted: u64,
    /// Largest admitted set.
    pub largest_set: usize,
}

/// A set on which the counters and NVML disagree.
#[derive(Debug, Clone)]
pub struct Disagreement {
    pub model: String,
    pub set: Vec<Candidate>,
    pub counters_fit: bool,
    pub nvml: Result<(), String>,
}

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: counters say {} but NVML says {:?} for {:?}", self.model, self.counters_fit, self.nvml, self.set)
    }
}

struct Search<'a> {
    model: &'a GpuModel,
    capacity: Counters,
    devices: Vec<(Candidate, Counters)>,
    report: ProofReport,
}

/// Run the proof for one model, every partition and the counter set published for them.
///
/// # Errors
/// The first set on which the counters and NVML's rules disagree.
pub fn prove(model: &GpuModel) -> Result<ProofReport, Box<Disagreement>> {
    let all: Vec<(&GiProfile, u32)> =
        model.profiles.iter().flat_map(|p| p.placements.iter().map(move |&s| (p, s))).collect();
    prove_with(model, &all, &CounterSet::for_model(model))
}

/// Run the proof for these partitions (and the whole GPU) against `set`.
///
/// # Errors
/// The first set on which the counters and NVML's rules disagree.
pub fn prove_with(
    model: &GpuModel,
    partitions: &[(&GiProfile, u32)],
    set: &CounterSet,
) -> Result<ProofReport, Box<Disagreement>> {
    let mut devices = vec![(Candidate::FullGpu, set.whole_gpu())];
    for &(p, start) in partitions {
        devices.push((Candidate::Mig(Placed { profile_id: p.id, start }), set.mig(p, start)));
    }
    let mut search = Search {
        model,
        capacity: set.capacity().clone(),
        report: ProofReport {
            model: model.key.clone(),
            devices: devices.len(),
            counters: set.capacity().len(),
            sets_checked: 1,
            sets_admitted: 1,
            largest_set: 0,
        },
        devices,
    };
    search.extend(&mut Vec::new(), 0)?;
    Ok(search.report)
}

impl Search<'_> {
    fn extend(&mut self, set: &mut Vec<usize>, from: usize) -> Result<(), Box<Disagreement>> {
        for i in from..self.devices.len() {
            set.push(i);
            self.report.sets_checked += 1;
            let fit = counters::fits(&self.capacity, set.iter().map(|&j| &self.devices[j].1));
            let nvml = self.nvml_admits(set);
            if fit != nvml.is_ok() {
                return Err(Box::new(Disagreement {
                    model: self.model.key.clone(),
                    set: set.iter().map(|&j| self.devices[j].0).collect(),
                    counters_fit: fit,
                    nvml,
                }));
            }
            if fit {
                self.report.sets_admitted += 1;
                self.report.largest_set = self.report.largest_set.max(set.len());
                self.extend(set, i + 1)?;
            }
            set.pop();
        }
        Ok(())
    }

    /// NVML's answer: the whole GPU is usable only with no MIG instance (MIG mode off); MIG
    /// partitions follow the placement rules.
    fn nvml_admits(&self, set: &[usize]) -> Result<(), String> {
        let mut placed = Vec::with_capacity(set.len());
        for &j in set {
            match self.devices[j].0 {
                Candidate::FullGpu if set.len() > 1 => return Err("the whole GPU excludes MIG instances".into()),
                Candidate::FullGpu => {}
                Candidate::Mig(p) => placed.push(p),
            }
        }
        rules::admits_set(self.model, &placed).map_err(|r| r.to_string())
    }
}
