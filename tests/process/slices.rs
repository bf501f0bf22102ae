//! `migdra slices`: what serve would publish for a node of 16 H100s, in both layouts, read back
//! as k8s-openapi ResourceSlices and checked against the API server's rules, plus every partition
//! of every GPU with its counter consumption.

#![allow(clippy::print_stdout)] // the test prints the slice counts per layout

use crate::support::command::Run;
use k8s_openapi::api::resource::v1::ResourceSlice;
use migdra::kube::slices::{self, Layout};
use migdra::mig::catalog::model;
use migdra::mig::counters;
use migdra::mig::naming::DeviceName;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

const SIM: &str = "h100-80gb:16";

/// kubectl's `v1` `List`.
#[derive(Deserialize, Debug, PartialEq)]
struct List {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    items: Vec<ResourceSlice>,
}

fn migdra(dir: &Path, args: &[&str]) -> String {
    let state = dir.join("sim.json");
    crate::support::command::migdra()
        .args(["--sim", SIM, "--sim-state", state.to_str().unwrap(), "--node-name", "node-a"])
        .args(["--state-dir", dir.join("state").to_str().unwrap()])
        .args(args)
        .ok()
}

fn slices(dir: &Path, layout: &str, format: &str) -> Vec<ResourceSlice> {
    let text = migdra(dir, &["slices", "--slice-layout", layout, "-o", format]);
    let list: List = match format {
        "json" => serde_json::from_str(&text).unwrap(),
        _ => serde_norway::from_str(&text).unwrap(),
    };
    assert_eq!((list.api_version.as_str(), list.kind.as_str()), ("v1", "List"));
    list.items
}

#[test]
fn sixteen_h100s_publish_valid_slices_in_both_layouts() {
    let dir = tempfile::tempdir().unwrap();
    // One 3g.40gb instance exists on GPU 0: its device carries the MIG UUID.
    let created: serde_json::Value = serde_json::from_str(&migdra(
        dir.path(),
        &["sim", "create", "--gpu", "0", "--profile", "3g.40gb", "--placement", "4", "-o", "json"],
    ))
    .unwrap();
    let mig_uuid = created["uuid"].as_str().unwrap().to_string();

    let layout_json: serde_json::Value = serde_json::from_str(&migdra(dir.path(), &["layout", "-o", "json"])).unwrap();
    let minors: Vec<u32> =
        layout_json["gpus"].as_array().unwrap().iter().map(|g| g["minor"].as_u64().unwrap() as u32).collect();
    assert_eq!(minors.len(), 16);
    let h100 = model("h100-80gb").unwrap();

    let mut counts = Vec::new();
    for (flag, layout) in [("split", Layout::Split), ("combined", Layout::Combined)] {
        let items = slices(dir.path(), flag, "json");
        assert_eq!(slices::validate(&items, layout), Vec::<String>::new(), "{flag}");
        assert_eq!(slices(dir.path(), flag, "yaml"), items, "{flag}: -o yaml holds the same slices");

        // Every partition of every GPU, exactly once, consuming its share of its GPU's set.
        let mut devices: HashMap<&str, usize> = HashMap::new();
        for d in items.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
            *devices.entry(d.name.as_str()).or_default() += 1;
        }
        let all: HashMap<&str, _> =
            items.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| (d.name.as_str(), d)).collect();
        let mut expected = 0;
        for &minor in &minors {
            let set = counters::counter_set_name(minor);
            for p in &h100.profiles {
                for &start in &p.placements {
                    expected += 1;
                    let name = DeviceName::mig(minor, &p.name, p.id, start).to_string();
                    assert_eq!(devices.get(name.as_str()), Some(&1), "{flag}: {name}");
                    let d = all[name.as_str()];
                    let consumes = d.consumes_counters.as_ref().unwrap();
                    assert_eq!(consumes.len(), 1, "{name}");
                    assert_eq!(consumes[0].counter_set, set, "{name}");
                    let want: BTreeMap<String, String> = counters::CounterSet::for_model(h100)
                        .mig(p, start)
                        .iter()
                        .map(|(k, &v)| (k.clone(), slices::counter_quantity(k, v).0))
                        .collect();
                    let got: BTreeMap<String, String> =
                        consumes[0].counters.iter().map(|(k, c)| (k.clone(), c.value.0.clone())).collect();
                    assert_eq!(got, want, "{name}");
                }
            }
            // Its counter set, exactly once, holding the GPU's capacity.
            let sets: Vec<_> =
                items.iter().flat_map(|s| s.spec.shared_counters.iter().flatten()).filter(|c| c.name == set).collect();
            assert_eq!(sets.len(), 1, "{flag}: {set}");
            assert_eq!(sets[0].counters.len(), counters::CounterSet::for_model(h100).capacity().clone().len());
        }
        // MIG-enabled H100s are not offered whole (no flag lets migdra change the MIG mode yet).
        assert_eq!(devices.len(), expected, "{flag}: only the partitions");

        let on_gpu0 = DeviceName::mig(minors[0], "3g.40gb", 9, 4).to_string();
        let uuid = all[on_gpu0.as_str()].attributes.as_ref().unwrap().get("uuid").and_then(|a| a.string.clone());
        assert_eq!(uuid.as_deref(), Some(mig_uuid.as_str()), "{flag}: the existing instance's UUID");

        let with_devices = items.iter().filter(|s| s.spec.devices.is_some()).count();
        println!(
            "16 × H100, {flag} layout: {} slices ({with_devices} with devices, {} counter-only), {} devices",
            items.len(),
            items.len() - with_devices,
            devices.len()
        );
        counts.push(items.len());
    }
    // Split: 2 GPUs (50 partitions) per device slice, 8 counter sets per counter slice.
    // Combined: 4 GPUs per slice (4 × 8 counters ≤ 32, 104 devices ≤ 128).
    assert_eq!(counts, [8 + 2, 4]);

    // auto = split for the dry run.
    assert_eq!(slices(dir.path(), "auto", "json"), slices(dir.path(), "split", "json"));
}

