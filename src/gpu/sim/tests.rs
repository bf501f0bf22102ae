use super::*;
use crate::gpu::{GpuBackend, GpuError, NvmlCode, Result, xid};
use std::fmt;
use std::fs;
use std::time::Duration;
use std::time::Instant;

const H100: u32 = 8; // memory slices
const P1G: u32 = 19; // 1g.10gb
const P2G: u32 = 14; // 2g.20gb
const P3G: u32 = 9; // 3g.40gb
const P4G: u32 = 5; // 4g.40gb
const P7G: u32 = 0; // 7g.80gb

fn spec(s: &str) -> SimSpec {
    SimSpec::parse(s).unwrap()
}

fn sim(s: &str) -> SimBackend {
    SimBackend::in_memory_seeded(&spec(s), 42)
}

fn code<T: fmt::Debug>(r: Result<T>) -> NvmlCode {
    r.unwrap_err().code().expect("an NVML error")
}

fn invalid_msg<T: fmt::Debug>(r: Result<T>) -> String {
    match r.unwrap_err() {
        GpuError::Invalid(m) => m,
        e => panic!("expected Invalid, got {e:?}"),
    }
}

fn hex(s: &str, lens: &[usize]) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == lens.len()
        && parts.iter().zip(lens).all(|(p, n)| p.len() == *n && p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[test]
fn backend_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<SimBackend>();
}

#[test]
fn spec_parses_models_counts_and_mig_off_in_order() {
    let s = spec("h100-80gb:2, H100-80GB:1:mig-off");
    assert_eq!(s.gpus.len(), 3);
    assert!(s.gpus.iter().all(|g| g.model == "h100-80gb"));
    assert_eq!(s.gpus.iter().map(|g| g.mig_enabled).collect::<Vec<_>>(), [true, true, false]);
    assert_eq!(s.to_string(), "h100-80gb:2,h100-80gb:1:mig-off");
    assert_eq!(spec(&s.to_string()), s);
    assert_eq!(s.models().count(), 3);
    assert_eq!(spec("h100-80gb:64").gpus.len(), 64);
}

#[test]
fn spec_errors_name_the_bad_part_and_the_expected_form() {
    let m = invalid_msg(SimSpec::parse("h100-80gb:1,z900-1gb:2"));
    assert!(m.contains("z900-1gb") && m.contains("h100-80gb"), "{m}");
    for (bad, part) in [
        ("h100-80gb", "h100-80gb"),
        ("h100-80gb:0", "h100-80gb:0"),
        ("h100-80gb:65", "h100-80gb:65"),
        ("h100-80gb:two", "h100-80gb:two"),
        ("h100-80gb:1:mig-of", "h100-80gb:1:mig-of"),
        ("h100-80gb:1:mig-off:x", "h100-80gb:1:mig-off:x"),
        ("h100-80gb:1,", "''"),
    ] {
        let m = invalid_msg(SimSpec::parse(bad));
        assert!(m.contains(part) && m.contains("MODEL:COUNT[:mig-off]"), "{bad}: {m}");
        assert!(!m.contains('\n'));
    }
    assert!(invalid_msg(SimSpec::parse("  ")).contains("MODEL:COUNT"));
    assert!(invalid_msg(SimSpec::parse("h100-80gb:40,h100-80gb:40")).contains("80 GPUs"));
}

