//! Process-level crash points: `migdra claims prepare|unprepare` is aborted (no unwinding, no
//! rollback, like SIGKILL) right after each checkpoint write, CDI spec change and NVML mutation,
//! then a new process recovers and the kubelet's retry converges with nothing leaked.

#![allow(clippy::print_stdout)] // the test prints its counts

use crate::support::command::Run;
use crate::support::node::NodeDir;
use migdra::prepare::Step;
use std::process::Output;

/// As `MIGDRA_CRASH_AT` takes them; the first test checks this is every step there is.
const STEPS: [&str; 11] = [
    "prepare-started",
    "gi-created",
    "ci-created",
    "metadata-written",
    "cdi-written",
    "prepare-completed",
    "unprepare-started",
    "cdi-deleted",
    "ci-destroyed",
    "gi-destroyed",
    "claim-dropped",
];

/// `migdra <args>` on the node, aborting at the crash point `step`.
fn crash_at(node: &NodeDir, args: &[&str], step: &str) -> Output {
    node.command(args).env("MIGDRA_CRASH_AT", step).run()
}

/// Every GI on the node with its CI count.
fn instances(node: &NodeDir) -> Vec<(u64, u64, usize)> {
    node.placements().into_iter().map(|(_, profile, start, cis)| (profile, start, cis)).collect()
}

#[test]
fn the_steps_here_are_every_step_of_the_engine() {
    assert_eq!(STEPS, Step::ALL.map(Step::name));
}

#[test]
fn a_killed_process_at_every_step_converges_on_retry() {
    let mut tried = 0;
    for (model, device_suffix, profile, start) in
        [("h100-80gb", "mig-3g40gb-9-4", 9, 4), ("a30-24gb", "mig-1g6gb-14-3", 14, 3)]
    {
        for step in STEPS {
            let node = NodeDir::new().simulate(&format!("{model}:1"));
            let minor = node.minors()[0];
            let device = format!("gpu-{minor}-{device_suffix}");
            let uid = "0d6f6a52-3c9e-4b8e-9a0c-6f1d2e3a4b5c";
            node.write_claim(uid, &device);

            let at = |name: &str| STEPS.iter().position(|s| *s == name);
            let prepare_step = at(step) < at("unprepare-started");
            if !prepare_step {
                node.cli(&["claims", "prepare", uid]);
            }
            let verb = if prepare_step { "prepare" } else { "unprepare" };
            let crashed = crash_at(&node, &["claims", verb, uid], step);
            assert!(crashed.status.code().is_none() || crashed.status.code() == Some(134), "{step}: did not crash");
            if prepare_step && step != "prepare-completed" {
                // Two durable writes: before the completion, the checkpoint holds the intent alone.
                let claims = node.checkpoint();
                assert_eq!(claims.len(), 1, "{step}");
                assert_eq!(claims[0]["state"], "PrepareStarted", "{step}");
                assert_eq!(claims[0]["devices"][0].get("gpu_instance_id"), None, "{step}: {}", claims[0]);
            }

            node.cli(&["claims", "recover"]);
            if prepare_step {
                let out = node.cli(&["claims", "prepare", uid]);
                assert!(out.contains(&device), "{out}");
                assert_eq!(instances(&node), [(profile, start, 1)], "{model} after a kill at {step}");
                let again = node.cli(&["claims", "prepare", uid]);
                assert_eq!(out, again, "idempotent after recovery");
            }
            node.cli(&["claims", "unprepare", uid]);
            assert!(instances(&node).is_empty(), "{model}: leaked after a kill at {step}");
            assert_eq!(node.cli(&["claims", "-o", "json"]).trim(), "[]", "{step}: stuck claim");
            assert_eq!(node.cdi_specs(), 0, "{step}: CDI spec left");
            assert_eq!(node.metadata_files(), Vec::<std::path::PathBuf>::new(), "{step}: device metadata left");
            tried += 1;
        }
    }
    println!("killed processes: {tried} (every step × 2 models); leaked instances: 0; stuck claims: 0");
}
