//! The NVML backend beyond the conformance suite, on the fake libnvidia-ml: `migdra serve` runs
//! the demo day end to end on it; the kubelet's health stream and the CDI specs follow what NVML
//! and the driver's procfs say; read-only commands (what hack/check-device.sh runs on a real GPU)
//! call nothing that changes a GPU; older drivers and GPUs the catalog does not know still work;
//! a node without a driver fails at start with one clear line.

use crate::kubelet::health_until;
use crate::support::claim::Claim;
use crate::support::cluster::complete;
use crate::support::command::{Run, migdra, scrubbed};
use crate::support::eventually::eventually;
use crate::support::fake_apiserver::ApiServer;
use crate::support::fake_nvml::{FAKE_CAPS_MAJOR, FakeNode, library};
use crate::support::{DRIVER, NODE};
use k8s_openapi::api::resource::v1::ResourceSlice;
use migdra::gpu::nvml::NvmlBackend;
use migdra::gpu::nvml::discovery::same_partitions;
use migdra::gpu::{GpuBackend, GpuError, capability_minors};
use migdra::kubelet::client::Version;
use migdra::kubelet::proto::health_v1::HealthStatus;
use migdra::mig::catalog;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// NVML calls that change the hardware or its MIG mode.
const MUTATING: [&str; 5] = [
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceDestroy",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy",
    "nvmlDeviceSetMigMode",
];

/// `--driver-root` without `--nvml-lib`, as the chart runs it: the real dlopen of the fake
/// libnvidia-ml found under the driver root in this architecture's multiarch directory, ahead of
/// a broken `usr/lib` copy that would fail if it were taken.
#[test]
fn the_driver_root_finds_this_architectures_library() {
    let fake = FakeNode::new("h100-80gb:2");
    let root = fake.node.path().join("driver-root");
    let dir = root.join(format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH));
    std::fs::create_dir_all(&dir).unwrap();
    let libdir = fake.lib.parent().unwrap();
    for file in ["libnvidia-ml.so.1", "fake-nvml.conf"] {
        std::fs::copy(libdir.join(file), dir.join(file)).unwrap();
    }
    std::fs::create_dir_all(root.join("usr/lib")).unwrap();
    std::fs::write(root.join("usr/lib/libnvidia-ml.so.1"), "not a library").unwrap();
    let layout = migdra()
        .args(["layout", "-o", "json", "--driver-root"])
        .arg(&root)
        .arg("--procfs-root")
        .arg(&fake.procfs)
        .json();
    let uuids: Vec<String> = fake.hw.gpus().unwrap().into_iter().map(|g| g.uuid).collect();
    let seen: Vec<&str> = layout["gpus"].as_array().unwrap().iter().map(|g| g["uuid"].as_str().unwrap()).collect();
    assert_eq!(seen, uuids, "{layout}");

    // Nothing under the root: one line naming every path tried.
    let empty = fake.node.path().join("empty-root");
    std::fs::create_dir_all(&empty).unwrap();
    let out = migdra().args(["layout", "--driver-root"]).arg(&empty).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.trim().lines().count() == 1, "{err}");
    assert!(err.contains(&format!("{}/usr/lib64/libnvidia-ml.so.1", empty.display())), "{err}");
}

