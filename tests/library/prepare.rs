//! The prepare engine on the simulator: exact placement, CDI, checkpoint, rollback, crash
//! recovery, concurrency and bad input.

#![allow(clippy::print_stdout)] // tests that measure print their figures

use migdra::claims::{AllocationResult, ClaimRef};
use migdra::gpu::sim::{Fault, SimBackend, SimSpec};
use migdra::gpu::{ComputeInstance, GpuBackend, GpuInfo, GpuInstance, Result as GpuResult};
use migdra::mig::catalog::{self, GpuModel};
use migdra::mig::devices::GpuMode;
use migdra::mig::naming::DeviceName;
use migdra::prepare::{Engine, Options, OrphanAction, OrphanPolicy, PrepareError, Step};
use migdra::state::ClaimState;
use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const DRIVER: &str = "mig.slinky.slurm.net";
const NODE: &str = "node-a";

/// Counts every NVML call, to prove idempotent paths make none.
struct Counting {
    inner: Arc<SimBackend>,
    calls: AtomicU64,
}

impl Counting {
    fn count(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

impl GpuBackend for Counting {
    fn gpus(&self) -> GpuResult<Vec<GpuInfo>> {
        self.count();
        self.inner.gpus()
    }
    fn model(&self, gpu: &str) -> GpuResult<GpuModel> {
        self.inner.model(gpu)
    }
    fn gpu_instances(&self, gpu: &str) -> GpuResult<Vec<GpuInstance>> {
        self.count();
        self.inner.gpu_instances(gpu)
    }
    fn create_gpu_instance(&self, gpu: &str, profile_id: u32, start: u32) -> GpuResult<GpuInstance> {
        self.count();
        self.inner.create_gpu_instance(gpu, profile_id, start)
    }
    fn destroy_gpu_instance(&self, gpu: &str, gi_id: u32) -> GpuResult<()> {
        self.count();
        self.inner.destroy_gpu_instance(gpu, gi_id)
    }
    fn compute_instances(&self, gpu: &str, gi_id: u32) -> GpuResult<Vec<ComputeInstance>> {
        self.count();
        self.inner.compute_instances(gpu, gi_id)
    }
    fn create_compute_instance(&self, gpu: &str, gi_id: u32, ci_profile_id: u32) -> GpuResult<ComputeInstance> {
        self.count();
        self.inner.create_compute_instance(gpu, gi_id, ci_profile_id)
    }
    fn caps_major(&self) -> GpuResult<u32> {
        self.inner.caps_major()
    }
    fn mig_capability_minors(&self, gpu_minor: u32, gi_id: u32, ci_id: u32) -> GpuResult<(u32, u32)> {
        self.inner.mig_capability_minors(gpu_minor, gi_id, ci_id)
    }
    fn destroy_compute_instance(&self, gpu: &str, gi_id: u32, ci_id: u32) -> GpuResult<()> {
        self.count();
        self.inner.destroy_compute_instance(gpu, gi_id, ci_id)
    }
    fn boot_id(&self) -> GpuResult<String> {
        self.inner.boot_id()
    }
}

struct Node {
    dir: tempfile::TempDir,
    sim: Arc<SimBackend>,
    counting: Arc<Counting>,
}

impl Node {
    fn new(spec: &str) -> Self {
        let sim = Arc::new(SimBackend::in_memory(&SimSpec::parse(spec).unwrap()));
        let counting = Arc::new(Counting { inner: sim.clone(), calls: AtomicU64::new(0) });
        Self { dir: tempfile::tempdir().unwrap(), sim, counting }
    }

    fn options(&self) -> Options {
        Options::new(DRIVER, NODE, self.dir.path().join("state"), self.dir.path().join("cdi"))
    }

    /// A plugin process: a fresh engine on the same hardware and directories.
    fn engine(&self) -> Engine {
        self.engine_with(self.options())
    }

    fn engine_with(&self, opts: Options) -> Engine {
        Engine::new(self.counting.clone(), opts).unwrap()
    }

    fn minor(&self, index: usize) -> u32 {
        self.sim.gpus().unwrap()[index].minor
    }

    fn uuid(&self, index: usize) -> String {
        self.sim.gpus().unwrap()[index].uuid.clone()
    }

    /// Every (GPU, GI, CI count) on the node.
    fn instances(&self) -> Vec<(u32, GpuInstance, usize)> {
        let mut out = Vec::new();
        for g in self.sim.gpus().unwrap().into_iter().filter(|g| g.mig_enabled) {
            for gi in self.sim.gpu_instances(&g.uuid).unwrap() {
                let cis = self.sim.compute_instances(&g.uuid, gi.id).unwrap().len();
                out.push((g.index, gi, cis));
            }
        }
        out
    }

    fn cdi_files(&self) -> usize {
        std::fs::read_dir(self.dir.path().join("cdi")).map_or(0, |d| d.count())
    }

    /// Claims with a device metadata directory (`<namespace>_<claim>`), which unprepare removes.
    fn metadata_claims(&self) -> usize {
        std::fs::read_dir(self.metadata_dir()).map_or(0, |d| d.count())
    }
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef { uid: uid.to_string(), namespace: "ns".into(), name: format!("claim-{uid}") }
}

fn result(device: &str) -> AllocationResult {
    AllocationResult {
        request: "gpu".into(),
        driver: DRIVER.into(),
        pool: NODE.into(),
        device: device.into(),
        admin_access: None,
    }
}

fn mig_name(minor: u32, model: &GpuModel, profile_id: u32, start: u32) -> String {
    DeviceName::mig(minor, &model.profile(profile_id).unwrap().name, profile_id, start).to_string()
}

/// Prepare one partition as claim `uid`, check the instance NVML holds and the CDI spec the
/// container gets, and unprepare it again, leaving nothing behind.
fn prepare_check_unprepare(node: &Node, engine: &Engine, uid: &str, model: &GpuModel, profile_id: u32, start: u32) {
    let p = model.profile(profile_id).unwrap();
    let minor = node.minor(0);
    let device = mig_name(minor, model, p.id, start);
    let out = engine.prepare(&claim(uid), &[result(&device)]).unwrap();
    assert_eq!(out.len(), 1);
    let inst = node.instances();
    assert_eq!(inst.len(), 1, "{device}");
    let (_, gi, cis) = &inst[0];
    assert_eq!((gi.profile_id, gi.start, gi.size, *cis), (p.id, start, p.memory_slices, 1), "{device}");
    let status = &out[0].status;
    assert_eq!(status.placement.unwrap().start, start);
    assert_eq!(status.gpu_instance_id, Some(gi.id));
    let mig_uuid = status.mig_uuid.clone().unwrap();
    let ci = &node.sim.compute_instances(&node.uuid(0), gi.id).unwrap()[0];
    assert_eq!(mig_uuid, ci.uuid);

    let spec = engine_spec(node, uid);
    let id = &out[0].cdi_ids[0];
    let (kind, name) = id.split_once('=').unwrap();
    assert_eq!(spec["kind"], kind);
    let dev = spec["devices"].as_array().unwrap().iter().find(|d| d["name"] == name).expect("CDI ID resolves");
    let env: Vec<&str> = dev["containerEdits"]["env"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    assert!(env.contains(&format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}").as_str()));
    let nodes: Vec<&str> =
        dev["containerEdits"]["deviceNodes"].as_array().unwrap().iter().map(|n| n["path"].as_str().unwrap()).collect();
    let gpu_nodes: Vec<&&str> =
        nodes.iter().filter(|n| n.trim_start_matches("/dev/nvidia").parse::<u32>().is_ok()).collect();
    assert_eq!(gpu_nodes, [&format!("/dev/nvidia{minor}").as_str()], "only the parent GPU node");
    assert_eq!(nodes.iter().filter(|n| n.starts_with("/dev/nvidia-caps/")).count(), 2);

    engine.unprepare(uid).unwrap();
    assert!(node.instances().is_empty(), "{device}");
    assert_eq!(node.cdi_files(), 0);
    assert_eq!(node.metadata_claims(), 0);
}

#[test]
fn every_profile_of_every_model_prepares_at_the_exact_placement_and_unprepares() {
    let mut checked = 0;
    for model in catalog::models() {
        let node = Node::new(&format!("{}:1", model.key));
        let engine = node.engine();
        for p in &model.profiles {
            for &start in &p.placements {
                prepare_check_unprepare(&node, &engine, &format!("u-{}-{start}", p.id), model, p.id, start);
                checked += 1;
            }
        }
        assert!(engine.checkpoint().unwrap().claims.is_empty());
    }
    println!("prepared and unprepared {checked} profile × placement combinations");
    assert!(checked > 150);
}

/// GB200, B300 and GB300 on the simulator: every profile at its last placement, then
/// mig-parted's `all-balanced` layout (2 × 1g, 2g, 3g) as one claim whose CDI spec names each
/// instance, and nothing is left after unprepare.
#[test]
fn the_newest_blackwells_prepare_every_profile_and_mig_parteds_balanced_layout() {
    for (key, [one, two, three]) in [
        ("gb200-186gb", ["1g.23gb", "2g.47gb", "3g.93gb"]),
        ("b300-269gb", ["1g.34gb", "2g.67gb", "3g.135gb"]),
        ("gb300-278gb", ["1g.35gb", "2g.70gb", "3g.139gb"]),
    ] {
        let model = catalog::model(key).unwrap();
        let node = Node::new(&format!("{key}:1"));
        assert_eq!(node.sim.model(&node.uuid(0)).unwrap().key, key);
        let engine = node.engine();
        for p in &model.profiles {
            let start = *p.placements.last().unwrap();
            prepare_check_unprepare(&node, &engine, &format!("{key}-{}", p.id), model, p.id, start);
        }

        let id = |name: &str| model.profile_by_name(name).unwrap().id;
        let minor = node.minor(0);
        let layout = [(three, 4), (two, 0), (one, 2), (one, 3)];
        let results: Vec<AllocationResult> =
            layout.iter().map(|&(n, start)| result(&mig_name(minor, model, id(n), start))).collect();
        let out = engine.prepare(&claim("balanced"), &results).unwrap();
        let mut got: Vec<(u32, u32)> = node.instances().iter().map(|(_, gi, _)| (gi.profile_id, gi.start)).collect();
        got.sort_unstable();
        let mut want: Vec<(u32, u32)> = layout.iter().map(|&(n, start)| (id(n), start)).collect();
        want.sort_unstable();
        assert_eq!(got, want, "{key}");
        let spec = engine_spec(&node, "balanced");
        for o in &out {
            let name = o.cdi_ids[0].split_once('=').unwrap().1;
            let dev = spec["devices"].as_array().unwrap().iter().find(|d| d["name"] == name).expect("CDI ID resolves");
            let visible = format!("NVIDIA_VISIBLE_DEVICES={}", o.status.mig_uuid.as_deref().unwrap());
            assert!(dev["containerEdits"]["env"].as_array().unwrap().iter().any(|e| e == &visible), "{key}: {dev}");
        }
        engine.unprepare("balanced").unwrap();
        assert!(node.instances().is_empty(), "{key}");
        assert_eq!(node.cdi_files(), 0);
        assert_eq!(node.metadata_claims(), 0);
        assert!(engine.checkpoint().unwrap().claims.is_empty());
    }
}

fn engine_spec(node: &Node, uid: &str) -> serde_json::Value {
    let dir = node.dir.path().join("cdi");
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains(uid))
        .expect("spec file");
    serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap()
}

#[test]
fn a_repeated_prepare_returns_the_same_devices_without_nvml_calls() {
    let node = Node::new("h100-80gb:1");
    let engine = node.engine();
    let model = catalog::model("h100-80gb").unwrap();
    let dev = mig_name(node.minor(0), model, 9, 4);
    let first = engine.prepare(&claim("a"), &[result(&dev)]).unwrap();
    let before = node.counting.calls.load(Ordering::SeqCst);
    let again = engine.prepare(&claim("a"), &[result(&dev)]).unwrap();
    assert_eq!(first, again);
    assert_eq!(node.counting.calls.load(Ordering::SeqCst), before, "no NVML call");
    engine.unprepare("never-seen").unwrap();
}

#[test]
fn whole_gpus_and_several_devices_per_claim() {
    let node = Node::new("h100-80gb:1,a100-40gb:1:mig-off");
    let engine = node.engine();
    let model = catalog::model("h100-80gb").unwrap();
    let m = node.minor(0);
    let whole = format!("gpu-{}", node.minor(1));
    let devs = [result(&mig_name(m, model, 19, 0)), result(&mig_name(m, model, 14, 2)), result(&whole)];
    let out = engine.prepare(&claim("multi"), &devs).unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(out[2].status.mig_uuid, None);
    assert_eq!(out[2].status.parent_uuid, node.uuid(1));
    assert_eq!(node.instances().len(), 2);
    engine.unprepare("multi").unwrap();
    assert!(node.instances().is_empty());
}

#[test]
fn bad_input_fails_only_that_claim_and_creates_nothing() {
    let node = Node::new("h100-80gb:1");
    let engine = node.engine();
    let model = catalog::model("h100-80gb").unwrap();
    let m = node.minor(0);
    let good = mig_name(m, model, 9, 0);
    engine.prepare(&claim("good"), &[result(&good)]).unwrap();
    let overlap = format!("overlaps {good}, prepared for claim ns/claim-good");

    let mut other_pool = result(&mig_name(m, model, 19, 4));
    other_pool.pool = "node-b".into();
    let mut other_driver = result(&mig_name(m, model, 19, 4));
    other_driver.driver = "gpu.nvidia.com".into();
    let cases: Vec<(&str, Vec<AllocationResult>, &str)> = vec![
        ("pool", vec![other_pool], "node-b"),
        ("driver", vec![other_driver], "gpu.nvidia.com"),
        ("malformed", vec![result("gpu-0-mig-3g40gb")], "gpu-0-mig-3g40gb"),
        ("placement", vec![result(&format!("gpu-{m}-mig-3g40gb-9-2"))], "{0,4}:4"),
        ("profile", vec![result(&format!("gpu-{m}-mig-3g40gb-5-0"))], "4g.40gb"),
        ("no-gpu", vec![result("gpu-77-mig-3g40gb-9-4")], "minor 77"),
        ("twice", vec![result(&good)], "already prepared for claim ns/claim-good"),
        ("overlap", vec![result(&mig_name(m, model, 19, 2))], &overlap),
    ];
    let before = node.instances();
    for (uid, results, needle) in cases {
        let err = engine.prepare(&claim(uid), &results).expect_err(uid).to_string();
        assert!(err.contains(needle) && err.contains(uid), "{uid}: {err}");
        assert_eq!(node.instances(), before, "{uid} created nothing");
        assert!(!engine.checkpoint().unwrap().claims.contains_key(uid));
    }
    let changed = engine.prepare(&claim("good"), &[result(&mig_name(m, model, 9, 4))]).unwrap_err();
    assert!(matches!(changed, PrepareError::AllocationChanged { .. }), "{changed}");
    // The good claim is untouched and a later claim still works.
    engine.prepare(&claim("later"), &[result(&mig_name(m, model, 9, 4))]).unwrap();
    assert_eq!(node.instances().len(), 2);
}

#[test]
fn an_nvml_failure_at_any_step_leaves_nothing_behind_and_the_claim_can_be_retried() {
    let model = catalog::model("h100-80gb").unwrap();
    for fault in [
        "list-gi=unknown:1",
        "create-gi=insufficient-resources:1",
        "list-ci=unknown:1",
        "create-ci=insufficient-resources:1",
        "create-ci=no-permission:1",
    ] {
        let node = Node::new("h100-80gb:1");
        let engine = node.engine();
        let dev = mig_name(node.minor(0), model, 14, 2);
        node.sim.add_fault(Fault::parse(fault).unwrap()).unwrap();
        let err = engine.prepare(&claim("f"), &[result(&dev)]).unwrap_err().to_string();
        assert!(err.contains("ns/claim-f") && err.contains(&dev), "{fault}: {err}");
        assert!(node.instances().is_empty(), "{fault}: rolled back");
        assert_eq!(node.cdi_files(), 0);
        assert_eq!(node.metadata_claims(), 0);
        assert!(engine.checkpoint().unwrap().claims.is_empty(), "{fault}");
        engine.prepare(&claim("f"), &[result(&dev)]).unwrap();
        assert_eq!(node.instances().len(), 1, "{fault}: retry succeeds");
    }
}

#[test]
fn a_failing_destroy_keeps_the_claim_until_a_retry_succeeds() {
    let node = Node::new("h100-80gb:1");
    let engine = node.engine();
    let model = catalog::model("h100-80gb").unwrap();
    engine.prepare(&claim("busy"), &[result(&mig_name(node.minor(0), model, 19, 3))]).unwrap();
    node.sim.add_fault(Fault::parse("destroy-gi=in-use:1").unwrap()).unwrap();
    let err = engine.unprepare("busy").unwrap_err().to_string();
    assert!(err.contains("in-use"), "{err}");
    assert_eq!(engine.checkpoint().unwrap().claims["busy"].state, ClaimState::UnprepareStarted);
    engine.unprepare("busy").unwrap();
    assert!(node.instances().is_empty());
    assert!(engine.checkpoint().unwrap().claims.is_empty());
}

/// The crashes the tests make are deliberate: keep their panic messages out of the output, and no
/// others.
fn quiet_crashes() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // `panic!` with arguments carries a String (`payload_as_str` is newer than our MSRV).
            if !info.payload().downcast_ref::<String>().is_some_and(|m| m.starts_with("crash at")) {
                default(info);
            }
        }));
    });
}