#[test]
fn identity_minors_differ_from_indexes_and_ids_look_like_nvml() {
    let s = sim("h100-80gb:2,h100-80gb:1:mig-off");
    let gpus = s.gpus().unwrap();
    assert_eq!(gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(gpus.iter().map(|g| g.minor).collect::<Vec<_>>(), [1, 0, 2]);
    let four = sim("h100-80gb:4").gpus().unwrap();
    assert_eq!(four.iter().map(|g| g.minor).collect::<Vec<_>>(), [1, 0, 3, 2]);
    for g in &gpus {
        assert!(g.uuid.starts_with("GPU-") && hex(&g.uuid[4..], &[8, 4, 4, 4, 12]), "{}", g.uuid);
        assert!(g.pci_bus_id.starts_with("00000000:") && g.pci_bus_id.ends_with(":00.0"), "{}", g.pci_bus_id);
        assert_eq!(g.driver_version, DRIVER_VERSION);
        assert_eq!(g.product_name, "NVIDIA H100 80GB HBM3");
        assert_eq!(g.cuda_compute_capability, (9, 0));
        assert!(g.healthy);
    }
    assert!(gpus[0].mig_enabled && !gpus[2].mig_enabled);
    let mut buses: Vec<&str> = gpus.iter().map(|g| g.pci_bus_id.as_str()).collect();
    assert!(buses.windows(2).all(|w| w[0] < w[1]), "NVML index is PCI bus order");
    buses.dedup();
    assert_eq!(buses.len(), 3);
    let mut uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
    uuids.dedup();
    assert_eq!(uuids.len(), 3);
    // Deterministic from the seed; different seeds give different hardware.
    assert_eq!(sim("h100-80gb:2,h100-80gb:1:mig-off").gpus().unwrap(), gpus);
    let other = SimBackend::in_memory_seeded(&spec("h100-80gb:1"), 7).gpus().unwrap();
    assert_ne!(other[0].uuid, gpus[0].uuid);
    // As on an HGX board: a root complex per GPU (the same form sysfs gives), half on each node.
    let eight = sim("h100-80gb:8").gpus().unwrap();
    let roots: std::collections::BTreeSet<_> = eight.iter().map(|g| g.topology.pcie_root.clone().unwrap()).collect();
    assert_eq!(roots.len(), 8, "{roots:?}");
    assert!(roots.iter().all(|r| r.starts_with("pci0000:")), "{roots:?}");
    let nodes: Vec<u32> = eight.iter().map(|g| g.topology.numa_node.unwrap()).collect();
    assert_eq!(nodes, [0, 0, 0, 0, 1, 1, 1, 1]);
    // Many GPUs still get distinct buses.
    let big = SimBackend::in_memory_seeded(&spec("h100-80gb:64"), 1).gpus().unwrap();
    let mut b: Vec<&str> = big.iter().map(|g| g.pci_bus_id.as_str()).collect();
    b.sort();
    b.dedup();
    assert_eq!(b.len(), 64);
}

#[test]
fn gpus_resolve_by_uuid_or_index() {
    let s = sim("h100-80gb:2");
    let uuid = s.gpus().unwrap()[1].uuid.clone();
    assert_eq!(s.resolve(&uuid).unwrap(), 1);
    assert_eq!(s.resolve(&uuid.to_ascii_lowercase()).unwrap(), 1);
    assert_eq!(s.resolve("0").unwrap(), 0);
    assert!(matches!(s.resolve("5"), Err(GpuError::UnknownGpu(_))));
    assert!(matches!(s.resolve("GPU-nope"), Err(GpuError::UnknownGpu(_))));
    let gi = s.create_gpu_instance(&uuid, P7G, 0).unwrap();
    assert_eq!(s.gpu_instances("1").unwrap(), vec![gi]);
    assert!(matches!(s.create_gpu_instance("GPU-nope", P1G, 0), Err(GpuError::UnknownGpu(_))));
    assert_eq!(s.model("1").unwrap().key, "h100-80gb");
}

#[test]
fn overlap_and_busy_gpu_give_insufficient_resources() {
    let s = sim("h100-80gb:1");
    let gi = s.create_gpu_instance("0", P3G, 0).unwrap();
    assert_eq!((gi.profile_id, gi.start, gi.size), (P3G, 0, 4));
    assert_eq!(code(s.create_gpu_instance("0", P4G, 0)), NvmlCode::InsufficientResources);
    assert_eq!(code(s.create_gpu_instance("0", P1G, 1)), NvmlCode::InsufficientResources);
    assert_eq!(code(s.create_gpu_instance("0", P7G, 0)), NvmlCode::InsufficientResources);
    s.create_gpu_instance("0", P3G, 4).unwrap();
    // A third 3g: both placements taken (and the maximum reached).
    assert_eq!(code(s.create_gpu_instance("0", P3G, 4)), NvmlCode::InsufficientResources);
    // Media engines: one +me per GPU.
    let s = sim("h100-80gb:1");
    s.create_gpu_instance("0", 20, 0).unwrap();
    assert_eq!(code(s.create_gpu_instance("0", 20, 1)), NvmlCode::InsufficientResources);
}

#[test]
fn bad_profile_or_placement_gives_invalid_argument() {
    let s = sim("h100-80gb:1");
    assert_eq!(code(s.create_gpu_instance("0", P3G, 2)), NvmlCode::InvalidArgument);
    assert_eq!(code(s.create_gpu_instance("0", P1G, 7)), NvmlCode::InvalidArgument);
    assert_eq!(code(s.create_gpu_instance("0", 99, 0)), NvmlCode::InvalidArgument);
    assert!(s.gpu_instances("0").unwrap().is_empty());
}

#[test]
fn gi_ids_come_from_size_buckets_not_from_placement() {
    for seed in 0..16 {
        let s = SimBackend::in_memory_seeded(&spec("h100-80gb:1"), seed);
        let ids: Vec<u32> = (0..4).map(|start| s.create_gpu_instance("0", P1G, start).unwrap().id).collect();
        let mut d = ids.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), 4, "{ids:?}");
        assert!(ids.iter().all(|id| (7..=14).contains(id)), "{ids:?}");
        let big = s.create_gpu_instance("0", P3G, 4).unwrap().id;
        assert!((1..=2).contains(&big));
    }
    let s = sim("h100-80gb:1");
    assert_eq!(s.create_gpu_instance("0", P7G, 0).unwrap().id, 0);
    let s = sim("h100-80gb:1");
    assert!((3..=6).contains(&s.create_gpu_instance("0", P2G, 2).unwrap().id));
    // Across seeds, placement order does not predict ID order.
    let unordered = (0..32).any(|seed| {
        let s = SimBackend::in_memory_seeded(&spec("h100-80gb:1"), seed);
        let ids: Vec<u32> = (0..4).map(|start| s.create_gpu_instance("0", P1G, start).unwrap().id).collect();
        ids.windows(2).any(|w| w[0] > w[1])
    });
    assert!(unordered);
}