/// The demo's day — notebooks arriving and leaving, a 7g job waiting for a GPU, a whole GPU with
/// MIG off — with `migdra serve` on the NVML backend: every instance is made and destroyed through
/// the fake libnvidia-ml, and MIG mode is never touched.
#[test]
fn serve_on_nvml_runs_the_demo_day_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let text = migdra().args(["demo", "--fast", "--fake-nvml"]).arg(library()).env("FAKE_NVML_TRACE", &trace).ok();
    assert!(text.contains("behind the NVML backend"), "{text}");
    assert!(text.contains("kubelet: registered mig.slinky.slurm.net (DRAPlugin)"), "{text}");
    assert!(text.contains("no 7g.80gb fits anywhere now; erin waits"), "{text}");
    assert!(text.contains("mig-7g80gb-0-0"), "the 7g job gets a GPU once one empties");
    assert!(text.contains("whole GPU: frank"), "a whole GPU with MIG off");
    assert!(text.contains("Slurm GPU index") && text.contains("MIG-"));
    assert!(text.contains("node is empty again: 0 MIG instances left"), "{text}");
    assert!(text.contains("exited with exit status: 0"), "{text}");

    let calls = std::fs::read_to_string(&trace).unwrap();
    let count = |name: &str| calls.lines().filter(|l| *l == name).count();
    // alice, bob, carol, dave, erin, greg: six instances, each made and destroyed through NVML.
    assert_eq!(count("nvmlDeviceCreateGpuInstanceWithPlacement"), 6, "GIs created through NVML");
    assert_eq!(count("nvmlGpuInstanceCreateComputeInstance"), 6);
    assert_eq!(count("nvmlComputeInstanceDestroy"), 6);
    assert_eq!(count("nvmlGpuInstanceDestroy"), 6);
    assert!(count("nvmlEventSetWait_v2") > 0, "the daemon watches XID events");
    assert_eq!(count("nvmlDeviceSetMigMode"), 0, "MIG mode is never changed");
}