/// A crash at every step of prepare and unprepare (the hook panics there, so no rollback code
/// runs), then a new engine (process) recovers, and the kubelet's retry converges.
#[test]
fn a_crash_at_every_step_converges_after_restart_with_nothing_leaked() {
    quiet_crashes();
    let mut tried = 0;
    for model_key in ["h100-80gb", "a30-24gb", "rtx-pro-6000"] {
        let model = catalog::model(model_key).unwrap();
        for p in &model.profiles {
            let start = *p.placements.last().unwrap();
            for step in Step::ALL {
                let node = Node::new(&format!("{model_key}:1"));
                let dev = mig_name(node.minor(0), model, p.id, start);
                let crashing = node.engine().with_hook(Arc::new(move |s| {
                    if s == step {
                        panic!("crash at {}", s.name());
                    }
                }));
                let c = claim("crash");
                let prepared = catch_unwind(AssertUnwindSafe(|| crashing.prepare(&c, &[result(&dev)])));
                let unprepare_phase = prepared.is_ok();
                if unprepare_phase {
                    prepared.unwrap().unwrap();
                    assert!(catch_unwind(AssertUnwindSafe(|| crashing.unprepare("crash"))).is_err(), "{}", step.name());
                }
                drop(crashing);

                let engine = node.engine();
                let left = engine.checkpoint().unwrap();
                match (unprepare_phase, step) {
                    (_, Step::ClaimDropped) => assert!(left.claims.is_empty()),
                    (true, _) => assert_eq!(left.claims["crash"].state, ClaimState::UnprepareStarted),
                    (false, Step::PrepareCompleted) => {
                        assert_eq!(left.claims["crash"].state, ClaimState::PrepareCompleted);
                    }
                    (false, _) => {
                        // Two durable writes: until the completion, the checkpoint holds the intent alone.
                        let rec = &left.claims["crash"];
                        assert_eq!(rec.state, ClaimState::PrepareStarted, "{}", step.name());
                        let mig = rec.devices[0].mig.as_ref().unwrap();
                        assert_eq!(*mig, mig.forgotten(), "{}: {mig:?}", step.name());
                    }
                }
                let report = engine.recover().unwrap();
                assert!(report.orphans.iter().all(|o| o.action == OrphanAction::Destroyed));
                if unprepare_phase {
                    engine.unprepare("crash").unwrap();
                } else {
                    let out = engine.prepare(&c, &[result(&dev)]).unwrap();
                    let inst = node.instances();
                    assert_eq!(inst.len(), 1, "{dev} after crash at {}", step.name());
                    assert_eq!((inst[0].1.profile_id, inst[0].1.start, inst[0].2), (p.id, start, 1));
                    assert_eq!(out[0].status.gpu_instance_id, Some(inst[0].1.id));
                    engine.unprepare("crash").unwrap();
                }
                assert!(node.instances().is_empty(), "leak after crash at {} on {dev}", step.name());
                assert!(engine.checkpoint().unwrap().claims.is_empty());
                assert_eq!(node.cdi_files(), 0);
                assert_eq!(node.metadata_claims(), 0, "metadata left after a crash at {}", step.name());
                tried += 1;
            }
        }
    }
    println!("crash points × profiles tried: {tried}, leaked instances: 0, stuck claims: 0");
}

