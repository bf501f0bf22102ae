//! The exactness proof, for every model in the catalog: a set of devices on one GPU fits the
//! shared counters if and only if NVML's rules admit it. Prints the sets checked per model.
//!
//! The published set is the smallest of its kind: every counter it keeps is shown to be needed
//! (leaving it out makes the proof fail), and the sets an allowlist publishes are proven too.

#![allow(clippy::print_stdout)] // the proof reports its counts on stdout, by design

use migdra::mig::catalog::{self, GiProfile, GpuModel};
use migdra::mig::counters::{self, CounterSet};
use migdra::mig::proof;

fn partitions(model: &GpuModel, keep: impl Fn(&GiProfile) -> bool) -> Vec<(&GiProfile, u32)> {
    model.profiles.iter().filter(|p| keep(p)).flat_map(|p| p.placements.iter().map(move |&s| (p, s))).collect()
}

#[test]
fn counters_admit_exactly_what_nvml_admits_on_every_model() {
    let mut failures = Vec::new();
    for model in catalog::models() {
        match proof::prove(model) {
            Ok(r) => println!(
                "proof {:<14} devices {:>3}  counters {:>2} of {:>2}  sets checked {:>7}  admitted {:>6}  largest {}",
                r.model,
                r.devices,
                r.counters,
                counters::resources(model).len(),
                r.sets_checked,
                r.sets_admitted,
                r.largest_set
            ),
            Err(d) => failures.push(d.to_string()),
        }
    }
    assert!(failures.is_empty(), "counter model is not exact:\n{}", failures.join("\n"));
}

/// Every counter the published set keeps is needed: without it the counters admit a set NVML
/// refuses.
#[test]
fn every_published_counter_is_needed() {
    let mut failures = Vec::new();
    for model in catalog::models() {
        let set = CounterSet::for_model(model);
        let all = partitions(model, |_| true);
        for name in set.capacity().keys() {
            let without = set.restricted(|n| n != name);
            match proof::prove_with(model, &all, &without) {
                Ok(_) => failures.push(format!("{}: {name} is kept but the proof holds without it", model.key)),
                Err(d) => assert!(d.counters_fit && d.nvml.is_err(), "{d}"),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What an allowlist publishes is exact too: every model with each profile alone, and with each
/// profile left out.
#[test]
fn allowlisted_partitions_are_exact_with_their_own_counters() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for model in catalog::models() {
        for p in &model.profiles {
            let alone = partitions(model, |q| q.id == p.id);
            let others = partitions(model, |q| q.id != p.id);
            for parts in [alone, others] {
                checked += 1;
                if let Err(d) = proof::prove_with(model, &parts, &CounterSet::for_partitions(model, &parts)) {
                    failures.push(d.to_string());
                }
            }
        }
    }
    println!("{checked} allowlists proven");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The proof itself must be able to fail: with every resource counted, a 7g with too few SMs
/// makes the counters refuse seven 1g instances that NVML accepts. The published set, chosen by
/// the proof, leaves that counter out.
#[test]
fn the_proof_catches_a_broken_counter_model() {
    let mut model = catalog::model("h100-80gb").unwrap().clone();
    for p in &mut model.profiles {
        if p.name == "7g.80gb" {
            p.multiprocessors = 100;
        }
    }
    let all = partitions(&model, |_| true);
    let err = proof::prove_with(&model, &all, &CounterSet::every_resource(&model))
        .expect_err("7g.80gb with 100 SMs caps the counters below 7×1g");
    assert!(!err.counters_fit && err.nvml.is_ok(), "{err}");
    assert!(!CounterSet::for_model(&model).capacity().contains_key(counters::MULTIPROCESSORS));
    proof::prove(&model).expect("the published set leaves the binding counter out");
}

/// Before it was made minimal, the set held every resource; that set is exact as well, so the
/// smaller one gives up nothing a selector on capacities could not still ask.
#[test]
fn every_resource_is_exact_too() {
    for model in catalog::models() {
        let all = partitions(model, |_| true);
        if let Err(d) = proof::prove_with(model, &all, &CounterSet::every_resource(model)) {
            panic!("{d}");
        }
    }
}

/// GB200, B300 and GB300 publish what the B200 does: memory slices 0 to 6 and the one OFA engine
/// two `+me` partitions would share, 8 counters of 15, over the same 19300 sets.
#[test]
fn the_newest_blackwells_publish_the_b200_counter_set() {
    let mut want: Vec<String> = (0..7).map(counters::memory_slice).chain([counters::OFA_ENGINES.into()]).collect();
    want.sort();
    for key in ["b200-180gb", "gb200-186gb", "b300-269gb", "gb300-278gb"] {
        let model = catalog::model(key).unwrap();
        let names: Vec<String> = CounterSet::for_model(model).capacity().keys().cloned().collect();
        assert_eq!(names, want, "{key}");
        let r = proof::prove(model).unwrap_or_else(|d| panic!("{d}"));
        let figures = (r.devices, r.counters, r.sets_checked, r.sets_admitted, r.largest_set);
        assert_eq!(figures, (26, 8, 19300, 2320, 7), "{key}");
        assert_eq!(counters::resources(model).len(), 15, "{key}");
    }
}
