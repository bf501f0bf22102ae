//! One conformance suite, two backends: every check runs against the simulator directly
//! (`sim::…`) and against the real NVML backend loaded from the fake libnvidia-ml built from that
//! simulator (`nvml::…`). A check sees a [`Harness`]: the backend under test, and the hardware
//! behind it to change from outside (faults, processes, XIDs, a reboot) and to compare against.
//!
//! What the checks hold both backends to is the `GpuBackend` contract the rest of migdra relies
//! on: discovery equal to the hardware, exact placements, NVML's error codes, MIG UUIDs, health
//! from XIDs, capability minors and the boot ID.

use crate::support::fake_nvml::{FAKE_CAPS_MAJOR, FakeNode};
use migdra::gpu::sim::{Fault, SimBackend, SimSpec};
use migdra::gpu::{GpuBackend, GpuError, GpuInstance, NvmlCode, SIM_CAPS_MAJOR, capability_minors, xid};
use migdra::mig::catalog;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// H100 80GB profile IDs (docs/facts/mig-nvml.md §1.4).
const P1G: u32 = 19;
const P2G: u32 = 14;
const P3G: u32 = 9;
const P4G: u32 = 5;
const P7G: u32 = 0;

/// A backend under test and the hardware behind it.
struct Harness {
    backend: Arc<dyn GpuBackend>,
    /// The same hardware, driven directly.
    hw: SimBackend,
    /// What `caps_major` must report.
    caps_major: u32,
    /// Keeps the fake node's directory and library alive.
    _node: Option<FakeNode>,
    _dir: Option<tempfile::TempDir>,
}

type Make = fn(&str) -> Harness;

/// The simulator, backed by a state file a second handle shares.
fn sim(spec: &str) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpus.json");
    let backend = SimBackend::open(&path, Some(&SimSpec::parse(spec).unwrap())).unwrap();
    let hw = SimBackend::open(&path, None).unwrap();
    Harness { backend: Arc::new(backend), hw, caps_major: SIM_CAPS_MAJOR, _node: None, _dir: Some(dir) }
}

/// The NVML backend on the fake library, watching XID events like the daemon does.
fn nvml(spec: &str) -> Harness {
    let node = FakeNode::new(spec);
    let backend = node.open(true);
    let hw = SimBackend::open(&node.state, None).unwrap();
    Harness { backend: Arc::new(backend), hw, caps_major: FAKE_CAPS_MAJOR, _node: Some(node), _dir: None }
}