/// Two durable checkpoint writes per prepare (the intent, the completion) and per unprepare (its
/// start, the claim's removal), however many devices the claim holds, since each costs two fsyncs
/// of a prepare's latency; a repeated prepare of a completed claim writes nothing.
#[test]
fn a_prepare_and_an_unprepare_each_make_two_checkpoint_writes() {
    let node = Node::new("h100-80gb:1,a100-40gb:1:mig-off");
    let engine = node.engine();
    let model = catalog::model("h100-80gb").unwrap();
    let m = node.minor(0);
    let whole = format!("gpu-{}", node.minor(1));
    let cases = [
        ("one-mig", vec![result(&mig_name(m, model, 9, 4))]),
        ("whole", vec![result(&whole)]),
        ("several", vec![result(&mig_name(m, model, 19, 0)), result(&mig_name(m, model, 14, 2)), result(&whole)]),
    ];
    for (uid, results) in cases {
        let before = engine.checkpoint_writes();
        engine.prepare(&claim(uid), &results).unwrap();
        assert_eq!(engine.checkpoint_writes() - before, 2, "{uid}: prepare");
        engine.prepare(&claim(uid), &results).unwrap();
        assert_eq!(engine.checkpoint_writes() - before, 2, "{uid}: a repeated prepare");
        engine.unprepare(uid).unwrap();
        assert_eq!(engine.checkpoint_writes() - before, 4, "{uid}: unprepare");
    }
    assert!(node.instances().is_empty());
}

/// CDI specs are renamed into place without fsync, so a power loss (which reboots the node) can
/// lose one, leave it empty, or bring back one that was removed. Each is written again or removed:
/// a prepared claim's by recovery from its record, a re-created claim's by its next prepare, and
/// one whose claim the checkpoint does not hold by recovery, readable or not.
#[test]
fn a_spec_a_power_loss_emptied_lost_or_brought_back_is_repaired_or_removed() {
    let node = Node::new("h100-80gb:1");
    let model = catalog::model("h100-80gb").unwrap();
    let dev = mig_name(node.minor(0), model, 9, 4);
    let spec = |uid: &str| node.dir.path().join("cdi").join(format!("{DRIVER}-claim_{uid}.json"));
    let visible = |uid: &str| {
        let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(spec(uid)).unwrap()).unwrap();
        let env = spec["devices"][0]["containerEdits"]["env"].as_array().unwrap().clone();
        env.iter().map(|e| e.as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    node.engine().prepare(&claim("a"), &[result(&dev)]).unwrap();
    let written = std::fs::read(spec("a")).unwrap();

    // Within a boot, recovery writes a prepared claim's spec again from the committed record.
    std::fs::write(spec("a"), b"").unwrap();
    assert_eq!(node.engine().recover().unwrap().repaired_cdi_specs, [("a".to_string(), "altered")]);
    assert_eq!(std::fs::read(spec("a")).unwrap(), written);
    std::fs::remove_file(spec("a")).unwrap();
    assert_eq!(node.engine().recover().unwrap().repaired_cdi_specs, [("a".to_string(), "missing")]);
    assert_eq!(std::fs::read(spec("a")).unwrap(), written);

    // After a reboot the claim is re-created, and its next prepare writes the spec again.
    std::fs::write(spec("a"), b"").unwrap();
    node.sim.reboot().unwrap();
    let engine = node.engine();
    assert_eq!(engine.recover().unwrap().marked_for_recreate, ["a"]);
    let out = engine.prepare(&claim("a"), &[result(&dev)]).unwrap();
    let uuid = out[0].status.mig_uuid.clone().unwrap();
    assert!(visible("a").contains(&format!("NVIDIA_VISIBLE_DEVICES={uuid}")), "{:?}", visible("a"));

    // The same when the power went between the spec and the completion.
    let crashing = node.engine().with_hook(Arc::new(|s| {
        if s == Step::CdiWritten {
            panic!("crash at {}", s.name());
        }
    }));
    quiet_crashes();
    let one_g = mig_name(node.minor(0), model, 19, 0);
    assert!(catch_unwind(AssertUnwindSafe(|| crashing.prepare(&claim("b"), &[result(&one_g)]))).is_err());
    std::fs::write(spec("b"), b"").unwrap();
    node.sim.reboot().unwrap();
    let engine = node.engine();
    assert_eq!(engine.recover().unwrap().marked_for_recreate, ["a", "b"]);
    let out = engine.prepare(&claim("b"), &[result(&one_g)]).unwrap();
    let uuid = out[0].status.mig_uuid.clone().unwrap();
    assert!(visible("b").contains(&format!("NVIDIA_VISIBLE_DEVICES={uuid}")), "{:?}", visible("b"));
    engine.prepare(&claim("a"), &[result(&dev)]).unwrap();

    // Specs of unprepared claims that a power loss brought back, whole or emptied, are removed.
    engine.unprepare("a").unwrap();
    engine.unprepare("b").unwrap();
    std::fs::write(spec("a"), &written).unwrap();
    std::fs::write(spec("b"), b"").unwrap();
    node.sim.reboot().unwrap();
    let report = node.engine().recover().unwrap();
    assert_eq!(report.stale_cdi_specs_removed, ["a", "b"]);
    assert_eq!(node.cdi_files(), 0);
    assert_eq!(node.metadata_claims(), 0);
    assert!(node.instances().is_empty());
}

#[test]
fn a_reboot_keeps_claims_and_the_next_prepare_recreates_them() {
    let node = Node::new("h100-80gb:1");
    let model = catalog::model("h100-80gb").unwrap();
    let dev = mig_name(node.minor(0), model, 15, 6);
    let before = node.engine().prepare(&claim("r"), &[result(&dev)]).unwrap();
    node.sim.reboot().unwrap();
    let engine = node.engine();
    let report = engine.recover().unwrap();
    assert!(report.boot_changed);
    assert_eq!(report.marked_for_recreate, ["r"]);
    let rec = &engine.checkpoint().unwrap().claims["r"];
    assert!(rec.needs_recreate);
    let after = engine.prepare(&claim("r"), &[result(&dev)]).unwrap();
    assert_ne!(after[0].status.mig_uuid, before[0].status.mig_uuid, "a new instance");
    assert_eq!(after[0].status.placement, before[0].status.placement);
    assert_eq!(node.instances().len(), 1);
}

#[test]
fn a_corrupt_checkpoint_is_moved_aside_and_rebuilt_from_cdi_and_hardware() {
    let node = Node::new("h100-80gb:1");
    let model = catalog::model("h100-80gb").unwrap();
    let dev = mig_name(node.minor(0), model, 9, 0);
    let before = node.engine().prepare(&claim("c"), &[result(&dev)]).unwrap();
    let path = node.dir.path().join("state/checkpoint.json");
    std::fs::write(&path, b"{\"version\":1,\"checksum\":\"0\",\"checkpoint\":{}}").unwrap();
    let engine = node.engine();
    let report = engine.recover().unwrap();
    assert_eq!(report.checkpoint, "corrupt");
    let (moved, _) = report.corrupt.clone().unwrap();
    assert!(moved.to_string_lossy().contains("checkpoint.json.corrupt-"));
    assert!(moved.exists());
    assert_eq!(report.rebuilt_claims, ["c"]);
    assert!(report.orphans.is_empty(), "the instance is explained by the rebuilt claim");
    let again = engine.prepare(&claim("c"), &[result(&dev)]).unwrap();
    assert_eq!(again[0].status.mig_uuid, before[0].status.mig_uuid);
    engine.unprepare("c").unwrap();
    assert!(node.instances().is_empty());
}

#[test]
fn orphans_follow_the_policy_on_dynamic_gpus_and_are_never_touched_on_static_ones() {
    let node = Node::new("h100-80gb:2");
    let (g0, g1) = (node.uuid(0), node.uuid(1));
    node.sim.create_gpu_instance(&g0, 19, 0).unwrap();
    node.sim.create_gpu_instance(&g1, 19, 0).unwrap();
    let mut opts = node.options();
    opts.orphans = OrphanPolicy::Report;
    opts.mode_overrides = vec![(g1.clone(), GpuMode::Static)];
    let report = node.engine_with(opts.clone()).recover().unwrap();
    assert_eq!(report.orphans.len(), 1, "only the dynamic GPU is swept");
    assert_eq!(report.orphans[0].action, OrphanAction::Reported);
    assert_eq!(node.instances().len(), 2);
    opts.orphans = OrphanPolicy::Destroy;
    let report = node.engine_with(opts).recover().unwrap();
    assert_eq!(report.orphans[0].action, OrphanAction::Destroyed);
    let left = node.instances();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, 1, "the static GPU keeps its instance");
}

