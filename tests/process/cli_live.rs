//! The operator's commands on a node that has been running: `status`, `layout`, `claims`,
//! `slices`, `profiles` and `cleanup`, on the simulator and on the NVML backend (the fake
//! libnvidia-ml). They read the checkpoint and the hardware directly, print table, JSON or YAML,
//! and change nothing unless told; `cleanup` finds orphans, stale CDI specs and lost claims and
//! fixes them only without `--dry-run`, never touching a static GPU.

use crate::support::DRIVER;
use crate::support::claim::uid;
use crate::support::command::{Run, migdra};
use crate::support::fake_nvml::FakeNode;
use crate::support::node::NodeDir;
use migdra::gpu::GpuBackend;
use serde_json::Value;
use std::process::{Command, Output};

/// The operator's view of a node: every command with GPU 1 static (`--mig-mode-override 1=static`).
struct Node<'a>(&'a NodeDir);

impl Node<'_> {
    fn command(&self, args: &[&str]) -> Command {
        self.0.command(&[args, &["--mig-mode-override", "1=static"]].concat())
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).run()
    }

    fn ok(&self, args: &[&str]) -> String {
        self.command(args).ok()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a)).unwrap()
    }

    fn minor(&self, index: usize) -> u64 {
        self.json(&["layout"])["gpus"][index]["minor"].as_u64().unwrap()
    }

    /// Write claim `n` allocated to `device` and prepare it as the kubelet would.
    fn prepare(&self, n: u32, device: &str) {
        self.0.write_claim(&uid(n), device);
        self.ok(&["claims", "prepare", &uid(n)]);
    }

    fn cdi_files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.0.cdi_dir())
            .map(|d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Everything a command could change: the hardware, the checkpoint, the CDI specs.
    fn snapshot(&self) -> (Value, String, Vec<String>) {
        let checkpoint = std::fs::read_to_string(self.0.state_dir().join("checkpoint.json")).unwrap_or_default();
        (self.json(&["layout"]), checkpoint, self.cdi_files())
    }
}

/// (device, action) of each finding of one kind in a cleanup report.
fn findings(report: &Value, kind: &str, key: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = report[kind]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f[key].as_str().unwrap().to_string(), f["action"].as_str().unwrap().to_string()))
        .collect();
    v.sort();
    v
}

/// Sets up what a day leaves behind on two H100s, GPU 1 static: a healthy claim (1), an orphan
/// on the dynamic GPU, an administrator's instance on the static GPU, a stale CDI spec (claim
/// 9's), and a claim (2) whose instance someone destroyed behind migdra's back. Returns the
/// device names of the orphan and of claim 2.
fn leave_a_mess(node: &Node, destroy: impl Fn(&str, u64)) -> (String, String) {
    let m0 = node.minor(0);
    node.prepare(1, &format!("gpu-{m0}-mig-1g10gb-19-6"));
    node.prepare(2, &format!("gpu-{m0}-mig-3g40gb-9-0"));
    let spec = |n: u32| format!("{DRIVER}-claim_{}.json", uid(n));
    let cdi = node.0.cdi_dir();
    let text = std::fs::read_to_string(cdi.join(spec(1))).unwrap().replace(&uid(1), &uid(9));
    std::fs::write(cdi.join(spec(9)), text).unwrap();
    let claims = node.json(&["claims"]);
    let gi_of_2 = claims.as_array().unwrap().iter().find(|c| c["uid"] == uid(2).as_str()).unwrap()["devices"][0]
        ["gpu_instance_id"]
        .as_u64()
        .unwrap();
    destroy("0", gi_of_2);
    (format!("gpu-{m0}-mig-2g20gb-14-4"), format!("gpu-{m0}-mig-3g40gb-9-0"))
}