#[test]
fn compute_instances_follow_the_gi_profile() {
    let s = sim("h100-80gb:1");
    let gi = s.create_gpu_instance("0", P3G, 0).unwrap();
    // 3g: CI profiles 0 (1c ×3), 1 (2c ×1), 2 (3g ×1); 3 is a 4g-only profile.
    assert_eq!(code(s.create_compute_instance("0", gi.id, 3)), NvmlCode::InvalidArgument);
    assert_eq!(code(s.create_compute_instance("0", 13, 0)), NvmlCode::NotFound);
    let a = s.create_compute_instance("0", gi.id, 1).unwrap();
    assert_eq!((a.id, a.gi_id, a.start, a.size), (0, gi.id, 0, 2));
    assert!(a.uuid.starts_with("MIG-") && hex(&a.uuid[4..], &[8, 4, 4, 4, 12]), "{}", a.uuid);
    assert_eq!(&a.uuid[18..19], "5", "version nibble: {}", a.uuid);
    assert!("89ab".contains(&a.uuid[23..24]), "variant: {}", a.uuid);
    assert_eq!(code(s.create_compute_instance("0", gi.id, 1)), NvmlCode::InsufficientResources);
    assert_eq!(code(s.create_compute_instance("0", gi.id, 2)), NvmlCode::InsufficientResources);
    let b = s.create_compute_instance("0", gi.id, 0).unwrap();
    assert_eq!((b.id, b.start, b.size), (1, 2, 1));
    assert_eq!(code(s.create_compute_instance("0", gi.id, 0)), NvmlCode::InsufficientResources);
    assert_eq!(s.compute_instances("0", gi.id).unwrap(), vec![a.clone(), b.clone()]);
    // IDs: lowest free; UUIDs stable for an instance's lifetime.
    s.destroy_compute_instance("0", gi.id, 0).unwrap();
    let c = s.create_compute_instance("0", gi.id, 0).unwrap();
    assert_eq!((c.id, c.start), (0, 0));
    assert_ne!(c.uuid, a.uuid);
    assert_eq!(s.compute_instances("0", gi.id).unwrap()[1].uuid, b.uuid);
    assert_eq!(code(s.destroy_compute_instance("0", gi.id, 7)), NvmlCode::NotFound);
    assert_eq!(code(s.compute_instances("0", 13)), NvmlCode::NotFound);
}