/// `--device-names slurm`: a whole GPU allocated as `<slurm index>-gpu-<minor>` and a
/// static instance as `<slurm index>-gpu-<minor>-mig-…` prepare, reporting the index the name
/// carries; a prefix that is not the actual index, or on a dynamic partition, is refused in one
/// line before anything is written; the same GPU under its plain name is still the same device.
#[test]
fn slurm_prefixed_names_prepare_and_stale_prefixes_are_refused() {
    let node = Node::new("a100-40gb:3:mig-off");
    let mut opts = node.options();
    opts.device_names = migdra::mig::naming::NameStyle::Slurm;
    let engine = node.engine_with(opts);
    // No Slurm configuration: the Slurm index is the NVML index, which is not the minor here.
    let (minor, index) = (node.minor(0), 0);
    assert_ne!(minor, index);
    let name = format!("{index:04}-gpu-{minor}");
    let out = engine.prepare(&claim("whole"), &[result(&name)]).unwrap();
    assert_eq!(out[0].device, name);
    assert_eq!(out[0].status.slurm_gpu_index, Some(index));
    assert_eq!(out[0].status.parent_minor, minor);
    assert_eq!(out[0].status.parent_uuid, node.uuid(0));
    assert_eq!(engine.checkpoint().unwrap().claims["whole"].devices[0].device, name);

    let plain_twice = engine.prepare(&claim("plain"), &[result(&format!("gpu-{minor}"))]).unwrap_err();
    assert!(matches!(plain_twice, PrepareError::DeviceInUse { .. }), "{plain_twice}");
    let m1 = node.minor(1);
    let cases = [
        (
            "stale",
            format!("0000-gpu-{m1}"),
            format!("its name carries Slurm index 0, but GPU minor {m1} has Slurm index 1;"),
        ),
        ("width", format!("001-gpu-{m1}"), "a Slurm index prefix must be exactly 4 digits".to_string()),
    ];
    for (uid, device, needle) in cases {
        let err = engine.prepare(&claim(uid), &[result(&device)]).expect_err(uid).to_string();
        assert!(err.contains(&needle) && err.contains(&device) && !err.contains('\n'), "{uid}: {err}");
        assert!(!engine.checkpoint().unwrap().claims.contains_key(uid), "{uid}: nothing written");
    }
    // The prefix is advisory for what the name means: the right one prepares the same GPU.
    engine.prepare(&claim("right"), &[result(&format!("0001-gpu-{m1}"))]).unwrap();
    engine.unprepare("whole").unwrap();
    engine.unprepare("right").unwrap();

    // Dynamic partitions never carry a prefix.
    let mig = Node::new("h100-80gb:1");
    let engine = mig.engine();
    let model = catalog::model("h100-80gb").unwrap();
    let prefixed = format!("0000-{}", mig_name(mig.minor(0), model, 9, 4));
    let err = engine.prepare(&claim("dyn"), &[result(&prefixed)]).unwrap_err().to_string();
    assert!(err.contains("dynamic-MIG GPU") && err.contains(&prefixed), "{err}");
    assert!(mig.instances().is_empty());
}

/// Static instances that Slurm lists (here `AutoDetect=nvml`) prepare under their Slurm-prefixed
/// name and report that index; the other instance's index on the same GPU is refused.
#[test]
fn a_static_instance_prepares_under_its_slurm_prefixed_name() {
    let node = Node::new("h100-80gb:1");
    let g = node.uuid(0);
    for start in [6, 0] {
        let gi = node.sim.create_gpu_instance(&g, 19, start).unwrap();
        node.sim.create_compute_instance(&g, gi.id, 0).unwrap();
    }
    let conf = node.dir.path().join("slurm.conf");
    std::fs::write(&conf, format!("ClusterName=t\nNodeName={NODE} CPUs=4 Gres=gpu:2\n")).unwrap();
    std::fs::write(node.dir.path().join("gres.conf"), "AutoDetect=nvml\n").unwrap();
    let mut opts = node.options();
    opts.mig_mode = GpuMode::Static;
    opts.slurm.slurm_conf = conf;
    opts.device_names = migdra::mig::naming::NameStyle::Slurm;
    let engine = node.engine_with(opts);
    let model = catalog::model("h100-80gb").unwrap();
    let plain = |start| mig_name(node.minor(0), model, 19, start);
    // Slurm lists the two instances in capability-minor order: the one at placement 6 first.
    let index_of = |start: u32| {
        let gpu = &engine.gpus()[0];
        let gi = node.sim.gpu_instances(&g).unwrap().into_iter().find(|i| i.start == start).unwrap();
        let ci = node.sim.compute_instances(&g, gi.id).unwrap()[0].id;
        gpu.slurm.mig_index(gi.id, ci).unwrap()
    };
    let (at0, at6) = (index_of(0), index_of(6));
    assert_eq!([at0, at6].iter().collect::<std::collections::BTreeSet<_>>().len(), 2);
    let wrong = format!("{at6:04}-{}", plain(0));
    let err = engine.prepare(&claim("wrong"), &[result(&wrong)]).unwrap_err().to_string();
    assert!(err.contains(&format!("carries Slurm index {at6}, but the 1g.10gb instance at placement 0")), "{err}");
    let name = format!("{at0:04}-{}", plain(0));
    let out = engine.prepare(&claim("s"), &[result(&name)]).unwrap();
    assert_eq!(out[0].device, name);
    assert_eq!(out[0].status.slurm_mig_index, Some(at0));
    assert_eq!(out[0].status.placement.map(|p| p.start), Some(0));
    engine.unprepare("s").unwrap();
    assert_eq!(node.instances().len(), 2, "static instances stay");
}

#[test]
fn static_mig_uses_the_administrators_instance_and_never_destroys_it() {
    let node = Node::new("h100-80gb:1");
    let g = node.uuid(0);
    let gi = node.sim.create_gpu_instance(&g, 14, 4).unwrap();
    let ci = node.sim.create_compute_instance(&g, gi.id, 1).unwrap();
    let mut opts = node.options();
    opts.mig_mode = GpuMode::Static;
    let engine = node.engine_with(opts);
    let model = catalog::model("h100-80gb").unwrap();
    let out = engine.prepare(&claim("s"), &[result(&mig_name(node.minor(0), model, 14, 4))]).unwrap();
    assert_eq!(out[0].status.mig_uuid.as_deref(), Some(ci.uuid.as_str()));
    // Its device metadata names the administrator's instance.
    let d = &metadata_objects(&node, "claim-s", "gpu")[0]["requests"][0]["devices"][0];
    assert_eq!((attr(d, "uuid"), attr(d, "profile")), (&ci.uuid.as_str().into(), &"2g.20gb".into()));
    assert_eq!(attr(d, "migMode"), "static");
    let missing = engine.prepare(&claim("t"), &[result(&mig_name(node.minor(0), model, 14, 0))]).unwrap_err();
    assert!(missing.to_string().contains("static"), "{missing}");
    engine.unprepare("s").unwrap();
    assert_eq!(node.instances().len(), 1, "static instances stay");
    assert!(!node.metadata_file("claim-s", "gpu").exists());
}

