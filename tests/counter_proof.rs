//! The exactness proof, for every model in the catalog: a set of devices on one GPU fits the
//! shared counters if and only if NVML's rules admit it. Prints the sets checked per model.

#![allow(clippy::print_stdout)] // the proof reports its counts on stdout, by design

use migdra::mig::{catalog, proof};

#[test]
fn counters_admit_exactly_what_nvml_admits_on_every_model() {
    let mut failures = Vec::new();
    for model in catalog::models() {
        match proof::prove(model) {
            Ok(r) => println!(
                "proof {:<14} devices {:>3}  sets checked {:>7}  admitted {:>6}  largest {}",
                r.model, r.devices, r.sets_checked, r.sets_admitted, r.largest_set
            ),
            Err(d) => failures.push(d.to_string()),
        }
    }
    assert!(failures.is_empty(), "counter model is not exact:\n{}", failures.join("\n"));
}

/// The proof itself must be able to fail: a 7g with too few SMs makes the counters refuse seven
/// 1g instances that NVML accepts.
#[test]
fn the_proof_catches_a_broken_counter_model() {
    let mut model = catalog::model("h100-80gb").unwrap().clone();
    for p in &mut model.profiles {
        if p.name == "7g.80gb" {
            p.multiprocessors = 100;
        }
    }
    let err = proof::prove(&model).expect_err("7g.80gb with 100 SMs caps the counters below 7×1g");
    assert!(!err.counters_fit && err.nvml.is_ok(), "{err}");
}