#[test]
fn destroying_a_gi_with_a_ci_is_in_use() {
    let s = sim("h100-80gb:1");
    let gi = s.create_gpu_instance("0", P2G, 0).unwrap();
    let ci = s.create_compute_instance("0", gi.id, 1).unwrap();
    assert_eq!(code(s.destroy_gpu_instance("0", gi.id)), NvmlCode::InUse);
    assert_eq!(s.gpu_instances("0").unwrap().len(), 1);
    s.destroy_compute_instance("0", gi.id, ci.id).unwrap();
    s.destroy_gpu_instance("0", gi.id).unwrap();
    assert!(s.gpu_instances("0").unwrap().is_empty());
    assert_eq!(code(s.destroy_gpu_instance("0", gi.id)), NvmlCode::NotFound);
}

#[test]
fn a_process_on_a_ci_makes_its_destroy_in_use() {
    let s = sim("h100-80gb:1");
    let gi = s.create_gpu_instance("0", P1G, 3).unwrap();
    let ci = s.create_compute_instance("0", gi.id, 0).unwrap();
    s.add_process("0", gi.id, ci.id).unwrap();
    assert_eq!(code(s.add_process("0", gi.id, 5)), NvmlCode::NotFound);
    assert_eq!(code(s.destroy_compute_instance("0", gi.id, ci.id)), NvmlCode::InUse);
    assert_eq!(s.state().unwrap().processes.len(), 1);
    s.clear_processes("0").unwrap();
    s.destroy_compute_instance("0", gi.id, ci.id).unwrap();
    s.destroy_gpu_instance("0", gi.id).unwrap();
}

#[test]
fn mig_off_gpus_do_not_support_instances() {
    let s = sim("h100-80gb:1:mig-off");
    assert_eq!(code(s.create_gpu_instance("0", P1G, 0)), NvmlCode::NotSupported);
    assert_eq!(code(s.gpu_instances("0")), NvmlCode::NotSupported);
    assert_eq!(code(s.compute_instances("0", 0)), NvmlCode::NotSupported);
    assert_eq!(code(s.destroy_gpu_instance("0", 0)), NvmlCode::NotSupported);
    assert_eq!(code(s.create_compute_instance("0", 0, 0)), NvmlCode::NotSupported);
    assert_eq!(code(s.destroy_compute_instance("0", 0, 0)), NvmlCode::NotSupported);
    assert_eq!(s.model("0").unwrap().key, "h100-80gb");
}

#[test]
fn health_flags_show_in_discovery_and_state() {
    let s = sim("h100-80gb:2");
    s.set_gpu_health("1", false).unwrap();
    assert_eq!(s.gpus().unwrap().iter().map(|g| g.healthy).collect::<Vec<_>>(), [true, false]);
    let gi = s.create_gpu_instance("0", P7G, 0).unwrap();
    s.set_instance_health("0", gi.id, false).unwrap();
    assert!(!s.state().unwrap().gpus[0].gpu_instances[0].healthy);
    assert_eq!(code(s.set_instance_health("0", 9, false)), NvmlCode::NotFound);
}

#[test]
fn reboot_clears_instances_and_changes_the_boot_id() {
    let s = sim("h100-80gb:2,h100-80gb:1:mig-off");
    let gpus = s.gpus().unwrap();
    let boot = s.boot_id().unwrap();
    let gi = s.create_gpu_instance("1", P4G, 0).unwrap();
    let ci = s.create_compute_instance("1", gi.id, 3).unwrap();
    s.add_process("1", gi.id, ci.id).unwrap();
    s.set_gpu_health("0", false).unwrap();
    s.add_fault(Fault::parse("destroy-gi=in-use").unwrap()).unwrap();
    s.reboot().unwrap();
    assert_ne!(s.boot_id().unwrap(), boot);
    assert!(s.gpu_instances("1").unwrap().is_empty());
    let st = s.state().unwrap();
    assert!(st.processes.is_empty());
    assert_eq!(st.faults.len(), 1, "faults are configuration, they survive");
    // Identity and MIG mode stay; health comes back.
    assert_eq!(s.gpus().unwrap(), gpus);
}