/// A spec names `/dev/nvidiactl`, the unified-memory nodes and `/dev/nvidia<minor>` by path, and
/// the container runtime stats each one when it creates the container, long after the prepare
/// answered. With a host root, a missing node fails the prepare instead, in one line naming it;
/// a MIG prepare (checked after its instance is made), a whole GPU and admin access all leave
/// nothing: no instance, no checkpoint entry, no spec, no metadata file.
#[test]
fn a_missing_host_device_node_fails_the_prepare_and_leaves_nothing() {
    let node = Node::new("h100-80gb:1,a100-40gb:1:mig-off");
    let host = tempfile::tempdir().unwrap();
    let mut opts = node.options();
    opts.host_root = Some(host.path().to_path_buf());
    let engine = node.engine_with(opts);
    let model = catalog::model("h100-80gb").unwrap();
    let mig = result(&mig_name(node.minor(0), model, 9, 4));
    let whole = result(&format!("gpu-{}", node.minor(1)));
    let admin = AllocationResult { admin_access: Some(true), ..result(&format!("gpu-{}", node.minor(0))) };
    let ctl = host.path().join("dev/nvidiactl");
    for (what, allocated) in [("MIG", mig), ("whole GPU", whole), ("admin access", admin)] {
        let err = engine.prepare(&claim("h"), &[allocated]).unwrap_err();
        assert!(matches!(err, PrepareError::HostNode { .. }), "{what}: {err}");
        assert_eq!(err.reason(), "host-node");
        assert_eq!(
            err.to_string(),
            format!(
                "claim ns/claim-h (h): {} does not exist: is the NVIDIA driver loaded on this node?",
                ctl.display()
            ),
            "{what}"
        );
        assert!(node.instances().is_empty(), "{what}: the instance was destroyed");
        assert_eq!(node.cdi_files(), 0, "{what}: no spec");
        let cp = engine.checkpoint().unwrap();
        assert!(cp.claims.is_empty() && cp.admin.is_empty(), "{what}: {cp:?}");
        assert_eq!(node.metadata_claims(), 0, "{what}: metadata");
    }
    // Without a host root (the simulator's default) nothing is checked.
    node.engine().prepare(&claim("h"), &[result(&mig_name(node.minor(0), model, 9, 4))]).unwrap();
}

#[test]
fn a_second_plugin_process_sees_the_first_ones_claims() {
    let node = Node::new("h100-80gb:1");
    let model = catalog::model("h100-80gb").unwrap();
    let (old, new) = (node.engine(), node.engine());
    let dev = mig_name(node.minor(0), model, 9, 4);
    old.prepare(&claim("x"), &[result(&dev)]).unwrap();
    let err = new.prepare(&claim("y"), &[result(&dev)]).unwrap_err();
    assert!(matches!(err, PrepareError::DeviceInUse { .. }), "{err}");
    new.unprepare("x").unwrap();
    assert!(node.instances().is_empty());
}

#[test]
fn eight_claims_on_eight_gpus_run_in_parallel() {
    let model = catalog::model("h100-80gb").unwrap();
    let run = |claims: usize| {
        let node = Node::new("h100-80gb:8");
        node.sim.add_fault(Fault::parse("create-gi=delay:300ms").unwrap()).unwrap();
        node.sim.add_fault(Fault::parse("create-ci=delay:300ms").unwrap()).unwrap();
        let engine = node.engine();
        let t = Instant::now();
        std::thread::scope(|s| {
            for i in 0..claims {
                let dev = mig_name(node.minor(i), model, 9, 0);
                let engine = &engine;
                s.spawn(move || engine.prepare(&claim(&format!("p{i}")), &[result(&dev)]).unwrap());
            }
        });
        let took = t.elapsed();
        assert_eq!(node.instances().len(), claims);
        took
    };
    let one = run(1);
    let eight = run(8);
    println!(
        "one claim: {one:?}; eight claims on eight GPUs: {eight:?} ({:.2}× one)",
        eight.as_secs_f64() / one.as_secs_f64()
    );
    assert!(eight < one * 4, "eight took {eight:?}, one {one:?}: not parallel");
    assert!(one >= Duration::from_millis(600));
}

/// A request's device metadata file (KEP-5304) as the engine wrote it: each object of the stream.
fn metadata_objects(node: &Node, claim_name: &str, request: &str) -> Vec<serde_json::Value> {
    let path = node.metadata_file(claim_name, request);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::Deserializer::from_slice(&bytes).into_iter::<serde_json::Value>().map(Result::unwrap).collect()
}

impl Node {
    /// Where the engine keeps a claim's metadata (`Options::new`: under the state directory).
    fn metadata_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("state").join("dra-device-metadata")
    }

    fn metadata_file(&self, claim_name: &str, request: &str) -> std::path::PathBuf {
        self.metadata_dir().join(format!("ns_{claim_name}")).join(request).join("metadata.json")
    }
}

/// The metadata mounts of a claim's CDI spec: (device, hostPath, containerPath, options).
fn metadata_mounts(node: &Node, uid: &str) -> Vec<(String, String, String, Vec<String>)> {
    let spec = engine_spec(node, uid);
    let mut out = Vec::new();
    for d in spec["devices"].as_array().unwrap() {
        for m in d["containerEdits"]["mounts"].as_array().into_iter().flatten() {
            let options = m["options"].as_array().unwrap().iter().map(|o| o.as_str().unwrap().to_string()).collect();
            out.push((
                d["name"].as_str().unwrap().to_string(),
                m["hostPath"].as_str().unwrap().to_string(),
                m["containerPath"].as_str().unwrap().to_string(),
                options,
            ));
        }
    }
    out
}

fn attr<'a>(device: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    let a = &device["attributes"][key];
    a.as_object().and_then(|o| o.values().next()).unwrap_or_else(|| panic!("no attribute {key} in {device}"))
}

/// Every container of a claim gets a file that says what it got, at the path KEP-5304 names, with
/// the created instance's MIG UUID, profile, placement, parent UUID and PCI bus ID, Slurm index and
/// shards; unprepare takes it away. A claim made from a template is found under the pod's name.
#[test]
fn device_metadata_says_what_the_container_got_and_goes_with_the_claim() {
    let node = Node::new("h100-80gb:1,a100-40gb:1:mig-off");
    let engine = node.engine();
    let model = catalog::model("h100-80gb").unwrap();
    let dev = mig_name(node.minor(0), model, 9, 4);
    let out = engine.prepare(&claim("m"), &[result(&dev)]).unwrap();
    let status = &out[0].status;
    let mig_uuid = status.mig_uuid.clone().unwrap();
    let gi = node.instances()[0].1.clone();
    let ci = &node.sim.compute_instances(&node.uuid(0), gi.id).unwrap()[0];
    assert_eq!(mig_uuid, ci.uuid, "the UUID of the instance this prepare created");

    let objs = metadata_objects(&node, "claim-m", "gpu");
    let versions: Vec<&str> = objs.iter().map(|o| o["apiVersion"].as_str().unwrap()).collect();
    assert_eq!(versions, ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]);
    let o = &objs[0];
    assert_eq!((o["kind"].as_str(), o["metadata"]["name"].as_str()), (Some("DeviceMetadata"), Some("claim-m")));
    assert_eq!((o["metadata"]["namespace"].as_str(), o["metadata"]["uid"].as_str()), (Some("ns"), Some("m")));
    assert_eq!(o["requests"][0]["name"], "gpu");
    let d = &o["requests"][0]["devices"][0];
    assert_eq!(
        (d["driver"].as_str(), d["pool"].as_str(), d["name"].as_str()),
        (Some(DRIVER), Some(NODE), Some(dev.as_str()))
    );
    assert_eq!(attr(d, "uuid"), mig_uuid.as_str());
    assert_eq!(attr(d, "profile"), "3g.40gb");
    assert_eq!((attr(d, "placementStart"), attr(d, "placementSize")), (&serde_json::json!(4), &serde_json::json!(4)));
    assert_eq!(attr(d, "parentUUID"), node.uuid(0).as_str());
    assert_eq!(attr(d, "resource.kubernetes.io/pciBusID"), status.parent_pci_bus_id.as_str());
    assert_eq!(attr(d, "slurmGpuIndex"), &serde_json::json!(status.slurm_gpu_index.unwrap()));
    assert_eq!(attr(d, "slurmShards"), &serde_json::json!(status.slurm_shards));
    assert!(d["attributes"].as_object().unwrap().len() <= 32, "v1beta1 allows 32 attributes");

    let mounts = metadata_mounts(&node, "m");
    let container =
        format!("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/claim-m/gpu/{DRIVER}-metadata.json");
    let host = node.metadata_file("claim-m", "gpu").display().to_string();
    assert_eq!(mounts, [(format!("m-{dev}"), host, container, vec!["ro".to_string(), "bind".into()])]);
    engine.unprepare("m").unwrap();
    assert!(!node.metadata_dir().join("ns_claim-m").exists(), "unprepare removes the claim's files");

    // From a template: the pod knows the claim by its own name for it, so the file is there.
    let whole = format!("gpu-{}", node.minor(1));
    let templated = migdra::claims::Claim {
        claim: claim("t"),
        results: vec![
            result(&mig_name(node.minor(0), model, 19, 0)),
            AllocationResult { request: "big".into(), ..result(&whole) },
        ],
        pod_claim_name: Some("trainer".into()),
    };
    let out = engine.prepare_claim(&templated).unwrap();
    let mounts = metadata_mounts(&node, "t");
    let paths: Vec<&str> = mounts.iter().map(|m| m.2.as_str()).collect();
    let base = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/trainer";
    assert_eq!(paths, [format!("{base}/gpu/{DRIVER}-metadata.json"), format!("{base}/big/{DRIVER}-metadata.json")]);
    assert_eq!(metadata_objects(&node, "claim-t", "gpu")[0]["podClaimName"], "trainer");
    let big = metadata_objects(&node, "claim-t", "big");
    let d = &big[0]["requests"][0]["devices"][0];
    assert_eq!((attr(d, "type"), attr(d, "uuid")), (&"gpu".into(), &node.uuid(1).as_str().into()), "a whole GPU");
    assert_eq!(attr(d, "slurmShards"), &serde_json::json!(out[1].status.slurm_shards));
    engine.unprepare("t").unwrap();
    assert_eq!(std::fs::read_dir(node.metadata_dir()).unwrap().count(), 0);
}