/// `migdra serve` on NVML: a prepared claim's CDI spec carries the capability nodes the driver's
/// procfs names (its own major, not the simulator's), and an XID from the hardware reaches the
/// kubelet's health stream: the GPU's devices turn unhealthy, the others stay healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_nvml_reports_capabilities_from_procfs_and_health_from_xids() {
    let node = FakeNode::new("h100-80gb:2");
    let gpus = node.hw.gpus().unwrap();
    let device = format!("gpu-{}-mig-3g40gb-9-4", gpus[1].minor);
    let uid = "0d6f6a52-3c9e-4b8e-9a0c-000000000001";
    let claim = Claim::new(uid).named("c1").in_namespace("ns").device(NODE, &device);
    node.node.write(&claim);
    let (_daemon, kubelet) = node.node.serve().registered().await;
    let claim = claim.reference();
    let prepared = kubelet.prepare(Version::V1, std::slice::from_ref(&claim)).await.unwrap();
    assert!(matches!(prepared.get(uid), Some(Ok(d)) if d.len() == 1), "{prepared:?}");

    let gi = node.hw.gpu_instances(&gpus[1].uuid).unwrap()[0].clone();
    let ci = node.hw.compute_instances(&gpus[1].uuid, gi.id).unwrap()[0].clone();
    let (gi_minor, ci_minor) = capability_minors(gpus[1].minor, gi.id, ci.id);
    let spec: Value = serde_json::from_str(&only_file(&node.node.cdi_dir())).unwrap();
    let caps: Vec<(u64, u64)> = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["path"].as_str().unwrap().starts_with("/dev/nvidia-caps/"))
        .map(|n| (n["major"].as_u64().unwrap(), n["minor"].as_u64().unwrap()))
        .collect();
    let major = u64::from(FAKE_CAPS_MAJOR);
    assert_eq!(caps, [(major, u64::from(gi_minor)), (major, u64::from(ci_minor))], "{spec}");
    assert!(spec.to_string().contains(&ci.uuid), "the MIG UUID NVML reported");

    let mut stream = kubelet.watch_health().await.unwrap();
    let gpu0 = format!("gpu-{}", gpus[0].minor);
    node.hw.set_gpu_health(&gpus[0].uuid, false).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.unwrap().unwrap().unwrap();
        let health: Vec<(String, HealthStatus, String)> = msg
            .devices
            .iter()
            .map(|d| {
                let name = d.device.as_ref().unwrap().device_name.clone();
                (name, HealthStatus::try_from(d.health).unwrap(), d.message.clone())
            })
            .collect();
        let sick = |n: &str| n == gpu0 || n.starts_with(&format!("{gpu0}-"));
        // A lost GPU reads as unhealthy at once; the XID's event names why soon after.
        if health.iter().any(|(n, _, why)| sick(n) && why.ends_with("XID 79")) {
            for (n, h, why) in &health {
                let want = if sick(n) { HealthStatus::Unhealthy } else { HealthStatus::Healthy };
                assert_eq!(*h, want, "{n}");
                assert!(!sick(n) || why.ends_with("is unhealthy: XID 79"), "{n}: {why}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "GPU 0 never turned unhealthy: {health:?}");
    }

    // An XID on the claim's instance (contained ECC, the GPU stays on the bus): unhealthy until
    // the operator, having looked, runs `migdra health clear` against the running daemon.
    node.hw.set_instance_health(&gpus[1].uuid, gi.id, false).unwrap();
    let device = device.as_str();
    let is =
        |want: HealthStatus| move |m: &std::collections::BTreeMap<String, HealthStatus>| m.get(device) == Some(&want);
    health_until(&mut stream, "the instance unhealthy", is(HealthStatus::Unhealthy)).await;
    let said = node.node.cli(&["health", "clear", "--gpu", "1"]);
    assert!(said.contains(&gpus[1].uuid), "{said}");
    health_until(&mut stream, "the instance healthy after migdra health clear", is(HealthStatus::Healthy)).await;
    let bad = node.node.command(&["health", "clear", "--gpu", "7"]).output().unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    // GPU 0 fell off the bus above: a new process's NVML no longer lists it.
    let known = format!("--gpu \"7\" is not a GPU of this node; known: 1 ({})", gpus[1].uuid);
    assert!(err.contains(&known) && err.lines().count() == 1, "{err}");
    kubelet.unprepare(Version::V1, &[claim]).await.unwrap();
    assert!(node.hw.gpu_instances(&gpus[1].uuid).unwrap().is_empty(), "unprepare destroyed the instance");
    assert_eq!(node.calls().iter().filter(|c| *c == "nvmlDeviceSetMigMode").count(), 0);
}

/// A device taint's key and value.
type Taint = (String, Option<String>);

/// The same XID through NVML reaches the slices: every device of the GPU gets the
/// `<driver>/xid` taint with the XID NVML's event reported (a lost GPU's `gpu-lost` may come
/// first, as the health stream's message does), the other GPU's devices none; once the GPU is
/// reset and answers again, the taints go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_on_nvml_taints_the_gpu_devices_in_the_slices() {
    let FakeNode { node, hw, .. } = FakeNode::new("h100-80gb:2");
    let api = ApiServer::start().await;
    api.insert(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let kubeconfig = api.kubeconfig(node.path());
    let node = node.kubeconfig(kubeconfig);
    let daemon = node.serve().spawn();
    let gpus = hw.gpus().unwrap();
    let taints = || -> Vec<(String, Vec<Taint>)> {
        let slices: Vec<ResourceSlice> =
            api.list("resourceslices").into_iter().map(|v| serde_json::from_value(v).unwrap()).collect();
        let devices = complete(slices).unwrap_or_default();
        devices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .map(|d| (d.name.clone(), d.taints.iter().flatten().map(|t| (t.key.clone(), t.value.clone())).collect()))
            .collect()
    };
    eventually("the pool published without taints")
        .explain(|| daemon.log_tail())
        .until(|| {
            let t = taints();
            !t.is_empty() && t.iter().all(|(_, t)| t.is_empty())
        })
        .await;
    hw.set_gpu_health(&gpus[0].uuid, false).unwrap();
    let gpu0 = format!("gpu-{}", gpus[0].minor);
    let xid = (format!("{DRIVER}/xid"), Some("79".to_string()));
    eventually("GPU 0's devices tainted with XID 79")
        .within(Duration::from_secs(20))
        .every(Duration::from_millis(50))
        .explain(|| daemon.log_tail())
        .until(|| {
            let t = taints();
            let ok = !t.is_empty()
                && t.iter().all(|(n, t)| {
                    let sick = *n == gpu0 || n.starts_with(&format!("{gpu0}-"));
                    if sick { *t == [xid.clone()] } else { t.is_empty() }
                });
            if ok { Ok(()) } else { Err(format!("{t:?}")) }
        })
        .await;
    // The GPU is reset and answers NVML again: its health and its taint come back, no restart.
    hw.set_gpu_health(&gpus[0].uuid, true).unwrap();
    eventually("GPU 0's taints gone after its reset")
        .within(Duration::from_secs(20))
        .every(Duration::from_millis(50))
        .explain(|| daemon.log_tail())
        .until(|| {
            let t = taints();
            if !t.is_empty() && t.iter().all(|(_, t)| t.is_empty()) { Ok(()) } else { Err(format!("{t:?}")) }
        })
        .await;
    assert!(daemon.log().contains("it was reset; its XID health is cleared"), "{}", daemon.log_tail());
}

/// What hack/check-device.sh runs — `migdra layout` and `migdra slices` on NVML — shows what the
/// simulator itself shows for the same hardware, and calls nothing that changes a GPU.
#[test]
fn read_only_commands_on_nvml_match_the_simulator_and_change_nothing() {
    let node = FakeNode::new("h100-80gb:2,a100-40gb:1:mig-off");
    let gpu = node.hw.gpus().unwrap()[0].uuid.clone();
    let gi = node.hw.create_gpu_instance(&gpu, 9, 4).unwrap();
    node.hw.create_compute_instance(&gpu, gi.id, 2).unwrap();
    let before = node.hw.state().unwrap();
    for args in [
        &["layout", "-o", "json"][..],
        &["layout"],
        &["slices", "-o", "json", "--node-name", NODE],
        &["--mig-mode", "static", "slices", "--node-name", NODE],
    ] {
        let nvml = node.migdra().args(args).ok();
        let sim = migdra().arg("--sim-state").arg(&node.state).args(args).ok();
        assert_eq!(nvml, sim, "migdra {args:?}");
    }
    assert_eq!(node.hw.state().unwrap(), before, "the hardware is as it was");
    let calls = node.calls();
    assert!(calls.iter().any(|c| c == "nvmlDeviceGetGpuInstances"), "it did ask NVML");
    for c in MUTATING {
        assert!(!calls.iter().any(|x| x == c), "a read-only command called {c}");
    }
}

/// hack/check-device.sh, the script for a real GPU machine, runs on the fake library: it shows
/// the GPUs, the instance an administrator made and the slices, and changes nothing.
#[test]
fn the_device_check_script_is_read_only() {
    let node = FakeNode::new("h100-80gb:1,a100-40gb:1:mig-off");
    let gpu = node.hw.gpus().unwrap()[0].uuid.clone();
    let gi = node.hw.create_gpu_instance(&gpu, 9, 4).unwrap();
    let ci = node.hw.create_compute_instance(&gpu, gi.id, 2).unwrap();
    let before = node.hw.state().unwrap();
    let out_dir = node.node.path().join("check");
    let text = scrubbed("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/check-device.sh"))
        .arg(&out_dir)
        .env("MIGDRA", env!("CARGO_BIN_EXE_migdra"))
        .env("MIGDRA_NVML_LIB", &node.lib)
        .env("MIGDRA_PROCFS_ROOT", &node.procfs)
        .env("NODE_NAME", NODE)
        .ok();
    assert!(text.contains(&ci.uuid), "the existing instance: {text}");
    assert!(text.contains(&format!("pool {NODE} of {DRIVER}")), "the slices: {text}");
    assert!(text.contains("nvidia-caps"), "the driver's procfs: {text}");
    // NVML's profile answers beside the catalog, for the GPU with MIG off too.
    assert_eq!(text.matches("NVML confirms the catalog").count(), 2, "profiles --nvml: {text}");
    assert!(text.contains("(NVIDIA A100-SXM4-40GB, MIG disabled), catalog model a100-40gb"), "{text}");
    for f in ["layout.json", "slices.yaml", "slices-static", "profiles-nvml.json"] {
        assert!(out_dir.join(f).exists(), "{f} saved");
    }
    assert_eq!(node.hw.state().unwrap(), before, "the hardware is as it was");
    for c in MUTATING {
        assert!(!node.calls().iter().any(|x| x == c), "the script called {c}");
    }
}