#[test]
fn xids_are_recorded_in_order_and_only_critical_ones_hurt() {
    let s = sim("h100-80gb:2");
    let gi = s.create_gpu_instance("1", P3G, 0).unwrap();
    s.xid("0", None, 13).unwrap();
    assert!(s.gpus().unwrap()[0].healthy, "XID 13 is the application's fault");
    s.xid("1", Some(gi.id), 48).unwrap();
    assert!(s.gpus().unwrap()[1].healthy, "an instance XID leaves the GPU healthy");
    assert!(!s.gpu_instances("1").unwrap()[0].healthy);
    s.set_gpu_health("0", false).unwrap();
    assert!(!s.gpus().unwrap()[0].healthy);
    s.set_gpu_health("0", true).unwrap();
    assert!(s.gpus().unwrap()[0].healthy);
    assert_eq!(s.unhealthy_reason("1", Some(gi.id)).as_deref(), Some("XID 48"));
    assert_eq!(s.unhealthy_reason("0", None).as_deref(), Some("XID 79"));
    assert_eq!(s.unhealthy_reason("1", None), None);
    let st = s.state().unwrap();
    let seen: Vec<(u64, u32, Option<u32>, u64)> = st.xids.iter().map(|x| (x.seq, x.gpu, x.gi, x.xid)).collect();
    assert_eq!(seen, [(1, 0, None, 13), (2, 1, Some(gi.id), 48), (3, 0, None, xid::XID_FALLEN_OFF_BUS)]);
    assert_eq!(code(s.xid("1", Some(9), 48)), NvmlCode::NotFound);
    assert!(matches!(s.xid("5", None, 48), Err(GpuError::UnknownGpu(_))));
    for _ in 0..MAX_XIDS {
        s.xid("0", None, 31).unwrap();
    }
    let st = s.state().unwrap();
    assert_eq!((st.xids.len(), st.xid_seq, st.xids[0].seq), (MAX_XIDS, 3 + MAX_XIDS as u64, 4));
    s.reboot().unwrap();
    let st = s.state().unwrap();
    assert!(st.xids.is_empty());
    assert_eq!(st.xid_seq, 3 + MAX_XIDS as u64, "sequence numbers never repeat");
}

#[test]
fn faults_parse_print_and_reject_bad_input() {
    let f = Fault::parse("create-gi=insufficient-resources:1").unwrap();
    assert_eq!(f.op, SimOp::CreateGi);
    assert_eq!(f.action, FaultAction::Fail(NvmlCode::InsufficientResources));
    assert_eq!(f.remaining, Some(1));
    // The one duration syntax of flags: minutes work here as they do for `--grace`.
    assert_eq!(Fault::parse("create-gi=delay:2m").unwrap().action, FaultAction::Delay(Duration::from_secs(120)));
    let f = Fault::parse("destroy-gi=delay:1s").unwrap();
    assert_eq!((f.action, f.remaining), (FaultAction::Delay(Duration::from_secs(1)), None));
    let f = Fault::parse("create-ci=in-use@0.05").unwrap();
    assert_eq!((f.action, f.probability), (FaultAction::Fail(NvmlCode::InUse), Some(0.05)));
    let f = Fault::parse("list-ci=delay:300ms:2@0.5#GPU-abc").unwrap();
    assert_eq!(f.action, FaultAction::Delay(Duration::from_millis(300)));
    assert_eq!((f.remaining, f.probability, f.gpu.as_deref()), (Some(2), Some(0.5), Some("GPU-abc")));
    let g = Fault::parse("destroy-ci=IN_USE#1@1").unwrap();
    assert_eq!((g.gpu.as_deref(), g.probability), (Some("1"), Some(1.0)));
    for s in ["create-gi=insufficient-resources:1", "list-ci=delay:300ms:2@0.5#GPU-abc", "discover=delay:1500us"] {
        assert_eq!(Fault::parse(s).unwrap().to_string(), s);
    }
    assert_eq!(Fault::parse_list(" create-gi=in-use:1, ,destroy-ci=23 ").unwrap().len(), 2);
    assert!(Fault::parse_list("").unwrap().is_empty());
    for (bad, names) in [
        ("create-gi", "create-gi"),
        ("make-gi=in-use", "make-gi"),
        ("create-gi=on-fire", "on-fire"),
        ("create-gi=in-use:0", "'0'"),
        ("create-gi=in-use:x", "'x'"),
        ("create-gi=in-use:1:2", "create-gi=in-use:1:2"),
        ("create-gi=delay", "duration"),
        ("create-gi=delay:3d", "3d"),
        ("create-gi=in-use@1.5", "PROBABILITY"),
        ("create-gi=in-use#", "GPU"),
        ("discover=in-use#0", "discover"),
    ] {
        let m = invalid_msg(Fault::parse(bad));
        assert!(m.contains(names), "{bad}: {m}");
        assert!(m.contains("create-gi, destroy-gi") && m.contains("insufficient-resources"), "{m}");
        assert!(!m.contains('\n'));
    }
    assert!(Fault::parse_list("create-gi=in-use,bogus").is_err());
}