/// A metadata directory that cannot be written fails the prepare with one line naming the path,
/// and leaves nothing: no instance, no CDI spec, no checkpoint entry. Once fixed, the retry works.
#[test]
fn an_unwritable_metadata_directory_fails_the_prepare_and_leaves_nothing() {
    let node = Node::new("h100-80gb:1");
    let blocked = node.dir.path().join("blocked");
    std::fs::write(&blocked, "a file where the metadata directory should be").unwrap();
    let mut opts = node.options();
    opts.metadata_dir = blocked.clone();
    let engine = node.engine_with(opts);
    let model = catalog::model("h100-80gb").unwrap();
    let dev = mig_name(node.minor(0), model, 9, 4);
    let err = engine.prepare(&claim("x"), &[result(&dev)]).unwrap_err().to_string();
    println!("{err}");
    assert!(!err.contains('\n'), "one line: {err}");
    assert!(err.contains(&blocked.join("ns_claim-x").display().to_string()), "names the path: {err}");
    assert!(node.instances().is_empty(), "the created instance is rolled back");
    assert_eq!(node.cdi_files(), 0);
    assert_eq!(node.metadata_claims(), 0);
    assert!(engine.checkpoint().unwrap().claims.is_empty());
    std::fs::remove_file(&blocked).unwrap();
    engine.prepare(&claim("x"), &[result(&dev)]).unwrap();
    assert!(blocked.join("ns_claim-x/gpu/metadata.json").is_file());
}

/// Recovery writes a prepared claim's lost metadata again and removes the files of claims the
/// checkpoint does not hold; `migdra cleanup` finds and removes the latter too.
#[test]
fn recovery_repairs_metadata_and_removes_stale_files() {
    let node = Node::new("h100-80gb:1");
    let model = catalog::model("h100-80gb").unwrap();
    let dev = mig_name(node.minor(0), model, 9, 4);
    node.engine().prepare(&claim("a"), &[result(&dev)]).unwrap();
    let file = node.metadata_file("claim-a", "gpu");
    let written = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    let stale = node.metadata_file("gone", "gpu");
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    std::fs::write(&stale, "{}").unwrap();

    let report = node.engine().recover().unwrap();
    assert_eq!(report.stale_metadata_removed, ["ns/gone"]);
    assert_eq!(report.repaired_cdi_specs, [("a".to_string(), "missing")]);
    assert_eq!(std::fs::read(&file).unwrap(), written);
    assert!(!node.metadata_dir().join("ns_gone").exists());

    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    std::fs::write(&stale, "{}").unwrap();
    std::fs::write(&file, "{}").unwrap();
    let engine = node.engine();
    let dry = engine.cleanup(true).unwrap();
    assert_eq!(dry.stale_metadata.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["gone"]);
    assert_eq!(dry.broken_cdi_specs[0].problem, "metadata altered");
    let done = engine.cleanup(false).unwrap();
    assert_eq!(done.stale_metadata[0].outcome.action, "removed");
    assert!(!node.metadata_dir().join("ns_gone").exists());
    assert_eq!(std::fs::read(&file).unwrap(), written);
}

// === Admin access ===

fn admin(device: &str) -> AllocationResult {
    AllocationResult { request: "monitor".into(), admin_access: Some(true), ..result(device) }
}