/// A GPU that fell off the bus before migdra started is left out, with no harm to the others;
/// one lost later is still reported, unhealthy, as it was.
#[test]
fn a_lost_gpu_is_left_out_at_start_and_reported_unhealthy_later() {
    let node = FakeNode::new("h100-80gb:3");
    let gpus = node.hw.gpus().unwrap();
    node.hw.set_gpu_health(&gpus[0].uuid, false).unwrap();
    let backend = node.open(false);
    let seen: Vec<String> = backend.gpus().unwrap().into_iter().map(|g| g.uuid).collect();
    assert_eq!(seen, [gpus[1].uuid.clone(), gpus[2].uuid.clone()]);
    backend.create_gpu_instance(&gpus[1].uuid, 0, 0).unwrap();
    node.hw.set_gpu_health(&gpus[2].uuid, false).unwrap();
    let now = backend.gpus().unwrap();
    assert_eq!(now[1].uuid, gpus[2].uuid);
    assert!(now[0].healthy && !now[1].healthy);
    let e = backend.gpu_instances(&gpus[2].uuid).unwrap_err();
    assert_eq!(e.code(), Some(migdra::gpu::NvmlCode::GpuIsLost), "{e}");
}

/// A driver that knows only version 2 of the profile info structs (it rejects version 3) gives
/// the same models.
#[test]
fn an_older_driver_without_v3_profile_info_gives_the_same_models() {
    let node = FakeNode::with("h100-80gb:1,a30-24gb:1,rtx-pro-6000:1", &[("profile-info-version", "2")]);
    let backend = node.open(false);
    for g in backend.gpus().unwrap() {
        assert_eq!(&backend.model(&g.uuid).unwrap(), catalog::model(&g.model).unwrap(), "{}", g.model);
    }
}