#[test]
fn counted_faults_fire_that_many_times_then_go_away() {
    let s = sim("h100-80gb:1");
    s.add_fault(Fault::parse("create-gi=in-use:2").unwrap()).unwrap();
    assert_eq!(code(s.create_gpu_instance("0", P1G, 0)), NvmlCode::InUse);
    assert_eq!(s.state().unwrap().faults[0].remaining, Some(1));
    assert_eq!(code(s.create_gpu_instance("0", P1G, 0)), NvmlCode::InUse);
    assert!(s.state().unwrap().faults.is_empty());
    s.create_gpu_instance("0", P1G, 0).unwrap();
    // Other ops and other GPUs are not hit.
    let s = sim("h100-80gb:2");
    s.add_fault(Fault::parse("create-gi=gpu-is-lost#1").unwrap()).unwrap();
    s.create_gpu_instance("0", P7G, 0).unwrap();
    let uuid1 = s.gpus().unwrap()[1].uuid.clone();
    let e = s.create_gpu_instance(&uuid1, P7G, 0).unwrap_err();
    assert_eq!(e.code(), Some(NvmlCode::GpuIsLost));
    assert!(e.to_string().contains(&uuid1), "{e}");
    assert!(matches!(s.add_fault(Fault::parse("create-gi=in-use#7").unwrap()), Err(GpuError::UnknownGpu(_))));
    s.clear_faults().unwrap();
    s.create_gpu_instance(&uuid1, P7G, 0).unwrap();
    // Probability 0 never fires, 1 always does.
    let s = sim("h100-80gb:1");
    s.add_fault(Fault::parse("list-gi=not-found@0").unwrap()).unwrap();
    for _ in 0..20 {
        s.gpu_instances("0").unwrap();
    }
    s.add_fault(Fault::parse("list-gi=unknown:3@1").unwrap()).unwrap();
    assert_eq!(code(s.gpu_instances("0")), NvmlCode::Unknown);
    assert_eq!(s.state().unwrap().faults.len(), 2);
}

#[test]
fn injected_failures_change_nothing() {
    let s = sim("h100-80gb:1");
    let gi = s.create_gpu_instance("0", P2G, 0).unwrap();
    let ci = s.create_compute_instance("0", gi.id, 1).unwrap();
    let faults = "create-gi=insufficient-resources,destroy-gi=in-use,create-ci=unknown,destroy-ci=no-permission";
    for f in Fault::parse_list(faults).unwrap() {
        s.add_fault(f).unwrap();
    }
    let before = s.state().unwrap();
    assert_eq!(code(s.create_gpu_instance("0", P2G, 2)), NvmlCode::InsufficientResources);
    assert_eq!(code(s.destroy_compute_instance("0", gi.id, ci.id)), NvmlCode::NoPermission);
    assert_eq!(code(s.create_compute_instance("0", gi.id, 0)), NvmlCode::Unknown);
    assert_eq!(code(s.destroy_gpu_instance("0", gi.id)), NvmlCode::InUse);
    assert_eq!(s.state().unwrap(), before);
    // Real refusals change nothing either (not even the generator).
    s.clear_faults().unwrap();
    let before = s.state().unwrap();
    assert!(s.create_gpu_instance("0", P3G, 0).is_err());
    assert_eq!(s.state().unwrap(), before);
}