/// (path, minor) of every device node in the spec device a CDI ID names, and its environment.
fn spec_device(node: &Node, uid: &str, cdi_id: &str) -> (Vec<(String, Option<u64>)>, Vec<String>) {
    let path = node.dir.path().join(format!("cdi/{DRIVER}-claim_{uid}.json"));
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let name = cdi_id.split_once('=').unwrap().1;
    let dev = spec["devices"].as_array().unwrap().iter().find(|d| d["name"] == name).expect("CDI ID resolves");
    let nodes = dev["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["path"].as_str().unwrap().to_string(), n["minor"].as_u64()))
        .collect();
    let env = dev["containerEdits"]["env"].as_array().unwrap().iter().map(|e| e.as_str().unwrap().into()).collect();
    (nodes, env)
}

/// The checkpoint's claims holding instances, and its admin-access claims.
fn keys(cp: &migdra::state::Checkpoint) -> (Vec<&str>, Vec<&str>) {
    (cp.claims.keys().map(String::as_str).collect(), cp.admin.keys().map(String::as_str).collect())
}

fn caps(nodes: &[(String, Option<u64>)]) -> BTreeSet<(String, Option<u64>)> {
    nodes.iter().filter(|(p, _)| p.starts_with("/dev/nvidia-caps/")).cloned().collect()
}

/// A monitoring claim (`adminAccess: true`) sees the GPU and every instance on it, and creates,
/// destroys and reserves nothing: its allocated partition stays free for a real claim, the
/// checkpoint's claims do not include it, and its unprepare leaves every instance in place.
#[test]
fn admin_access_sees_every_instance_and_creates_destroys_and_reserves_nothing() {
    let node = Node::new("h100-80gb:1,a100-40gb:1:mig-off");
    let engine = node.engine();
    let model = catalog::model("h100-80gb").unwrap();
    let (h100, a100) = (node.minor(0), node.minor(1));
    let worker = engine.prepare(&claim("w"), &[result(&mig_name(h100, model, 9, 4))]).unwrap();
    let worker_caps = caps(&spec_device(&node, "w", &worker[0].cdi_ids[0]).0);
    let before = node.instances();

    // Allocated a 1g.10gb partition that does not exist: nothing is made for it.
    let watched = mig_name(h100, model, 19, 0);
    let out = engine.prepare(&claim("m"), &[admin(&watched)]).unwrap();
    assert_eq!(node.instances(), before, "no instance created or destroyed");
    let (nodes, env) = spec_device(&node, "m", &out[0].cdi_ids[0]);
    assert!(nodes.iter().any(|(p, _)| *p == format!("/dev/nvidia{h100}")), "{nodes:?}");
    assert_eq!(caps(&nodes), worker_caps, "the existing instance's capability nodes");
    assert!(env.contains(&format!("NVIDIA_VISIBLE_DEVICES={}", node.uuid(0))), "{env:?}");
    assert!(env.contains(&"MIGDRA_ADMIN_ACCESS=true".to_string()), "{env:?}");
    let status = &out[0].status;
    assert!(status.admin_access && status.mig_uuid.is_none() && status.placement.is_none(), "{status:?}");
    assert_eq!((status.slurm_shards, status.parent_uuid.as_str()), (0, node.uuid(0).as_str()));
    let cp = engine.checkpoint().unwrap();
    assert_eq!(keys(&cp), (vec!["w"], vec!["m"]));
    assert_eq!(cp.mig_records().count(), 1, "the admin claim holds no partition");

    // Not reserved: a real claim gets the same partition; the admin spec shows it from the next
    // prepare on (the kubelet asks again when the monitoring pod's containers start).
    engine.prepare(&claim("x"), &[result(&watched)]).unwrap();
    assert_eq!(node.instances().len(), 2);
    let again = engine.prepare(&claim("m"), &[admin(&watched)]).unwrap();
    assert_eq!(caps(&spec_device(&node, "m", &again[0].cdi_ids[0]).0).len(), 4, "both instances, GI and CI each");

    // A whole GPU, in use by another claim, and the whole-GPU name of a MIG GPU: both allowed.
    engine.prepare(&claim("full"), &[result(&format!("gpu-{a100}"))]).unwrap();
    let whole = engine.prepare(&claim("m2"), &[admin(&format!("gpu-{a100}")), admin(&format!("gpu-{h100}"))]).unwrap();
    let (a100_nodes, _) = spec_device(&node, "m2", &whole[0].cdi_ids[0]);
    assert!(caps(&a100_nodes).is_empty() && a100_nodes.iter().any(|(p, _)| *p == format!("/dev/nvidia{a100}")));
    assert_eq!(caps(&spec_device(&node, "m2", &whole[1].cdi_ids[0]).0).len(), 4);

    let files = node.cdi_files();
    engine.unprepare("m").unwrap();
    engine.unprepare("m2").unwrap();
    assert_eq!(node.instances().len(), 2, "unprepare destroys nothing");
    assert_eq!(node.cdi_files(), files - 2, "only the admin specs went");
    assert!(engine.checkpoint().unwrap().admin.is_empty());
    for uid in ["w", "x", "full"] {
        engine.unprepare(uid).unwrap();
    }
    assert!(node.instances().is_empty() && node.cdi_files() == 0 && node.metadata_claims() == 0);
}

/// What migdra refuses of admin access, each in one line with nothing left behind. A claim the
/// API server should have refused (no namespace label) is not among them: the label is the API
/// server's to check, and migdra prepares what the allocation says.
#[test]
fn bad_admin_input_is_refused_in_one_line_and_leaves_nothing() {
    let node = Node::new("h100-80gb:1");
    let engine = node.engine();
    let model = catalog::model("h100-80gb").unwrap();
    let m = node.minor(0);
    let held = mig_name(m, model, 9, 0);
    engine.prepare(&claim("w"), &[result(&held)]).unwrap();
    let free = mig_name(m, model, 19, 4);
    let cases: Vec<(&str, Vec<AllocationResult>, &str)> = vec![
        (
            "mixed",
            vec![admin(&free), result(&mig_name(m, model, 19, 5))],
            "put admin-access requests in a claim of their own",
        ),
        ("no-gpu", vec![admin("gpu-77")], "minor 77"),
        ("malformed", vec![admin("gpu-0-mig-3g40gb")], "gpu-0-mig-3g40gb"),
        ("w", vec![admin(&held)], "admin access"),
    ];
    let before = node.instances();
    for (uid, results, needle) in cases {
        let err = engine.prepare(&claim(uid), &results).expect_err(uid).to_string();
        assert!(err.contains(needle) && !err.contains('\n'), "{uid}: {err}");
        assert_eq!(node.instances(), before, "{uid}");
        assert!(!engine.checkpoint().unwrap().admin.contains_key(uid), "{uid}");
    }
    assert_eq!(node.cdi_files(), 1, "the worker's spec alone");
    engine.prepare(&claim("m"), &[admin(&free)]).unwrap();
    let err = engine.prepare(&claim("m"), &[result(&free)]).unwrap_err();
    assert!(matches!(err, PrepareError::AllocationChanged { .. }), "{err}");
    assert_eq!(node.instances(), before);

    // NVML failing while the instances are listed: refused, nothing written.
    node.sim.add_fault(Fault::parse("list-ci=unknown:1").unwrap()).unwrap();
    let err = engine.prepare(&claim("f"), &[admin(&free)]).unwrap_err().to_string();
    assert!(err.contains("ns/claim-f") && err.contains("list compute instances"), "{err}");
    assert!(!engine.checkpoint().unwrap().admin.contains_key("f"));
    assert_eq!(node.cdi_files(), 2);
}

/// An admin claim in the checkpoint through a crash at each of its steps, a restart, a reboot
/// and a lost checkpoint: recovery never counts it, never sweeps or keeps an instance for it,
/// never touches the instances it watches, and the kubelet's retry converges.
#[test]
fn an_admin_claim_survives_crashes_reboots_and_a_lost_checkpoint() {
    quiet_crashes();
    let model = catalog::model("h100-80gb").unwrap();
    for step in [Step::PrepareStarted, Step::CdiWritten, Step::PrepareCompleted, Step::CdiDeleted, Step::ClaimDropped] {
        let node = Node::new("h100-80gb:1");
        let m = node.minor(0);
        node.engine().prepare(&claim("w"), &[result(&mig_name(m, model, 9, 4))]).unwrap();
        let before = node.instances();
        let watched = mig_name(m, model, 19, 0);
        let crashing = node.engine().with_hook(Arc::new(move |s| {
            if s == step {
                panic!("crash at {}", s.name());
            }
        }));
        let unprepare_phase = matches!(step, Step::CdiDeleted | Step::ClaimDropped);
        if unprepare_phase {
            crashing.prepare(&claim("m"), &[admin(&watched)]).unwrap_or_else(|_| panic!("{}", step.name()));
        }
        let crashed = catch_unwind(AssertUnwindSafe(|| {
            if unprepare_phase {
                let _ = crashing.unprepare("m");
            } else {
                let _ = crashing.prepare(&claim("m"), &[admin(&watched)]);
            }
        }));
        assert!(crashed.is_err(), "{} reached", step.name());
        drop(crashing);

        let engine = node.engine();
        let report = engine.recover().unwrap();
        assert!(report.orphans.is_empty(), "{}: {:?}", step.name(), report.orphans);
        assert_eq!(node.instances(), before, "{}", step.name());
        let cp = engine.checkpoint().unwrap();
        assert_eq!(cp.claims.keys().collect::<Vec<_>>(), ["w"], "{}", step.name());
        if unprepare_phase {
            engine.unprepare("m").unwrap();
        } else {
            engine.prepare(&claim("m"), &[admin(&watched)]).unwrap();
            engine.unprepare("m").unwrap();
        }
        assert_eq!(node.instances(), before, "{}", step.name());
        assert_eq!(node.cdi_files(), 1, "{}: the worker's spec alone", step.name());
        assert!(engine.checkpoint().unwrap().admin.is_empty());
    }

    // A lost checkpoint is rebuilt with the admin claim apart, by its spec's marker.
    let node = Node::new("h100-80gb:1");
    let m = node.minor(0);
    node.engine().prepare(&claim("w"), &[result(&mig_name(m, model, 9, 4))]).unwrap();
    node.engine().prepare(&claim("m"), &[admin(&mig_name(m, model, 19, 0))]).unwrap();
    std::fs::write(node.dir.path().join("state/checkpoint.json"), b"{}").unwrap();
    let engine = node.engine();
    let report = engine.recover().unwrap();
    assert_eq!((report.checkpoint, report.rebuilt_claims.len()), ("corrupt", 2));
    let cp = engine.checkpoint().unwrap();
    assert_eq!(keys(&cp), (vec!["w"], vec!["m"]));
    assert!(report.orphans.is_empty() && node.instances().len() == 1);

    // A reboot: the worker is marked for re-creation, the admin claim is not; its spec is
    // written again with what exists now (nothing).
    node.sim.reboot().unwrap();
    let engine = node.engine();
    let report = engine.recover().unwrap();
    assert_eq!(report.marked_for_recreate, ["w"]);
    assert!(report.repaired_cdi_specs.iter().any(|(uid, _)| uid == "m"), "{report:?}");
    let cp = engine.checkpoint().unwrap();
    let id = &cp.admin["m"].devices[0].cdi_ids[0];
    assert!(caps(&spec_device(&node, "m", id).0).is_empty());
    engine.unprepare("m").unwrap();
    assert!(node.instances().is_empty());
}

/// The CDI spec write fails after the GPU and compute instances exist (here a file stands where
/// the CDI directory was): the prepare fails with one line naming the path, the instances are
/// destroyed again, and neither the metadata nor the checkpoint keeps the claim. Once the
/// directory is back, the retry works.
#[test]
fn a_cdi_write_failing_after_the_instances_exist_rolls_them_back() {
    let node = Node::new("h100-80gb:1");
    let reached = Arc::new(std::sync::Mutex::new(Vec::new()));
    let engine = node.engine().with_hook(Arc::new({
        let reached = reached.clone();
        move |s| reached.lock().unwrap().push(s)
    }));
    let cdi = node.dir.path().join("cdi");
    if cdi.exists() {
        std::fs::remove_dir_all(&cdi).unwrap();
    }
    std::fs::write(&cdi, "a file where the CDI directory should be").unwrap();
    let model = catalog::model("h100-80gb").unwrap();
    let dev = mig_name(node.minor(0), model, 9, 4);
    let err = engine.prepare(&claim("x"), &[result(&dev)]).unwrap_err().to_string();
    println!("{err}");
    assert!(!err.contains('\n'), "one line: {err}");
    assert!(err.contains(&cdi.display().to_string()), "names the path: {err}");
    let reached = reached.lock().unwrap().clone();
    assert!(reached.contains(&Step::CiCreated) && !reached.contains(&Step::CdiWritten), "{reached:?}");
    assert!(node.instances().is_empty(), "the GPU and compute instances are rolled back");
    assert_eq!(node.metadata_claims(), 0);
    assert!(engine.checkpoint().unwrap().claims.is_empty());
    std::fs::remove_file(&cdi).unwrap();
    std::fs::create_dir(&cdi).unwrap();
    engine.prepare(&claim("x"), &[result(&dev)]).unwrap();
    assert_eq!(node.instances().len(), 1);
    assert_eq!(node.cdi_files(), 1);
}

/// Another process holds the GPU's lock past `lock_timeout`: the prepare fails with one line
/// naming the lock file and the wait, and changes nothing; once the lock is free, the retry works.
#[test]
fn a_gpu_lock_held_past_the_timeout_fails_the_prepare_in_one_line() {
    let node = Node::new("h100-80gb:1");
    let mut opts = node.options();
    opts.lock_timeout = std::time::Duration::from_millis(200);
    let engine = node.engine_with(opts);
    let lock_path = node.dir.path().join("state").join(format!("gpu-{}.lock", node.uuid(0)));
    let holder = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).unwrap();
    holder.lock().unwrap();
    let model = catalog::model("h100-80gb").unwrap();
    let dev = mig_name(node.minor(0), model, 19, 0);
    let started = std::time::Instant::now();
    let err = engine.prepare(&claim("y"), &[result(&dev)]).unwrap_err().to_string();
    println!("{err} (after {:?})", started.elapsed());
    assert!(!err.contains('\n'), "one line: {err}");
    assert!(
        err.contains(&lock_path.display().to_string()) && err.contains("200ms"),
        "names the lock and the wait: {err}"
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(200), "it waited the timeout");
    assert!(node.instances().is_empty());
    assert_eq!((node.cdi_files(), node.metadata_claims()), (0, 0));
    assert!(engine.checkpoint().unwrap().claims.is_empty(), "nothing of the claim is kept");
    holder.unlock().unwrap();
    engine.prepare(&claim("y"), &[result(&dev)]).unwrap();
    assert_eq!(node.instances().len(), 1);
}