/// GPUs whose name and PCI ID the catalog does not know are described from NVML's own profile
/// and placement queries: the same partitions, and they work.
#[test]
fn gpus_the_catalog_does_not_know_are_described_from_nvml() {
    let node = FakeNode::with("h100-80gb:1,b200-180gb:1,a30-24gb:1", &[("unlisted", "1")]);
    let backend = node.open(false);
    let truth = node.hw.gpus().unwrap();
    for (g, t) in backend.gpus().unwrap().iter().zip(&truth) {
        let model = backend.model(&g.uuid).unwrap();
        let catalog = catalog::model(&t.model).unwrap();
        assert!(model.key.starts_with("nvidia-unlisted-"), "{}", model.key);
        assert_eq!(g.model, model.key);
        assert!(same_partitions(&model, catalog), "{} differs from {}", model.key, catalog.key);
        let names: Vec<&str> = model.profiles.iter().map(|p| p.name.as_str()).collect();
        let want: Vec<&str> = catalog.profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, want, "names from NVML's v3 profile info");
        let p = &model.profiles[0];
        let gi = backend.create_gpu_instance(&g.uuid, p.id, p.placements[0]).unwrap();
        let ci = backend.create_compute_instance(&g.uuid, gi.id, p.default_ci().unwrap().id).unwrap();
        assert!(ci.uuid.starts_with("MIG-"));
    }
}

/// Without a driver — no library, a library that is not NVML, a driver that does not load — the
/// backend does not start, and says why in one line.
#[test]
fn a_node_without_a_working_driver_fails_at_start_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let lone = dir.path().join("libnvidia-ml.so.1");
    std::fs::copy(library(), &lone).unwrap();
    // No fake-nvml.conf and no FAKE_NVML_STATE: a driver that is not loaded.
    let out = migdra().arg("--nvml-lib").arg(&lone).arg("layout").run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the NVIDIA kernel driver is not loaded"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let missing = dir.path().join("nothing/libnvidia-ml.so.1");
    let out = migdra().arg("--nvml-lib").arg(&missing).args(["slices", "--node-name", NODE]).run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("failed to load NVML from") && err.contains("--nvml-lib"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // `profiles --nvml` reads NVML, never the simulator's idea of it.
    let out = migdra().args(["--sim", "h100-80gb:1", "profiles", "--nvml"]).run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("this reads NVML, not the simulator"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let node = FakeNode::new("h100-80gb:1");
    let mut opts = node.options(false);
    opts.procfs = migdra::gpu::procfs::Procfs::new(dir.path().join("no-proc"));
    let backend = NvmlBackend::open(&opts).unwrap();
    let e = backend.caps_major().unwrap_err();
    assert!(matches!(e, GpuError::Procfs { .. }) && e.to_string().contains("no-proc/devices"), "{e}");
}

fn only_file(dir: &Path) -> String {
    let files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    std::fs::read_to_string(&files[0]).unwrap()
}