#[test]
fn delays_are_applied() {
    let s = sim("h100-80gb:1").with_env_faults(Some("create-gi=delay:150ms:1")).unwrap();
    let t = Instant::now();
    s.create_gpu_instance("0", P1G, 0).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(150));
    let t = Instant::now();
    s.create_gpu_instance("0", P1G, 1).unwrap();
    assert!(t.elapsed() < Duration::from_millis(150), "the counted delay is used up");
}

#[test]
fn env_faults_are_not_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.json");
    let s =
        SimBackend::open(&path, Some(&spec("h100-80gb:1"))).unwrap().with_env_faults(Some("create-gi=in-use")).unwrap();
    assert_eq!(code(s.create_gpu_instance("0", P1G, 0)), NvmlCode::InUse);
    assert!(s.state().unwrap().faults.is_empty());
    let other = SimBackend::open(&path, None).unwrap();
    other.create_gpu_instance("0", P1G, 0).unwrap();
    assert!(matches!(sim("h100-80gb:1").with_env_faults(Some("create-gi=nope")), Err(GpuError::Invalid(_))));
    assert!(matches!(sim("h100-80gb:1").with_env_faults(Some("create-gi=in-use#3")), Err(GpuError::UnknownGpu(_))));
    assert!(sim("h100-80gb:1").with_env_faults(None).is_ok());
}

#[test]
fn two_opens_of_one_file_see_each_others_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.json");
    let a = SimBackend::open(&path, Some(&spec("h100-80gb:2"))).unwrap();
    let b = SimBackend::open(&path, None).unwrap();
    let c = SimBackend::open(&path, Some(&spec("h100-80gb:2"))).unwrap();
    assert_eq!(a.gpus().unwrap(), b.gpus().unwrap());
    let gi = a.create_gpu_instance("1", P3G, 4).unwrap();
    assert_eq!(b.gpu_instances("1").unwrap(), vec![gi.clone()]);
    let ci = b.create_compute_instance("1", gi.id, 2).unwrap();
    assert_eq!(c.compute_instances("1", gi.id).unwrap(), vec![ci.clone()]);
    b.add_fault(Fault::parse("destroy-ci=in-use:1").unwrap()).unwrap();
    assert_eq!(code(c.destroy_compute_instance("1", gi.id, ci.id)), NvmlCode::InUse);
    a.destroy_compute_instance("1", gi.id, ci.id).unwrap();
    assert_eq!(a.boot_id().unwrap(), c.boot_id().unwrap());
    c.reboot().unwrap();
    assert_eq!(a.boot_id().unwrap(), c.boot_id().unwrap());
    assert!(a.gpu_instances("1").unwrap().is_empty());
    assert_eq!(a.path(), Some(path.as_path()));
}

#[test]
fn read_only_operations_never_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.json");
    let s = SimBackend::open(&path, Some(&spec("h100-80gb:1"))).unwrap();
    s.create_gpu_instance("0", P7G, 0).unwrap();
    let bytes = fs::read(&path).unwrap();
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    s.state().unwrap();
    s.gpus().unwrap();
    s.gpu_instances("0").unwrap();
    s.compute_instances("0", 0).unwrap();
    s.boot_id().unwrap();
    s.model("0").unwrap();
    assert!(s.create_gpu_instance("0", P1G, 0).is_err());
    assert_eq!(fs::read(&path).unwrap(), bytes);
    assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), mtime);
}

#[test]
fn open_needs_a_spec_or_a_matching_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.json");
    let m = invalid_msg(SimBackend::open(&path, None));
    assert!(m.contains("--sim"), "{m}");
    assert!(!path.exists());
    SimBackend::open(&path, Some(&spec("h100-80gb:2"))).unwrap();
    let m = invalid_msg(SimBackend::open(&path, Some(&spec("h100-80gb:3"))));
    assert!(m.contains("h100-80gb:2") && m.contains("h100-80gb:3"), "{m}");
    let m = invalid_msg(SimBackend::open(&path, Some(&spec("h100-80gb:1,h100-80gb:1:mig-off"))));
    assert!(m.contains("mig-off"), "{m}");
    // Unknown fields (from a newer migdra) are tolerated.
    let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    v["future_field"] = serde_json::json!({"x": 1});
    v["gpus"][0]["future"] = serde_json::json!(true);
    fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(SimBackend::open(&path, None).unwrap().gpus().unwrap().len(), 2);
}