#[test]
fn the_table_lists_one_row_per_slice() {
    let dir = tempfile::tempdir().unwrap();
    let text = migdra(dir.path(), &["slices", "--slice-layout", "split"]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{text}");
    assert_eq!(lines.len(), 1 + 10 + 1, "{text}");
    assert!(lines[1].starts_with("node-a-mig-slinky-slurm-net-00000  devices"), "{text}");
    assert!(lines[10].contains("counters"), "{text}");
    assert!(lines[11].contains("10 slices, split layout"), "{text}");
}

/// The scheduler takes the first device that fits, so the order of a GPU's partitions picks the
/// placement. By default small profiles come from the end of the GPU and large ones from its
/// start (`--device-order packed`); `ascending` is NVIDIA's order. Either way the same devices.
/// `best-fit` starts from packed.
#[test]
fn device_order_packs_small_profiles_from_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let order = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["slices", "-o", "json"];
        args.extend_from_slice(extra);
        let list: List = serde_json::from_str(&migdra(dir.path(), &args)).unwrap();
        let first = list.items.iter().find(|s| s.spec.devices.is_some()).expect("a device slice");
        first.spec.devices.iter().flatten().map(|d| d.name.clone()).collect()
    };
    let packed = order(&[]);
    let ascending = order(&["--device-order", "ascending"]);
    let minor = |names: &[String]| names[0].split('-').nth(1).unwrap().to_string();
    let m = minor(&packed);
    let pos = |names: &[String], d: &str| names.iter().position(|n| *n == format!("gpu-{m}-mig-{d}")).unwrap();
    assert_eq!(packed[0], format!("gpu-{m}-mig-1g10gb-19-6"));
    assert_eq!(ascending[0], format!("gpu-{m}-mig-1g10gb-19-0"));
    assert!(pos(&packed, "2g20gb-14-4") < pos(&packed, "2g20gb-14-0"));
    assert!(pos(&packed, "3g40gb-9-0") < pos(&packed, "3g40gb-9-4"));
    assert!(pos(&ascending, "2g20gb-14-0") < pos(&ascending, "2g20gb-14-4"));
    let (mut a, mut b) = (packed.clone(), ascending.clone());
    a.sort();
    b.sort();
    assert_eq!(a, b, "a pure reorder");
    assert_eq!(order(&["--device-order", "packed"]), packed);
    // Best fit ranks by what claims hold, which `slices` does not ask: the packed order.
    assert_eq!(order(&["--device-order", "best-fit"]), packed);
}

