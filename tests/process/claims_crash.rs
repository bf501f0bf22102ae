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

/// Whether a process ended by the crash hook: killed by a signal, or aborted if it could not be.
fn killed(out: &Output) -> bool {
    out.status.code().is_none() || out.status.code() == Some(134)
}

#[test]
fn the_recovery_points_are_separate_from_the_steps() {
    let names: Vec<&str> = Step::RECOVERY.iter().map(|s| s.name()).collect();
    assert_eq!(names, ["recreate-marked", "orphan-destroyed", "stale-spec-removed"]);
    assert!(Step::RECOVERY.iter().all(|s| !Step::ALL.contains(s) && Step::parse(s.name()) == Some(*s)));
}

/// Startup recovery (`migdra claims recover`, which `serve` runs first) and `migdra cleanup`
/// killed at their own points — an orphan instance destroyed, a stale CDI spec removed, claims
/// marked for re-creation after a reboot — then run again: the work is finished, nothing of a
/// claim is touched, nothing leaked, and the claim's next prepare converges.
#[test]
fn recovery_and_cleanup_killed_part_way_finish_when_run_again() {
    let uid = "0d6f6a52-3c9e-4b8e-9a0c-6f1d2e3a4b5c";
    let setup = || {
        let node = NodeDir::new().simulate("h100-80gb:1");
        node.write_claim(uid, &format!("gpu-{}-mig-3g40gb-9-4", node.minors()[0]));
        node.cli(&["claims", "prepare", uid]);
        node
    };
    let converged = |node: &NodeDir, what: &str| {
        node.cli(&["claims", "prepare", uid]);
        assert_eq!(instances(node), [(9, 4, 1)], "{what}: the claim's instance alone");
        assert_eq!(node.cdi_specs(), 1, "{what}: the claim's spec alone");
        node.cli(&["claims", "unprepare", uid]);
        assert!(instances(node).is_empty() && node.cdi_specs() == 0, "{what}: leaked");
    };
    let mut kills = 0;

    // Two orphans beside the claim's instance; killed after the first is destroyed.
    for args in [&["claims", "recover"][..], &["cleanup"][..]] {
        let node = setup();
        for start in ["0", "1"] {
            node.cli(&["sim", "create", "--gpu", "0", "--profile", "1g.10gb", "--placement", start]);
        }
        assert!(killed(&crash_at(&node, args, "orphan-destroyed")), "{args:?}: did not crash");
        kills += 1;
        assert_eq!(instances(&node).len(), 2, "{args:?}: one orphan destroyed, then the kill");
        node.cli(args);
        assert_eq!(instances(&node), [(9, 4, 1)], "{args:?}: run again, the other orphan goes");
        converged(&node, &format!("{args:?}"));
    }

    // Two specs no claim holds (a power loss emptied them); killed after the first is removed.
    let node = setup();
    for stale in ["1d6f6a52-3c9e-4b8e-9a0c-6f1d2e3a4b5c", "2d6f6a52-3c9e-4b8e-9a0c-6f1d2e3a4b5c"] {
        std::fs::write(node.cdi_dir().join(format!("{}-claim_{stale}.json", crate::support::DRIVER)), b"").unwrap();
    }
    assert!(killed(&crash_at(&node, &["claims", "recover"], "stale-spec-removed")), "did not crash");
    kills += 1;
    assert_eq!(node.cdi_specs(), 2, "one stale spec removed, then the kill");
    node.cli(&["claims", "recover"]);
    converged(&node, "stale specs");

    // A reboot: killed right after recovery marked the claim for re-creation; run again, the mark
    // is kept (the boot ID is already the new one) and the kubelet's prepare re-creates it.
    let node = setup();
    node.cli(&["sim", "reboot"]);
    assert!(killed(&crash_at(&node, &["claims", "recover"], "recreate-marked")), "did not crash");
    kills += 1;
    node.cli(&["claims", "recover"]);
    let claims = node.checkpoint();
    assert_eq!(claims[0]["needs_recreate"], true, "{claims:?}");
    assert!(instances(&node).is_empty());
    converged(&node, "reboot");
    println!("recovery and cleanup killed at their own points: {kills}; leaked: 0; stuck: 0");
}