#[test]
fn a_corrupt_file_is_reported_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.json");
    for junk in [
        &b"{\"version\": 1, \"gpus\": [tru"[..],
        b"",
        b"{\"version\": 9, \"boot_id\": \"x\", \"seed\": 1, \"counter\": 0, \"gpus\": []}",
    ] {
        fs::write(&path, junk).unwrap();
        for r in
            [SimBackend::open(&path, None).map(|_| ()), SimBackend::open(&path, Some(&spec("h100-80gb:1"))).map(|_| ())]
        {
            match r {
                Err(GpuError::SimState { path: p, reason }) => {
                    assert_eq!(p, path.display().to_string());
                    assert!(reason.contains("delete it") && reason.contains("--sim"), "{reason}");
                }
                other => panic!("expected SimState, got {other:?}"),
            }
        }
        assert_eq!(fs::read(&path).unwrap(), junk);
    }
    // Corrupted under a running simulator: operations fail, nothing is written.
    fs::remove_file(&path).unwrap();
    let s = SimBackend::open(&path, Some(&spec("h100-80gb:1"))).unwrap();
    fs::write(&path, b"garbage").unwrap();
    assert!(matches!(s.create_gpu_instance("0", P7G, 0), Err(GpuError::SimState { .. })));
    assert_eq!(fs::read(&path).unwrap(), b"garbage");
    fs::remove_file(&path).unwrap();
    assert!(matches!(s.gpus(), Err(GpuError::SimState { .. })));
}

#[test]
fn delays_on_different_gpus_overlap_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.json");
    let s = SimBackend::open(&path, Some(&spec("h100-80gb:8"))).unwrap();
    s.add_fault(Fault::parse("create-gi=delay:300ms").unwrap()).unwrap();
    let t = Instant::now();
    std::thread::scope(|scope| {
        for gpu in 0..8 {
            let s = &s;
            scope.spawn(move || s.create_gpu_instance(&gpu.to_string(), P7G, 0).unwrap());
        }
    });
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_millis(1200), "{took:?}");
    let st = s.state().unwrap();
    assert!(st.gpus.iter().all(|g| g.gpu_instances.len() == 1));
    // In memory too.
    let s = SimBackend::in_memory(&spec("h100-80gb:8")).with_env_faults(Some("create-gi=delay:300ms")).unwrap();
    let t = Instant::now();
    std::thread::scope(|scope| {
        for gpu in 0..8 {
            let s = &s;
            scope.spawn(move || s.create_gpu_instance(&gpu.to_string(), P7G, 0).unwrap());
        }
    });
    assert!(t.elapsed() < Duration::from_millis(1200), "{:?}", t.elapsed());
}

#[test]
fn concurrent_creates_from_many_threads_never_double_allocate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.json");
    let s = SimBackend::open(&path, Some(&spec("h100-80gb:1"))).unwrap();
    let other = SimBackend::open(&path, None).unwrap();
    let wins = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|scope| {
        for t in 0..8 {
            let (s, other, wins) = (&s, &other, &wins);
            scope.spawn(move || {
                let b = if t % 2 == 0 { s } else { other };
                for start in 0..H100 - 1 {
                    if b.create_gpu_instance("0", P1G, start).is_ok() {
                        wins.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(wins.into_inner(), 7);
    assert_eq!(s.gpu_instances("0").unwrap().len(), 7);
}

#[test]
fn state_round_trips_through_json() {
    let s = sim("h100-80gb:2");
    let gi = s.create_gpu_instance("0", P4G, 0).unwrap();
    s.create_compute_instance("0", gi.id, 1).unwrap();
    s.add_fault(Fault::parse("create-ci=delay:5ms:3@0.25#1").unwrap()).unwrap();
    let st = s.state().unwrap();
    let json = serde_json::to_string(&st).unwrap();
    assert!(json.contains("\"create-ci=delay:5ms:3@0.25#1\""), "{json}");
    let back: SimState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, st);
    assert!(back.validate().is_ok());
}