/// What the API server says of each claim in the stale-claim test, by UID.
#[derive(Clone, Copy)]
enum Says {
    AllocatedHere,
    Deleted,
    ElsewhereAllocated,
    NotAllocated,
    Recreated,
    Unreachable,
}

struct Answers(std::collections::HashMap<&'static str, Says>);

impl migdra::claims::ClaimSource for Answers {
    fn get(&self, c: &ClaimRef) -> migdra::claims::Result<Option<migdra::claims::Claim>> {
        use migdra::claims::{Claim, ClaimError, Origin};
        let on = |pool: &str| {
            let r = AllocationResult { pool: pool.into(), ..result("gpu-0") };
            Ok(Some(Claim { claim: c.clone(), results: vec![r], pod_claim_name: None }))
        };
        match self.0.get(c.uid.as_str()).copied().unwrap_or(Says::Deleted) {
            Says::AllocatedHere => on(NODE),
            Says::ElsewhereAllocated => on("node-b"),
            Says::Deleted => Ok(None),
            Says::NotAllocated => Err(ClaimError::NotAllocated { claim: c.clone(), origin: Origin::ApiServer }),
            Says::Recreated => Err(ClaimError::Mismatch {
                expected: c.clone(),
                found: Box::new(ClaimRef { uid: "new".into(), ..c.clone() }),
                origin: Origin::ApiServer,
            }),
            Says::Unreachable => Err(ClaimError::Api {
                claim: c.clone(),
                transient: true,
                source: Box::new(std::io::Error::other("connection refused")),
            }),
        }
    }
}

/// A claim left mid-prepare by a crash whose pod went away is rolled back once the API no longer
/// allocates it here; one the API still allocates here, or cannot answer for, and every
/// completed claim, are left for the kubelet.
#[test]
fn claims_left_mid_prepare_are_rolled_back_only_when_the_api_no_longer_allocates_them_here() {
    let node = Node::new("h100-80gb:2");
    let model = catalog::model("h100-80gb").unwrap();
    quiet_crashes();
    // Seven 1g.10gb placements on GPU 0 and GPU 1's first: each claim its own instance.
    let devices: Vec<String> = (0..7).map(|s| mig_name(node.minor(0), model, 19, s)).collect();
    let crash = |uid: &str, dev: &str, at: Step| {
        let crashing = node.engine().with_hook(Arc::new(move |s| {
            if s == at {
                panic!("crash at {}", s.name());
            }
        }));
        assert!(catch_unwind(AssertUnwindSafe(|| crashing.prepare(&claim(uid), &[result(dev)]))).is_err());
    };
    crash("here", &devices[0], Step::CiCreated);
    crash("deleted", &devices[1], Step::CiCreated);
    crash("elsewhere", &devices[2], Step::GiCreated);
    crash("deallocated", &devices[3], Step::PrepareStarted);
    crash("recreated", &devices[4], Step::MetadataWritten);
    crash("unreachable", &devices[5], Step::CdiWritten);
    node.engine().prepare(&claim("completed"), &[result(&devices[6])]).unwrap();
    let engine = node.engine();
    engine.recover().unwrap();
    assert_eq!(
        node.instances().len(),
        6,
        "the crashed claims' instances (one crashed before its GI) and the completed one"
    );

    let answers = Answers(
        [
            ("here", Says::AllocatedHere),
            ("deleted", Says::Deleted),
            ("elsewhere", Says::ElsewhereAllocated),
            ("deallocated", Says::NotAllocated),
            ("recreated", Says::Recreated),
            ("unreachable", Says::Unreachable),
            ("completed", Says::Deleted),
        ]
        .into(),
    );
    let sweep = engine.sweep_stale(&answers).unwrap();
    assert_eq!(sweep.checked, 6, "every claim left mid-prepare, no completed one");
    let mut stale: Vec<(&str, &str)> = sweep.stale.iter().map(|s| (s.claim.uid.as_str(), s.reason.as_str())).collect();
    stale.sort_unstable();
    assert_eq!(
        stale,
        [
            ("deallocated", "deallocated"),
            ("deleted", "deleted"),
            ("elsewhere", "allocated-elsewhere"),
            ("recreated", "replaced")
        ]
    );
    assert!(sweep.stale.iter().all(|s| s.rollback.is_ok()), "{:?}", sweep.stale);
    let unknown: Vec<&str> = sweep.unknown.iter().map(|(c, _)| c.uid.as_str()).collect();
    assert_eq!(unknown, ["unreachable"]);

    // Left: the claim allocated here, the unanswered one, the completed one; their instances,
    // specs and metadata only.
    let cp = engine.checkpoint().unwrap();
    let left: Vec<&str> = cp.claims.keys().map(String::as_str).collect();
    assert_eq!(left, ["completed", "here", "unreachable"]);
    let gis: BTreeSet<u32> = node.instances().iter().map(|(_, gi, _)| gi.start).collect();
    assert_eq!(gis, BTreeSet::from([0, 5, 6]), "instances of here, unreachable and completed");
    assert_eq!(node.cdi_files(), 2, "the completed claim's spec and the one written before the crash");
    assert_eq!(node.metadata_claims(), 2, "the same two claims' metadata");

    // The kubelet's retry of the claim still allocated here adopts its instance.
    let out = engine.prepare(&claim("here"), &[result(&devices[0])]).unwrap();
    assert!(out[0].status.mig_uuid.is_some());
    assert_eq!(node.instances().len(), 3);
    // A second sweep finds nothing more to do.
    let again = engine.sweep_stale(&answers).unwrap();
    assert_eq!((again.checked, again.stale.len()), (1, 0), "only the unanswered claim is asked about again");
}

/// A GPU lost after a claim was prepared on it: the claim's unprepare completes (the GPU's reset
/// takes the instance, which NVML can no longer reach), a prepare on it fails in one line and
/// leaves nothing, and the other GPU goes on working.
#[test]
fn a_gpu_lost_at_run_time_lets_unprepare_complete_and_fails_prepares_on_it_in_one_line() {
    let node = Node::new("h100-80gb:2");
    let engine = node.engine();
    let model = catalog::model("h100-80gb").unwrap();
    engine.prepare(&claim("on-lost"), &[result(&mig_name(node.minor(1), model, 19, 0))]).unwrap();
    // Every call on GPU 1 now says GPU_IS_LOST, as NVML does for a GPU fallen off the bus.
    for op in ["list-gi", "create-gi", "destroy-gi", "list-ci", "create-ci", "destroy-ci"] {
        node.sim.add_fault(Fault::parse(&format!("{op}=gpu-is-lost#1")).unwrap()).unwrap();
    }
    engine.unprepare("on-lost").unwrap();
    assert!(engine.checkpoint().unwrap().claims.is_empty(), "the claim is not held for ever");
    assert_eq!((node.cdi_files(), node.metadata_claims()), (0, 0));

    let err = engine.prepare(&claim("new"), &[result(&mig_name(node.minor(1), model, 19, 1))]).unwrap_err();
    let line = err.to_string();
    assert!(line.contains("gpu-is-lost") && !line.contains('\n'), "{line}");
    assert!(engine.checkpoint().unwrap().claims.is_empty());
    assert_eq!((node.cdi_files(), node.metadata_claims()), (0, 0));

    let out = engine.prepare(&claim("other"), &[result(&mig_name(node.minor(0), model, 19, 0))]).unwrap();
    assert!(out[0].status.mig_uuid.is_some(), "GPU 0 works on");
    engine.unprepare("other").unwrap();
}