/// Each check as a test against both backends.
macro_rules! conformance {
    ($($check:ident),* $(,)?) => {
        mod sim {
            $( #[test] fn $check() { super::$check(super::sim) } )*
        }
        mod nvml {
            $( #[test] fn $check() { super::$check(super::nvml) } )*
        }
    };
}

conformance!(
    discovery_reports_the_hardware,
    models_are_the_catalogs,
    every_placement_of_every_profile_is_created_exactly,
    refusals_carry_nvmls_codes,
    compute_instances_carry_stable_mig_uuids,
    busy_instances_are_in_use,
    injected_faults_surface_with_their_code_and_change_nothing,
    critical_xids_make_devices_unhealthy,
    a_reboot_clears_instances_and_changes_the_boot_id,
    capability_minors_and_the_caps_major,
    concurrent_creates_never_double_allocate,
);

fn code<T: std::fmt::Debug>(r: Result<T, GpuError>) -> NvmlCode {
    match r {
        Err(e) => e.code().unwrap_or_else(|| panic!("expected an NVML error, got {e:?}")),
        Ok(v) => panic!("expected an NVML error, got {v:?}"),
    }
}

fn uuid(h: &Harness, index: usize) -> String {
    h.hw.gpus().unwrap()[index].uuid.clone()
}

/// Poll until `f` holds (event delivery is asynchronous on real hardware).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Discovery equals the hardware, field by field: index order, minors that are not indexes,
/// UUIDs, PCI bus IDs, names, memory, MIG mode, driver and CUDA versions, compute capability.
fn discovery_reports_the_hardware(make: Make) {
    let h = make("h100-80gb:2,a100-40gb:1:mig-off,a30-24gb:1");
    let got = h.backend.gpus().unwrap();
    assert_eq!(got, h.hw.gpus().unwrap());
    assert_eq!(got.len(), 4);
    assert_eq!(got.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_ne!(got[0].minor, got[0].index, "minors are not indexes");
    assert!(got.iter().all(|g| g.uuid.starts_with("GPU-") && g.healthy));
    assert_eq!(got.iter().map(|g| g.mig_enabled).collect::<Vec<_>>(), [true, true, false, true]);
    assert_eq!(got[0].product_name, "NVIDIA H100 80GB HBM3");
    assert_eq!(got[0].cuda_compute_capability, (9, 0));
    assert_eq!((got[0].driver_version.as_str(), got[0].cuda_driver_version.as_str()), ("580.95.05", "13.0"));
    assert_eq!(got[2].model, "a100-40gb");
    assert!(got[1].pci_bus_id.starts_with("00000000:"), "{}", got[1].pci_bus_id);
    // GPUs are named by UUID, in any case, or by NVML index.
    assert_eq!(h.backend.model(&got[1].uuid.to_lowercase()).unwrap().key, "h100-80gb");
    assert_eq!(h.backend.model("3").unwrap().key, "a30-24gb");
    assert!(matches!(h.backend.model("GPU-nope"), Err(GpuError::UnknownGpu(_))));
    assert!(matches!(h.backend.gpu_instances("9"), Err(GpuError::UnknownGpu(_))));
    assert!(!h.backend.boot_id().unwrap().is_empty());
    assert_eq!(h.backend.boot_id().unwrap(), h.hw.boot_id().unwrap());
}

/// Each GPU's model is its catalog model, MIG on or off.
fn models_are_the_catalogs(make: Make) {
    let h = make("h100-80gb:1,a100-40gb:1:mig-off,rtx-pro-6000:1,b200-180gb:1");
    for g in h.backend.gpus().unwrap() {
        let want = catalog::model(&g.model).unwrap();
        assert_eq!(&h.backend.model(&g.uuid).unwrap(), want, "{}", g.model);
    }
}

/// Every profile at every placement the catalog lists is created there, with its size, and
/// listed; then destroyed.
fn every_placement_of_every_profile_is_created_exactly(make: Make) {
    let h = make("h100-80gb:1,a30-24gb:1");
    for g in h.backend.gpus().unwrap() {
        let model = h.backend.model(&g.uuid).unwrap();
        for p in &model.profiles {
            for &start in &p.placements {
                let gi = h.backend.create_gpu_instance(&g.uuid, p.id, start).unwrap();
                let want = GpuInstance { id: gi.id, profile_id: p.id, start, size: p.memory_slices, healthy: true };
                assert_eq!(gi, want, "{} {} at {start}", model.key, p.name);
                assert_eq!(h.backend.gpu_instances(&g.uuid).unwrap(), vec![want]);
                let hw = h.hw.gpu_instances(&g.uuid).unwrap();
                assert_eq!((hw[0].id, hw[0].start), (gi.id, start), "the hardware agrees");
                h.backend.destroy_gpu_instance(&g.uuid, gi.id).unwrap();
                assert!(h.backend.gpu_instances(&g.uuid).unwrap().is_empty());
            }
        }
    }
    // A mix on one GPU is listed by GI ID, whatever the order of creation.
    let gpu = uuid(&h, 0);
    for (p, s) in [(P3G, 4), (P1G, 0), (P2G, 2)] {
        h.backend.create_gpu_instance(&gpu, p, s).unwrap();
    }
    let listed = h.backend.gpu_instances(&gpu).unwrap();
    assert_eq!(listed, h.hw.gpu_instances(&gpu).unwrap());
    assert!(listed.windows(2).all(|w| w[0].id < w[1].id));
}

/// Overlaps, bad placements, unknown profiles, MIG off and missing instances fail with the code
/// NVML gives, and change nothing.
fn refusals_carry_nvmls_codes(make: Make) {
    let h = make("h100-80gb:1,a100-40gb:1:mig-off");
    let (gpu, off) = (uuid(&h, 0), uuid(&h, 1));
    let gi = h.backend.create_gpu_instance(&gpu, P3G, 4).unwrap();
    let before = h.hw.state().unwrap();
    assert_eq!(code(h.backend.create_gpu_instance(&gpu, P7G, 0)), NvmlCode::InsufficientResources);
    assert_eq!(code(h.backend.create_gpu_instance(&gpu, P1G, 5)), NvmlCode::InsufficientResources);
    assert_eq!(code(h.backend.create_gpu_instance(&gpu, P3G, 1)), NvmlCode::InvalidArgument, "not a placement");
    assert_eq!(code(h.backend.create_gpu_instance(&gpu, 77, 0)), NvmlCode::InvalidArgument, "no such profile");
    assert_eq!(code(h.backend.create_gpu_instance(&off, P7G, 0)), NvmlCode::NotSupported, "MIG off");
    assert_eq!(code(h.backend.gpu_instances(&off)), NvmlCode::NotSupported);
    assert_eq!(code(h.backend.destroy_gpu_instance(&gpu, gi.id + 1)), NvmlCode::NotFound);
    assert_eq!(code(h.backend.compute_instances(&gpu, gi.id + 1)), NvmlCode::NotFound);
    assert_eq!(code(h.backend.destroy_compute_instance(&gpu, gi.id, 3)), NvmlCode::NotFound);
    assert_eq!(code(h.backend.create_compute_instance(&gpu, gi.id, 7)), NvmlCode::InvalidArgument);
    assert_eq!(h.hw.state().unwrap(), before);
}

/// A CI carries a MIG UUID that stays the same while it lives; smaller CIs share a GI up to their
/// count; the default CI fills it.
fn compute_instances_carry_stable_mig_uuids(make: Make) {
    let h = make("h100-80gb:1");
    let gpu = uuid(&h, 0);
    let gi = h.backend.create_gpu_instance(&gpu, P3G, 0).unwrap();
    let a = h.backend.create_compute_instance(&gpu, gi.id, 0).unwrap();
    let b = h.backend.create_compute_instance(&gpu, gi.id, 0).unwrap();
    let c = h.backend.create_compute_instance(&gpu, gi.id, 0).unwrap();
    assert_eq!(code(h.backend.create_compute_instance(&gpu, gi.id, 0)), NvmlCode::InsufficientResources);
    for ci in [&a, &b, &c] {
        let u: Vec<&str> = ci.uuid.split('-').collect();
        assert_eq!(u[0], "MIG");
        assert!(u[3].starts_with('5'), "UUID version 5 like every MIG UUID seen: {}", ci.uuid);
        assert_eq!((ci.gi_id, ci.profile_id, ci.size), (gi.id, 0, 1));
    }
    assert_eq!([a.start, b.start, c.start], [0, 1, 2]);
    let listed = h.backend.compute_instances(&gpu, gi.id).unwrap();
    assert_eq!(listed, vec![a.clone(), b.clone(), c.clone()]);
    assert_eq!(listed, h.hw.compute_instances(&gpu, gi.id).unwrap());
    h.backend.destroy_compute_instance(&gpu, gi.id, b.id).unwrap();
    assert_eq!(h.backend.compute_instances(&gpu, gi.id).unwrap(), vec![a.clone(), c.clone()]);
    for ci in [&a, &c] {
        h.backend.destroy_compute_instance(&gpu, gi.id, ci.id).unwrap();
    }
    let full = h.backend.create_compute_instance(&gpu, gi.id, 2).unwrap();
    assert_eq!((full.start, full.size), (0, 3));
    assert_eq!(h.backend.compute_instances(&gpu, gi.id).unwrap(), vec![full]);
}

/// A GI with a CI, and a CI with a process, are IN_USE until they are not.
fn busy_instances_are_in_use(make: Make) {
    let h = make("h100-80gb:1");
    let gpu = uuid(&h, 0);
    let gi = h.backend.create_gpu_instance(&gpu, P7G, 0).unwrap();
    let ci = h.backend.create_compute_instance(&gpu, gi.id, 4).unwrap();
    assert_eq!(code(h.backend.destroy_gpu_instance(&gpu, gi.id)), NvmlCode::InUse);
    h.hw.add_process(&gpu, gi.id, ci.id).unwrap();
    assert_eq!(code(h.backend.destroy_compute_instance(&gpu, gi.id, ci.id)), NvmlCode::InUse);
    h.hw.clear_processes(&gpu).unwrap();
    h.backend.destroy_compute_instance(&gpu, gi.id, ci.id).unwrap();
    h.backend.destroy_gpu_instance(&gpu, gi.id).unwrap();
    assert!(h.backend.gpu_instances(&gpu).unwrap().is_empty());
}

/// A fault on any operation fails that call with the injected code, as often as it is counted,
/// and leaves the hardware as it was.
fn injected_faults_surface_with_their_code_and_change_nothing(make: Make) {
    let h = make("h100-80gb:2");
    let gpu = uuid(&h, 1);
    let gi = h.backend.create_gpu_instance(&gpu, P4G, 0).unwrap();
    let ci = h.backend.create_compute_instance(&gpu, gi.id, 3).unwrap();
    type Op<'a> = &'a dyn Fn() -> Result<(), GpuError>;
    let cases: [(&str, Op); 7] = [
        ("discover=gpu-is-lost:2", &|| h.backend.gpus().map(drop)),
        ("list-gi=unknown:2", &|| h.backend.gpu_instances(&gpu).map(drop)),
        ("create-gi=insufficient-resources:2", &|| h.backend.create_gpu_instance(&gpu, P2G, 4).map(drop)),
        ("destroy-gi=in-use:2", &|| h.backend.destroy_gpu_instance(&gpu, gi.id)),
        ("list-ci=no-permission:2", &|| h.backend.compute_instances(&gpu, gi.id).map(drop)),
        ("create-ci=argument-version-mismatch:2", &|| h.backend.create_compute_instance(&gpu, gi.id, 3).map(drop)),
        ("destroy-ci=reset-required:2", &|| h.backend.destroy_compute_instance(&gpu, gi.id, ci.id)),
    ];
    for (fault, op) in cases {
        let f = Fault::parse(fault).unwrap();
        let want = match f.action {
            migdra::gpu::sim::FaultAction::Fail(c) => c,
            _ => unreachable!(),
        };
        h.hw.add_fault(f).unwrap();
        let before = h.hw.state().unwrap();
        assert_eq!(code(op()), want, "{fault}: first");
        assert_eq!(code(op()), want, "{fault}: second");
        let mut after = h.hw.state().unwrap();
        assert!(after.faults.is_empty(), "{fault}: counted down to nothing");
        after.faults = before.faults.clone();
        assert_eq!(after, before, "{fault}: the hardware did not change");
    }
    // Faults on another GPU do not touch this one.
    h.hw.add_fault(Fault::parse(&format!("create-gi=in-use#{}", uuid(&h, 0))).unwrap()).unwrap();
    h.backend.create_gpu_instance(&gpu, P2G, 4).unwrap();
    assert_eq!(code(h.backend.create_gpu_instance(&uuid(&h, 0), P2G, 4)), NvmlCode::InUse);
}

/// A critical XID makes its GPU unhealthy, or only its GPU instance when it names one; an XID an
/// application caused changes nothing.
fn critical_xids_make_devices_unhealthy(make: Make) {
    let h = make("h100-80gb:2");
    let (g0, g1) = (uuid(&h, 0), uuid(&h, 1));
    let gi = h.backend.create_gpu_instance(&g1, P3G, 4).unwrap();
    let other = h.backend.create_gpu_instance(&g1, P3G, 0).unwrap();
    h.hw.xid(&g0, None, 13).unwrap();
    h.hw.xid(&g1, Some(gi.id), 48).unwrap();
    eventually("the GI XID is seen", || {
        h.backend.gpu_instances(&g1).unwrap().iter().any(|x| x.id == gi.id && !x.healthy)
    });
    let gis = h.backend.gpu_instances(&g1).unwrap();
    assert!(gis.iter().find(|x| x.id == other.id).unwrap().healthy, "only the GI named");
    let gpus = h.backend.gpus().unwrap();
    assert!(gpus[0].healthy, "XID 13 is the application's fault");
    assert!(gpus[1].healthy, "a GI's XID leaves its GPU healthy");
    h.hw.xid(&g0, None, xid::XID_FALLEN_OFF_BUS).unwrap();
    eventually("GPU 0 is unhealthy", || !h.backend.gpus().unwrap()[0].healthy);
    assert!(h.backend.gpus().unwrap()[1].healthy);
}

/// After a reboot no instance is left and the boot ID differs.
fn a_reboot_clears_instances_and_changes_the_boot_id(make: Make) {
    let h = make("h100-80gb:1");
    let gpu = uuid(&h, 0);
    let boot = h.backend.boot_id().unwrap();
    let gi = h.backend.create_gpu_instance(&gpu, P7G, 0).unwrap();
    h.backend.create_compute_instance(&gpu, gi.id, 4).unwrap();
    h.hw.reboot().unwrap();
    // A booted node's driver starts from nothing; discovery is the first thing anyone asks.
    assert_eq!(h.backend.gpus().unwrap(), h.hw.gpus().unwrap());
    assert!(h.backend.gpu_instances(&gpu).unwrap().is_empty());
    assert_ne!(h.backend.boot_id().unwrap(), boot);
    assert_eq!(h.backend.boot_id().unwrap(), h.hw.boot_id().unwrap());
}

/// The nvidia-caps major, and the GI and CI capability minors of the MIG guide's table, for
/// instances that exist.
fn capability_minors_and_the_caps_major(make: Make) {
    let h = make("h100-80gb:2");
    assert_eq!(h.backend.caps_major().unwrap(), h.caps_major);
    for g in h.backend.gpus().unwrap() {
        let gi = h.backend.create_gpu_instance(&g.uuid, P3G, 4).unwrap();
        let a = h.backend.create_compute_instance(&g.uuid, gi.id, 0).unwrap();
        let b = h.backend.create_compute_instance(&g.uuid, gi.id, 0).unwrap();
        for ci in [a, b] {
            let got = h.backend.mig_capability_minors(g.minor, gi.id, ci.id).unwrap();
            assert_eq!(got, capability_minors(g.minor, gi.id, ci.id), "GPU minor {}", g.minor);
        }
    }
}

/// Eight threads race for every 1g placement: each is won once.
fn concurrent_creates_never_double_allocate(make: Make) {
    let h = make("h100-80gb:1");
    let gpu = uuid(&h, 0);
    let wins = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for start in 0..7 {
                    if h.backend.create_gpu_instance(&gpu, P1G, start).is_ok() {
                        wins.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(wins.into_inner(), 7);
    assert_eq!(h.backend.gpu_instances(&gpu).unwrap().len(), 7);
}