/// slurm-bridge's inventory (docs/facts/slurm-bridge.md §1.5, §7): the devices its profile
/// selects, sorted by (driver, pool, name) as plain strings; a device's Slurm index is its
/// position. Returns (name, position, the device's own `index_attribute`).
fn bridge_inventory(items: &[ResourceSlice], device_type: &str, index_attribute: &str) -> Vec<(String, i64, i64)> {
    let mut devices: Vec<(&str, &str, &str, i64)> = Vec::new();
    for s in items {
        for d in s.spec.devices.iter().flatten() {
            let attrs = d.attributes.as_ref().unwrap();
            if attrs["type"].string.as_deref() != Some(device_type) {
                continue;
            }
            let index = attrs
                .get(index_attribute)
                .and_then(|a| a.int)
                .unwrap_or_else(|| panic!("{} has no {index_attribute}", d.name));
            devices.push((s.spec.driver.as_str(), s.spec.pool.name.as_str(), d.name.as_str(), index));
        }
    }
    devices.sort();
    devices.iter().enumerate().map(|(pos, (_, _, name, index))| (name.to_string(), pos as i64, *index)).collect()
}

/// The devices whose bridge position is not their real Slurm index.
fn misplaced(inventory: &[(String, i64, i64)]) -> Vec<String> {
    inventory
        .iter()
        .filter(|(_, pos, index)| pos != index)
        .map(|(n, pos, index)| format!("{n}: position {pos}, index {index}"))
        .collect()
}

/// `migdra` on a node of `spec` whose Slurm configuration lives only in `dir` (so the host's
/// slurmd and /etc/slurm never decide anything).
fn on_node(dir: &Path, spec: &str, args: &[&str]) -> String {
    let state = dir.join("sim.json");
    crate::support::command::migdra()
        .args(["--sim", spec, "--sim-state", state.to_str().unwrap(), "--node-name", "node-a"])
        .args(["--state-dir", dir.join("state").to_str().unwrap(), "--slurmd", "none"])
        .args(["--slurm-conf", dir.join("slurm.conf").to_str().unwrap()])
        .args(args)
        .ok()
}

fn slice_list(text: &str) -> Vec<ResourceSlice> {
    serde_json::from_str::<List>(text).unwrap().items
}