/// `cleanup --dry-run` lists every kind of mess in table, JSON and YAML and changes nothing;
/// `cleanup` then destroys the orphan, removes the stale spec and marks the lost claim for
/// re-creation, leaves the static GPU's instance and the healthy claim alone, and the kubelet's
/// next prepare of the lost claim makes it again.
#[test]
fn cleanup_dry_run_changes_nothing_and_cleanup_fixes_only_what_no_claim_explains() {
    let dir = NodeDir::new().simulate("h100-80gb:2");
    let node = Node(&dir);
    let sim = |args: &[&str]| node.ok(&[&["sim"], args].concat());
    let (orphan, lost_device) = leave_a_mess(&node, |gpu, gi| {
        sim(&["destroy", "--gpu", gpu, "--gi", &gi.to_string()]);
    });
    sim(&["create", "--gpu", "0", "--profile", "2g.20gb", "--placement", "4"]);
    sim(&["create", "--gpu", "1", "--profile", "1g.10gb", "--placement", "0"]);

    let before = node.snapshot();
    let dry = node.json(&["cleanup", "--dry-run"]);
    assert_eq!(dry["dryRun"], true);
    assert_eq!(findings(&dry, "orphans", "device"), [(orphan.clone(), "would destroy".to_string())], "{dry:#}");
    assert_eq!(findings(&dry, "staleCdiSpecs", "claimUid"), [(uid(9), "would remove".to_string())], "{dry:#}");
    assert_eq!(findings(&dry, "lostClaims", "uid"), [(uid(2), "would mark for re-creation".to_string())], "{dry:#}");
    assert!(dry["lostClaims"][0]["missing"][0].as_str().unwrap().starts_with(&lost_device), "{dry:#}");
    let table = node.ok(&["cleanup", "--dry-run"]);
    for want in ["orphan instance", "stale CDI spec", "lost claim", "would destroy", "dry run: nothing was changed"] {
        assert!(table.contains(want), "{want}: {table}");
    }
    let yaml: Value = serde_norway::from_str(&node.ok(&["cleanup", "--dry-run", "-o", "yaml"])).unwrap();
    assert_eq!(yaml, dry, "YAML says what JSON says");
    assert_eq!(node.snapshot(), before, "a dry run changes nothing");

    let done = node.json(&["cleanup"]);
    assert_eq!(findings(&done, "orphans", "device"), [(orphan.clone(), "destroyed".to_string())], "{done:#}");
    assert_eq!(findings(&done, "staleCdiSpecs", "claimUid"), [(uid(9), "removed".to_string())]);
    assert_eq!(findings(&done, "lostClaims", "uid"), [(uid(2), "marked for re-creation".to_string())]);
    let layout = node.json(&["layout"]);
    let devices = |g: usize| -> Vec<String> {
        layout["gpus"][g]["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["device"].as_str().unwrap().into())
            .collect()
    };
    let m0 = node.minor(0);
    assert_eq!(devices(0), [format!("gpu-{m0}-mig-1g10gb-19-6")], "only claim 1's instance is left on GPU 0");
    assert_eq!(devices(1).len(), 1, "the static GPU's instance stays");
    assert_eq!(node.cdi_files().len(), 2, "claims 1 and 2 keep their specs: {:?}", node.cdi_files());
    assert_eq!(node.ok(&["cleanup"]), "nothing to clean up\n");

    // The kubelet's next prepare of claim 2 makes its instance again.
    node.ok(&["claims", "prepare", &uid(2)]);
    assert_eq!(node.json(&["layout"])["gpus"][0]["instances"].as_array().unwrap().len(), 2);
    assert_eq!(node.ok(&["cleanup", "--dry-run"]), "nothing to clean up\n");
}

/// Every read command takes `-o json` and `-o yaml` and says the same in both; `status` shows the
/// claim holding each instance; none of them changes anything.
#[test]
fn every_command_prints_json_and_yaml_and_reads_only() {
    let dir = NodeDir::new().simulate("h100-80gb:2");
    let node = Node(&dir);
    let m0 = node.minor(0);
    node.prepare(1, &format!("gpu-{m0}-mig-1g10gb-19-6"));
    let before = node.snapshot();
    for cmd in [&["status"][..], &["layout"], &["claims"], &["slices"], &["profiles"], &["cleanup", "--dry-run"]] {
        let json = node.json(cmd);
        let yaml: Value = serde_norway::from_str(&node.ok(&[cmd, &["-o", "yaml"]].concat())).unwrap();
        assert_eq!(yaml, json, "migdra {cmd:?}");
        assert!(!node.ok(cmd).is_empty(), "migdra {cmd:?} prints a table");
    }
    let status = node.json(&["status"]);
    let inst = &status["gpus"][0]["instances"][0];
    assert_eq!(inst["device"], format!("gpu-{m0}-mig-1g10gb-19-6"), "{status:#}");
    assert_eq!(inst["claim"]["uid"], uid(1).as_str(), "{status:#}");
    assert_eq!(status["gpus"][1]["migMode"], "static", "{status:#}");
    assert_eq!(node.snapshot(), before, "reading changes nothing");
}

/// On a node no daemon has run on, the read commands create no state directory, and a command
/// that cannot work says the fix in one line.
#[test]
fn read_commands_on_a_fresh_node_create_nothing_and_errors_are_one_line() {
    let dir = NodeDir::new().simulate("h100-80gb:1");
    let node = Node(&dir);
    assert_eq!(node.ok(&["cleanup", "--dry-run"]), "nothing to clean up\n");
    node.ok(&["status"]);
    assert!(!dir.state_dir().exists(), "no state directory was made");

    let out = migdra().args(["cleanup", "--dry-run", "--nvml-lib"]).arg(dir.path().join("missing.so")).run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--nvml-lib"), "names the fix: {err}");
}

/// The live-node path: `status`, `layout`, `profiles` and `cleanup --dry-run` on the NVML backend (the fake
/// libnvidia-ml) see the claim a daemon prepared and the orphan beside it, and call nothing that
/// changes a GPU; `cleanup` then destroys the orphan through NVML.
#[test]
fn on_nvml_status_layout_and_cleanup_dry_run_read_only_then_cleanup_destroys_the_orphan() {
    let fake = FakeNode::new("h100-80gb:2");
    let node = Node(&fake.node);
    let gpus = fake.hw.gpus().unwrap();
    let (orphan, _lost) = leave_a_mess(&node, |_gpu, gi| {
        let (gpu, gi) = (gpus[0].uuid.as_str(), u32::try_from(gi).unwrap());
        for ci in fake.hw.compute_instances(gpu, gi).unwrap() {
            fake.hw.destroy_compute_instance(gpu, gi, ci.id).unwrap();
        }
        fake.hw.destroy_gpu_instance(gpu, gi).unwrap();
    });
    let gi = fake.hw.create_gpu_instance(&gpus[0].uuid, 14, 4).unwrap();
    fake.hw.create_compute_instance(&gpus[0].uuid, gi.id, 1).unwrap();

    let before = (fake.hw.state().unwrap(), node.snapshot());
    let calls = fake.calls().len();
    let status = node.json(&["status"]);
    assert_eq!(status["gpus"][0]["instances"].as_array().unwrap().len(), 2, "{status:#}");
    let layout = node.json(&["layout"]);
    assert_eq!(layout["gpus"].as_array().unwrap().len(), 2);
    let profiles = node.json(&["profiles"]);
    assert_eq!(profiles.as_array().map(Vec::len), Some(1), "the node's one model: {profiles:#}");
    assert_eq!(profiles[0]["model"], "h100-80gb");
    let dry = node.json(&["cleanup", "--dry-run"]);
    assert_eq!(findings(&dry, "orphans", "device"), [(orphan.clone(), "would destroy".to_string())], "{dry:#}");
    assert_eq!(findings(&dry, "lostClaims", "uid"), [(uid(2), "would mark for re-creation".to_string())]);
    assert_eq!((fake.hw.state().unwrap(), node.snapshot()), before, "the read commands changed nothing");
    let new_calls = &fake.calls()[calls..];
    assert!(new_calls.iter().any(|c| c == "nvmlDeviceGetGpuInstances"), "they asked NVML");
    for c in new_calls {
        assert!(
            !c.contains("Create") && !c.contains("Destroy") && !c.contains("SetMigMode"),
            "a read command called {c}"
        );
    }

    let done = node.json(&["cleanup"]);
    assert_eq!(findings(&done, "orphans", "device"), [(orphan, "destroyed".to_string())], "{done:#}");
    assert!(fake.calls()[calls..].iter().any(|c| c == "nvmlGpuInstanceDestroy"), "destroyed through NVML");
}

/// After a reboot every instance is gone: the dry run lists the claim as lost, and cleanup refuses
/// with one line that says to start `serve` first (its recovery re-creates claims), changing nothing.
#[test]
fn cleanup_after_a_reboot_says_to_start_serve_first() {
    let dir = NodeDir::new().simulate("h100-80gb:1");
    let node = Node(&dir);
    let m0 = node.minor(0);
    node.prepare(1, &format!("gpu-{m0}-mig-1g10gb-19-6"));
    node.ok(&["sim", "reboot"]);
    let before = node.snapshot();
    let dry = node.json(&["cleanup", "--dry-run"]);
    assert_eq!(findings(&dry, "lostClaims", "uid"), [(uid(1), "would mark for re-creation".to_string())], "{dry:#}");
    let out = node.run(&["cleanup"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("rebooted") && err.contains("start migdra serve"), "{err}");
    assert_eq!(node.snapshot(), before, "nothing changed");
}
