//! Process-level crash points: `migdra claims prepare|unprepare` is aborted (no unwinding, no
//! rollback, like SIGKILL) right after each checkpoint write and each NVML mutation, then a new
//! process recovers and the kubelet's retry converges with nothing leaked.

#![allow(clippy::print_stdout)] // the test prints its counts

use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Output};

const STEPS: [&str; 12] = [
    "prepare-started",
    "gi-created",
    "gi-recorded",
    "ci-created",
    "ci-recorded",
    "cdi-written",
    "prepare-completed",
    "unprepare-started",
    "cdi-deleted",
    "ci-destroyed",
    "gi-destroyed",
    "claim-dropped",
];

fn migdra(dir: &Path, args: &[&str], crash_at: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_migdra"));
    cmd.args(args)
        .arg("--sim-state")
        .arg(dir.join("gpus.json"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--cdi-dir")
        .arg(dir.join("cdi"))
        .arg("--claims-dir")
        .arg(dir.join("claims"))
        .args(["--node-name", "node-a"])
        .env_remove("MIGDRA_CRASH_AT")
        .env_remove("MIGDRA_SIM_FAULTS");
    if let Some(step) = crash_at {
        cmd.env("MIGDRA_CRASH_AT", step);
    }
    cmd.output().unwrap()
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = migdra(dir, args, None);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A ResourceClaim as the API server returns it, allocated to `device`.
fn write_claim(dir: &Path, uid: &str, device: &str) {
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "notebook-gpu", "namespace": "team-a", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "mig.slinky.slurm.net", "pool": "node-a", "device": device}
        ]}}}
    });
    std::fs::create_dir_all(dir.join("claims")).unwrap();
    std::fs::write(dir.join("claims").join(format!("{uid}.json")), claim.to_string()).unwrap();
}

/// Every GI on the node with its CI count.
fn instances(dir: &Path) -> Vec<(u64, u64, usize)> {
    let v: Value = serde_json::from_str(&ok(dir, &["layout", "-o", "json"])).unwrap();
    let mut out = Vec::new();
    for g in v["gpus"].as_array().unwrap() {
        for i in g["instances"].as_array().unwrap() {
            out.push((
                i["profile_id"].as_u64().unwrap(),
                i["placement"]["start"].as_u64().unwrap(),
                i["compute_instances"].as_array().unwrap().len(),
            ));
        }
    }
    out
}

#[test]
fn a_killed_process_at_every_step_converges_on_retry() {
    let mut tried = 0;
    for (model, device_suffix, profile, start) in
        [("h100-80gb", "mig-3g40gb-9-4", 9, 4), ("a30-24gb", "mig-1g6gb-14-3", 14, 3)]
    {
        for step in STEPS {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            ok(dir, &["layout", "--sim", &format!("{model}:1")]);
            let v: Value = serde_json::from_str(&ok(dir, &["layout", "-o", "json"])).unwrap();
            let minor = v["gpus"][0]["minor"].as_u64().unwrap();
            let device = format!("gpu-{minor}-{device_suffix}");
            let uid = "0d6f6a52-3c9e-4b8e-9a0c-6f1d2e3a4b5c";
            write_claim(dir, uid, &device);

            let prepare_step = STEPS.iter().position(|s| *s == step).unwrap() < 7;
            if !prepare_step {
                ok(dir, &["claims", "prepare", uid]);
            }
            let verb = if prepare_step { "prepare" } else { "unprepare" };
            let crashed = migdra(dir, &["claims", verb, uid], Some(step));
            assert!(crashed.status.code().is_none() || crashed.status.code() == Some(134), "{step}: did not crash");

            ok(dir, &["claims", "recover"]);
            if prepare_step {
                let out = ok(dir, &["claims", "prepare", uid]);
                assert!(out.contains(&device), "{out}");
                assert_eq!(instances(dir), [(profile, start, 1)], "{model} after a kill at {step}");
                let again = ok(dir, &["claims", "prepare", uid]);
                assert_eq!(out, again, "idempotent after recovery");
            }
            ok(dir, &["claims", "unprepare", uid]);
            assert!(instances(dir).is_empty(), "{model}: leaked after a kill at {step}");
            assert_eq!(ok(dir, &["claims", "-o", "json"]).trim(), "[]", "{step}: stuck claim");
            assert_eq!(std::fs::read_dir(dir.join("cdi")).map_or(0, |d| d.count()), 0, "{step}: CDI spec left");
            tried += 1;
        }
    }
    println!("killed processes: {tried} (every step × 2 models); leaked instances: 0; stuck claims: 0");
}