/// Twelve whole GPUs whose minors differ from NVML order, and an administrator's map
/// that gives them yet another Slurm order. With `--device-names slurm` the bridge's plain sort
/// gives every GPU its real `slurmGpuIndex`; with the default names it does not (`gpu-10` sorts
/// before `gpu-2`, and minors are not Slurm's order).
#[test]
fn slurm_device_names_sort_twelve_whole_gpus_in_slurm_order() {
    let dir = tempfile::tempdir().unwrap();
    let spec = "a100-40gb:12:mig-off";
    let layout: serde_json::Value =
        serde_json::from_str(&on_node(dir.path(), spec, &["layout", "-o", "json"])).unwrap();
    let gpus = layout["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 12);
    assert!(gpus.iter().any(|g| g["minor"] != g["index"]), "minors differ from NVML indexes");
    // Slurm index = 5 × NVML index mod 12: a permutation that follows neither order.
    let map: String = gpus
        .iter()
        .map(|g| format!("{}: {}\n", g["uuid"].as_str().unwrap(), g["index"].as_u64().unwrap() * 5 % 12))
        .collect();
    let map_file = dir.path().join("index-map.yaml");
    std::fs::write(&map_file, map).unwrap();
    let map_flag = ["--slurm-index-map", map_file.to_str().unwrap()];

    let run = |names: &str| {
        let mut args = vec!["slices", "-o", "json", "--device-names", names];
        args.extend_from_slice(&map_flag);
        slice_list(&on_node(dir.path(), spec, &args))
    };
    let slurm = run("slurm");
    assert_eq!(slices::validate(&slurm, Layout::Split), Vec::<String>::new());
    let inventory = bridge_inventory(&slurm, "gpu", "slurmGpuIndex");
    assert_eq!(inventory.len(), 12);
    assert_eq!(misplaced(&inventory), Vec::<String>::new(), "{inventory:?}");
    assert_eq!(
        inventory[10].0,
        format!("0010-gpu-{}", gpus.iter().find(|g| g["index"].as_u64().unwrap() * 5 % 12 == 10).unwrap()["minor"])
    );

    let minor = run("minor");
    assert_eq!(
        minor,
        slice_list(&on_node(dir.path(), spec, &["slices", "-o", "json", map_flag[0], map_flag[1]])),
        "minor is the default"
    );
    let plain = bridge_inventory(&minor, "gpu", "slurmGpuIndex");
    assert!(plain.iter().all(|(n, _, _)| n.starts_with("gpu-")), "{plain:?}");
    assert!(misplaced(&plain).len() > 6, "the default names misplace most GPUs: {plain:?}");

    // Without any Slurm configuration the index is NVML's, and the names follow it too.
    let nvml = slice_list(&on_node(dir.path(), spec, &["slices", "-o", "json", "--device-names", "slurm"]));
    assert_eq!(misplaced(&bridge_inventory(&nvml, "gpu", "slurmGpuIndex")), Vec::<String>::new());
}

/// Static MIG: twelve MIG GPUs with two administrator-made instances each, listed by
/// Slurm as GPUs of their own (`AutoDetect=nvml`: by parent minor, then capability minors). With
/// `--device-names slurm` the bridge's plain sort of the MIG devices gives each its real
/// `slurmMigIndex`; with the default names it does not.
#[test]
fn slurm_device_names_sort_static_mig_instances_in_slurm_order() {
    let dir = tempfile::tempdir().unwrap();
    let spec = "h100-80gb:12";
    for gpu in 0..12 {
        // Created last-placement first, so GI IDs and capability minors run against placement.
        for placement in ["6", "0"] {
            let gpu = gpu.to_string();
            on_node(
                dir.path(),
                spec,
                &["sim", "create", "--gpu", &gpu, "--profile", "1g.10gb", "--placement", placement],
            );
        }
    }
    std::fs::write(dir.path().join("slurm.conf"), "ClusterName=t\nNodeName=node-a CPUs=4 Gres=gpu:24\n").unwrap();
    std::fs::write(dir.path().join("gres.conf"), "AutoDetect=nvml\n").unwrap();
    let run = |names: &str| {
        slice_list(&on_node(
            dir.path(),
            spec,
            &["slices", "-o", "json", "--mig-mode", "static", "--device-names", names],
        ))
    };

    let slurm = run("slurm");
    assert_eq!(slices::validate(&slurm, Layout::Split), Vec::<String>::new());
    let inventory = bridge_inventory(&slurm, "mig", "slurmMigIndex");
    assert_eq!(inventory.len(), 24);
    assert_eq!(misplaced(&inventory), Vec::<String>::new(), "{inventory:?}");
    assert!(
        inventory.iter().all(|(n, _, _)| n.len() > 5 && n[..4].bytes().all(|b| b.is_ascii_digit())),
        "{inventory:?}"
    );

    let plain = bridge_inventory(&run("minor"), "mig", "slurmMigIndex");
    assert!(!misplaced(&plain).is_empty(), "the default names misplace instances: {plain:?}");
}

/// Every device in the slices.
fn devices_of(items: &[ResourceSlice]) -> Vec<&k8s_openapi::api::resource::v1::Device> {
    items.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect()
}

/// Unhealthy GPUs' devices carry the taint in every mode: a dynamic GPU's partitions and its
/// instance, a whole GPU; an unhealthy GPU instance taints only its own device. The flag picks
/// the effect, or `disabled` publishes none.
#[test]
fn unhealthy_gpus_are_tainted_with_the_effect_the_flag_picks() {
    let dir = tempfile::tempdir().unwrap();
    let spec = "h100-80gb:3,a100-40gb:1:mig-off";
    let run = |args: &[&str]| on_node(dir.path(), spec, args);
    let created = |gpu: &str, profile: &str, placement: &str| -> serde_json::Value {
        let args = ["sim", "create", "--gpu", gpu, "--profile", profile, "--placement", placement, "-o", "json"];
        serde_json::from_str(&run(&args)).unwrap()
    };
    created("0", "3g.40gb", "4");
    created("1", "1g.10gb", "0");
    let sick_instance = created("1", "3g.40gb", "4");
    let gi_id = sick_instance["gpu_instance_id"].as_u64().unwrap();
    let gi = gi_id.to_string();
    run(&["sim", "health", "--gpu", "0", "--unhealthy"]);
    run(&["sim", "health", "--gpu", "3", "--unhealthy"]);
    run(&["sim", "health", "--gpu", "1", "--gi", &gi, "--unhealthy"]);
    let layout: serde_json::Value = serde_json::from_str(&run(&["layout", "-o", "json"])).unwrap();
    let minor = |i: usize| layout["gpus"][i]["minor"].as_u64().unwrap() as u32;
    let sick_device = layout["gpus"][1]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["gpu_instance_id"].as_u64() == Some(gi_id))
        .unwrap()["device"]
        .as_str()
        .unwrap()
        .to_string();

    let slices_with = |effect: Option<&str>| {
        let mut args = vec!["slices", "-o", "json", "--mig-mode-override", "1=static"];
        if let Some(e) = effect {
            args.extend(["--unhealthy-taint-effect", e]);
        }
        let items = slice_list(&run(&args));
        assert_eq!(slices::validate(&items, Layout::Split), Vec::<String>::new());
        items
    };
    for (flag, effect) in [(None, "NoSchedule"), (Some("NoExecute"), "NoExecute"), (Some("None"), "None")] {
        let items = slices_with(flag);
        let devices = devices_of(&items);
        for d in &devices {
            let on = DeviceName::parse(&d.name).unwrap().minor();
            let want = if on == minor(0) || on == minor(3) {
                Some(("mig.slinky.slurm.net/xid", Some("79")))
            } else if d.name == sick_device {
                Some(("mig.slinky.slurm.net/xid", Some("94")))
            } else {
                None
            };
            let got: Vec<(&str, Option<&str>, &str)> =
                d.taints.iter().flatten().map(|t| (t.key.as_str(), t.value.as_deref(), t.effect.as_str())).collect();
            match want {
                Some((key, value)) => assert_eq!(got, [(key, value, effect)], "{}", d.name),
                None => assert_eq!(got, [], "{}", d.name),
            }
        }
        let tainted = devices.iter().filter(|d| d.taints.is_some()).count();
        let sick_gpu0 = devices.iter().filter(|d| DeviceName::parse(&d.name).unwrap().minor() == minor(0)).count();
        assert_eq!(tainted, sick_gpu0 + 2, "GPU 0's partitions, the whole A100 and one instance");
        assert!(
            devices.iter().any(|d| d.name.starts_with(&format!("gpu-{}-mig-3g40gb-9-4", minor(0)))
                && d.attributes.as_ref().is_some_and(|a| a.contains_key("uuid"))
                && d.taints.is_some()),
            "the instance on the unhealthy dynamic GPU is tainted"
        );
    }
    let off = slices_with(Some("disabled"));
    assert!(devices_of(&off).iter().all(|d| d.taints.is_none()), "disabled publishes no taints");

    run(&["sim", "health", "--gpu", "0"]);
    run(&["sim", "health", "--gpu", "3"]);
    run(&["sim", "health", "--gpu", "1", "--gi", &gi]);
    assert!(devices_of(&slices_with(None)).iter().all(|d| d.taints.is_none()), "recovered: no taints");
}
