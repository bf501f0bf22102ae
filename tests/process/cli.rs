//! The `migdra` binary as an operator runs it: output formats, the simulator commands, and the
//! bad-input contract (one line naming the bad value and the valid choices, exit 2, state file
//! untouched).

use crate::support::command::{self, Run};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

fn migdra(args: &[&str]) -> Output {
    command::migdra().args(args).run()
}

fn ok(args: &[&str]) -> String {
    let out = migdra(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command that must fail as bad input and returns its one error line.
fn usage_error(args: &[&str]) -> String {
    let out = migdra(args);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(out.stdout.is_empty());
    stderr
}

fn state_arg(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

#[test]
fn profiles_json_lists_h100_ids_and_placements_from_the_facts() {
    let v: Value = serde_json::from_str(&ok(&["profiles", "--model", "h100-80gb", "-o", "json"])).unwrap();
    let profiles = v["profiles"].as_array().unwrap();
    let ids: Vec<u64> = profiles.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [19, 20, 15, 14, 9, 5, 0]);
    let placements: Vec<(Vec<u64>, u64)> = profiles
        .iter()
        .map(|p| {
            let list = p["placement_list"].as_array().unwrap();
            let starts = list.iter().map(|pl| pl["start"].as_u64().unwrap()).collect();
            (starts, list[0]["size"].as_u64().unwrap())
        })
        .collect();
    let all7 = vec![0, 1, 2, 3, 4, 5, 6];
    assert_eq!(
        placements,
        [
            (all7.clone(), 1),
            (all7, 1),
            (vec![0, 2, 4, 6], 2),
            (vec![0, 2, 4], 2),
            (vec![0, 4], 4),
            (vec![0], 4),
            (vec![0], 8)
        ]
    );
}

#[test]
fn profiles_table_marks_unverified_rows() {
    let text = ok(&["profiles", "--model", "b200-180gb"]);
    assert!(text.contains("UNVERIFIED") || text.contains("inferred"), "{text}");
    assert!(text.contains("1g.23gb"));
    let all = ok(&["profiles"]);
    for key in ["a100-40gb", "a30-24gb", "h200-141gb", "rtx-pro-6000"] {
        assert!(all.contains(key), "{key}");
    }
}

/// GB200, B300 and GB300 through `migdra profiles`: mig-parted's profile names and counts on the
/// B200's grid, their PCI IDs, and every figure no source confirms marked UNVERIFIED.
#[test]
fn profiles_of_the_newest_blackwells() {
    let cases = [
        ("gb200-186gb", "0x2941", ["1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"]),
        ("b300-269gb", "0x3182", ["1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"]),
        ("gb300-278gb", "0x31C2", ["1g.35gb", "1g.35gb+me", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"]),
    ];
    for (key, pci, names) in cases {
        let v: Value = serde_json::from_str(&ok(&["profiles", "--model", key, "-o", "json"])).unwrap();
        assert_eq!(v["pci_device_ids"], serde_json::json!([pci]), "{key}");
        assert_eq!(v["architecture"], "Blackwell");
        let profiles = v["profiles"].as_array().unwrap();
        let got: Vec<(&str, u64, u64)> = profiles
            .iter()
            .map(|p| (p["name"].as_str().unwrap(), p["id"].as_u64().unwrap(), p["max_instances"].as_u64().unwrap()))
            .collect();
        let want: Vec<(&str, u64, u64)> = names
            .into_iter()
            .zip([19, 20, 15, 14, 9, 5, 0])
            .zip([7, 1, 4, 3, 2, 1, 1])
            .map(|((n, i), c)| (n, i, c))
            .collect();
        assert_eq!(got, want, "{key}");
        let sizes: Vec<(u64, u64)> = profiles
            .iter()
            .map(|p| {
                let list = p["placement_list"].as_array().unwrap();
                (list.len() as u64, list[0]["size"].as_u64().unwrap())
            })
            .collect();
        assert_eq!(sizes, [(7, 1), (7, 1), (4, 2), (3, 2), (2, 4), (1, 4), (1, 8)], "{key}: the 8-slice grid");
        for p in profiles.iter().filter(|p| p["name"].as_str().unwrap().starts_with(['3', '4', '7'])) {
            assert_eq!(p["evidence"], "unverified", "{key} {}: never captured", p["name"]);
        }

        let table = ok(&["profiles", "--model", key]);
        for n in names {
            assert!(table.lines().any(|l| l.starts_with(&format!("{n} "))), "{key}: no row {n}\n{table}");
        }
        assert!(table.contains(pci) && table.contains("UNVERIFIED"), "{table}");
        assert!(table.contains("note:"), "{table}");
    }
    // B300 and GB300 are known by name only: not one row of theirs was seen.
    for key in ["b300-269gb", "gb300-278gb"] {
        let table = ok(&["profiles", "--model", key]);
        let rows = table.lines().filter(|l| l.starts_with(['1', '2', '3', '4', '7'])).collect::<Vec<_>>();
        assert_eq!(rows.len(), 7, "{table}");
        assert!(rows.iter().all(|l| l.trim_end().ends_with("UNVERIFIED")), "{table}");
    }
    let all = ok(&["profiles"]);
    for key in ["gb200-186gb", "b300-269gb", "gb300-278gb"] {
        assert!(all.contains(key), "{key}");
    }
    // The simulator takes them by the same keys, with the names NVML gives them.
    let v: Value =
        serde_json::from_str(&ok(&["layout", "--sim", "gb200-186gb:1,b300-269gb:1,gb300-278gb:1", "-o", "json"]))
            .unwrap();
    let names: Vec<&str> = v["gpus"].as_array().unwrap().iter().map(|g| g["product_name"].as_str().unwrap()).collect();
    assert_eq!(names, ["NVIDIA GB200", "NVIDIA B300 SXM6 AC", "NVIDIA GB300"]);
}

#[test]
fn layout_json_lists_instances_created_by_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("gpus.json");
    let s = state_arg(&state);
    ok(&[
        "sim",
        "create",
        "--sim",
        "h100-80gb:2",
        "--sim-state",
        &s,
        "--gpu",
        "1",
        "--profile",
        "3g.40gb",
        "--placement",
        "4",
    ]);
    ok(&["sim", "create", "--sim-state", &s, "--gpu", "1", "--profile", "20", "--placement", "0"]);
    let v: Value = serde_json::from_str(&ok(&["layout", "--sim-state", &s, "-o", "json"])).unwrap();
    let gpu = &v["gpus"][1];
    let minor = gpu["minor"].as_u64().unwrap();
    assert_ne!(minor, 1, "simulated minors differ from indexes");
    let inst = gpu["instances"].as_array().unwrap();
    assert_eq!(inst.len(), 2);
    assert_eq!(inst[1]["profile"], "3g.40gb");
    assert_eq!(inst[1]["placement"]["start"], 4);
    assert_eq!(inst[1]["placement"]["size"], 4);
    assert_eq!(inst[1]["device"], format!("gpu-{minor}-mig-3g40gb-9-4"));
    assert!(inst[1]["compute_instances"][0]["uuid"].as_str().unwrap().starts_with("MIG-"));
    assert!(inst[0]["gpu_instance_id"].is_u64());
    let picture = ok(&["layout", "--sim-state", &s]);
    assert!(picture.contains("A  .  .  .  B  B  B  B"), "{picture}");
}

#[test]
fn bad_input_gets_one_line_exit_2_and_leaves_the_state_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("gpus.json");
    let s = state_arg(&state);
    ok(&["layout", "--sim", "h100-80gb:1", "--sim-state", &s]);
    let before = std::fs::read(&state).unwrap();

    let e = usage_error(&["profiles", "--model", "h100"]);
    assert!(e.contains("\"h100\"") && e.contains("h100-80gb") && e.contains("rtx-pro-6000"), "{e}");
    for newest in ["gb200-186gb", "b300-269gb", "gb300-278gb"] {
        assert!(e.contains(newest), "the valid models include {newest}: {e}");
    }
    let e = usage_error(&["profiles", "--model", "gb300"]);
    assert!(e.contains("\"gb300\"") && e.contains("gb300-278gb"), "{e}");

    let e = usage_error(&["layout", "--sim", "h100-80gb"]);
    assert!(e.contains("h100-80gb") && e.contains("MODEL:COUNT"), "{e}");
    let e = usage_error(&["layout", "--sim", "v100:2"]);
    assert!(e.contains("v100") && e.contains("a100-40gb") && e.contains("gb300-278gb"), "{e}");
    let e = usage_error(&["layout", "--sim", "h100-80gb:two"]);
    assert!(e.contains("two"), "{e}");

    let e =
        usage_error(&["sim", "create", "--sim-state", &s, "--gpu", "0", "--profile", "3g.40gb", "--placement", "2"]);
    assert!(e.contains("placement 2") && e.contains("{0,4}:4"), "{e}");
    let e = usage_error(&["sim", "create", "--sim-state", &s, "--gpu", "0", "--profile", "1g.5gb", "--placement", "0"]);
    assert!(e.contains("1g.5gb") && e.contains("3g.40gb (ID 9)"), "{e}");
    let e = usage_error(&["sim", "create", "--sim-state", &s, "--gpu", "0", "--profile", "47", "--placement", "0"]);
    assert!(e.contains("\"47\""), "{e}");
    let e = usage_error(&["sim", "create", "--sim-state", &s, "--gpu", "5", "--profile", "9", "--placement", "0"]);
    assert!(e.contains('5'), "{e}");
    assert_eq!(std::fs::read(&state).unwrap(), before, "bad input must not touch the state");

    std::fs::write(&state, b"{ not json").unwrap();
    let e = usage_error(&["layout", "--sim-state", &s]);
    assert!(e.contains(&s), "{e}");
    let e = usage_error(&["sim", "create", "--sim-state", &s, "--gpu", "0", "--profile", "9", "--placement", "0"]);
    assert!(e.contains(&s), "{e}");
    assert_eq!(std::fs::read(&state).unwrap(), b"{ not json", "a corrupt file is left as it is");
}

/// An unknown taint effect, from the flag or its environment variable, is bad input for both
/// commands that publish taints; serve refuses it before it opens anything.
#[test]
fn an_unknown_taint_effect_is_named_with_the_valid_ones() {
    let dir = tempfile::tempdir().unwrap();
    let s = state_arg(&dir.path().join("gpus.json"));
    let valid = "NoSchedule, NoExecute, None, disabled";
    let e = usage_error(&[
        "slices",
        "--sim",
        "h100-80gb:1",
        "--sim-state",
        &s,
        "--unhealthy-taint-effect",
        "PreferNoSchedule",
    ]);
    assert!(e.contains("\"PreferNoSchedule\"") && e.contains(valid), "{e}");
    let plugin_dir = dir.path().join("plugin");
    let plugin = state_arg(&plugin_dir);
    let e = usage_error(&[
        "serve",
        "--sim",
        "h100-80gb:1",
        "--sim-state",
        &s,
        "--plugin-dir",
        &plugin,
        "--unhealthy-taint-effect",
        "off",
    ]);
    assert!(e.contains("\"off\"") && e.contains(valid), "{e}");
    let out = command::migdra()
        .env("MIGDRA_UNHEALTHY_TAINT_EFFECT", "evict")
        .args(["serve", "--sim", "h100-80gb:1", "--sim-state", &s, "--plugin-dir", &plugin])
        .run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), stderr.lines().count()), (Some(2), 1), "{stderr}");
    assert!(stderr.contains("\"evict\"") && stderr.contains(valid), "{stderr}");
    assert!(!plugin_dir.exists() && !dir.path().join("gpus.json").exists(), "nothing was created");
}

#[test]
fn nvml_refusals_exit_1_and_faults_and_reboot_work_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let s = state_arg(&dir.path().join("gpus.json"));
    ok(&[
        "sim",
        "create",
        "--sim",
        "a30-24gb:1",
        "--sim-state",
        &s,
        "--gpu",
        "0",
        "--profile",
        "4g.24gb",
        "--placement",
        "0",
    ]);
    let out = migdra(&["sim", "create", "--sim-state", &s, "--gpu", "0", "--profile", "1g.6gb", "--placement", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("insufficient-resources"));

    let v: Value = serde_json::from_str(&ok(&["layout", "--sim-state", &s, "-o", "json"])).unwrap();
    let gi = v["gpus"][0]["instances"][0]["gpu_instance_id"].as_u64().unwrap().to_string();
    ok(&["sim", "process", "--sim-state", &s, "--gpu", "0", "--gi", &gi, "--ci", "0"]);
    let out = migdra(&["sim", "destroy", "--sim-state", &s, "--gpu", "0", "--gi", &gi]);
    assert_eq!(out.status.code(), Some(1), "IN_USE while a process runs");
    assert!(String::from_utf8_lossy(&out.stderr).contains("in-use"));
    ok(&["sim", "process", "--sim-state", &s, "--gpu", "0", "--clear"]);

    ok(&["sim", "fail", "--sim-state", &s, "destroy-ci=in-use:1"]);
    assert_eq!(migdra(&["sim", "destroy", "--sim-state", &s, "--gpu", "0", "--gi", &gi]).status.code(), Some(1));
    ok(&["sim", "destroy", "--sim-state", &s, "--gpu", "0", "--gi", &gi]);

    let e = usage_error(&["sim", "fail", "--sim-state", &s, "create-gi=bogus"]);
    assert!(e.contains("bogus") && e.contains("insufficient-resources"), "{e}");

    ok(&["sim", "create", "--sim-state", &s, "--gpu", "0", "--profile", "1g.6gb", "--placement", "3"]);
    let boot =
        serde_json::from_str::<Value>(&ok(&["layout", "--sim-state", &s, "-o", "json"])).unwrap()["boot_id"].clone();
    ok(&["sim", "reboot", "--sim-state", &s]);
    let v: Value = serde_json::from_str(&ok(&["layout", "--sim-state", &s, "-o", "json"])).unwrap();
    assert_ne!(v["boot_id"], boot);
    assert!(v["gpus"][0]["instances"].as_array().unwrap().is_empty());
}

/// The shipped DeviceClasses and slurm-bridge profiles are exactly what `migdra device-classes`
/// prints, each class has exactly one CEL selector, and every slurm-bridge profile's selector is
/// a class's, byte for byte (slurm-bridge accepts a class only then).
#[test]
fn shipped_device_classes_and_bridge_profiles_are_what_the_command_prints() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = |file: &str| std::fs::read_to_string(repo.join(file)).unwrap();
    let regenerate = "regenerate it with the command in its second line";
    let classes = ok(&["device-classes", "-o", "yaml"]);
    assert_eq!(shipped("daemonset/base/deviceclasses.yaml"), classes, "{regenerate}");
    let bridge = ok(&["device-classes", "--slurm-bridge", "-o", "yaml"]);
    assert_eq!(shipped("daemonset/slurm-bridge/device-profiles.yaml"), bridge, "{regenerate}");
    let bridge_static = ok(&["device-classes", "--slurm-bridge", "--static-mig", "-o", "yaml"]);
    assert_eq!(shipped("daemonset/slurm-bridge/device-profiles-static-mig.yaml"), bridge_static, "{regenerate}");

    let list: Value = serde_json::from_str(&ok(&["device-classes", "-o", "json"])).unwrap();
    let mut selectors = std::collections::BTreeMap::new();
    for c in list["items"].as_array().unwrap() {
        let sel = c["spec"]["selectors"].as_array().unwrap();
        assert_eq!(sel.len(), 1, "exactly one selector: {c}");
        assert!(c["spec"].get("config").is_none(), "no config: {c}");
        selectors.insert(sel[0]["cel"]["expression"].as_str().unwrap().to_string(), c["metadata"]["name"].clone());
    }
    let by_resource =
        |r: &str| list["items"].as_array().unwrap().iter().find(|c| c["spec"]["extendedResourceName"] == r).cloned();
    assert_eq!(by_resource("nvidia.com/mig-1g.10gb").unwrap()["metadata"]["name"], "mig-1g.10gb");
    assert_eq!(by_resource("nvidia.com/mig-1g.10gb.me").unwrap()["metadata"]["name"], "mig-1g.10gb.me");
    assert_eq!(by_resource("nvidia.com/gpu").unwrap()["metadata"]["name"], "gpu");

    let profiles: Value =
        serde_json::from_str(&ok(&["device-classes", "--slurm-bridge", "--static-mig", "-o", "json"])).unwrap();
    let profiles = profiles["deviceProfiles"].as_array().unwrap();
    assert_eq!(profiles.len(), selectors.len() - 1, "every class but `mig` (any profile)");
    for p in profiles {
        let class = &selectors[p["selector"].as_str().unwrap()];
        assert_eq!(class, &p["name"], "the profile is named after its class (the Slurm GRES type): {p}");
        assert_eq!(p["backend"], serde_json::json!({"type": "indexed-gres", "gresName": "gpu"}));
    }
}

#[test]
fn device_classes_cover_the_profiles_the_node_has() {
    let list: Value = serde_json::from_str(&ok(&["--sim", "h100-80gb:2", "device-classes", "-o", "json"])).unwrap();
    let names: Vec<&str> =
        list["items"].as_array().unwrap().iter().map(|c| c["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "mig",
            "gpu",
            "mig-1g.10gb",
            "mig-1g.10gb.me",
            "mig-1g.20gb",
            "mig-2g.20gb",
            "mig-3g.40gb",
            "mig-4g.40gb",
            "mig-7g.80gb"
        ]
    );
    let only: Value = serde_json::from_str(&ok(&[
        "--sim",
        "h100-80gb:1",
        "device-classes",
        "--profiles",
        "1g.10gb,3g.40gb",
        "--gpu-extended-resource",
        "",
        "-o",
        "json",
    ]))
    .unwrap();
    let items = only["items"].as_array().unwrap();
    assert_eq!(items.len(), 4);
    assert!(items[1]["spec"].get("extendedResourceName").is_none(), "{}", items[1]);
    let table = ok(&["--sim", "h100-80gb:1", "device-classes"]);
    assert!(table.contains("mig-3g.40gb") && table.contains("nvidia.com/mig-3g.40gb"), "{table}");
}

#[test]
fn device_classes_refuse_names_the_api_server_would_refuse() {
    let e = usage_error(&["--sim", "h100-80gb:1", "device-classes", "--profiles", "1g.5gb"]);
    assert!(e.contains("\"1g.5gb\"") && e.contains("h100-80gb") && e.contains("1g.10gb"), "{e}");
    let e = usage_error(&["device-classes", "--class-prefix", "MIG_"]);
    assert!(e.contains("MIG_1g"), "{e}");
    let e = usage_error(&["device-classes", "--extended-resource-prefix", "deviceclass.resource.kubernetes.io/"]);
    assert!(
        e.contains("\"deviceclass.resource.kubernetes.io/1g.5gb\"") && e.contains("Kubernetes' own resources"),
        "{e}"
    );
    let e = usage_error(&["device-classes", "--gpu-extended-resource", "gpu"]);
    assert!(e.contains("\"gpu\"") && e.contains("no domain"), "{e}");
    let e = usage_error(&["device-classes", "--static-mig"]);
    assert!(e.contains("--slurm-bridge"), "{e}");
}

/// `migdra slurm-conf` for a node with no Slurm files yet: GPU records in NVML order (minors
/// differ from it), one shard record per GPU with migdra's slurmShards, a static-MIG GPU left out
/// with a comment, and one-line refusals of values Slurm would reject.
#[test]
fn slurm_conf_prints_the_lines_slurm_needs_and_refuses_bad_values() {
    let dir = tempfile::tempdir().unwrap();
    let s = state_arg(&dir.path().join("gpus.json"));
    let none = state_arg(&dir.path().join("no-slurm.conf"));
    let st = state_arg(&dir.path().join("state"));
    let base = ["slurm-conf", "--sim", "h100-80gb:3", "--sim-state", &s, "--node-name", "n1", "--slurm-conf", &none];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend(["--slurmd", "none", "--state-dir", &st]);
        args.extend(extra);
        ok(&args)
    };
    let v: Value = serde_json::from_str(&run(&["-o", "json"])).unwrap();
    let minors: Vec<u64> = v["gpus"].as_array().unwrap().iter().map(|g| g["minor"].as_u64().unwrap()).collect();
    assert_ne!(minors, [0, 1, 2], "simulated minors are not NVML order");
    assert_eq!(v["gres"], "gpu:h100:3,shard:24");
    assert_eq!(v["slurmConf"], serde_json::json!(["GresTypes=gpu,shard", "NodeName=n1 Gres=gpu:h100:3,shard:24"]));
    for (i, g) in v["gpus"].as_array().unwrap().iter().enumerate() {
        assert_eq!((g["slurmGpuIndex"].as_u64(), g["slurmShards"].as_u64()), (Some(i as u64), Some(8)), "{g}");
        assert_eq!(v["records"][i]["file"], format!("/dev/nvidia{}", minors[i]));
        assert_eq!(v["records"][i]["type"], "h100");
        assert_eq!(
            (v["records"][3 + i]["name"].as_str(), v["records"][3 + i]["count"].as_u64()),
            (Some("shard"), Some(8))
        );
    }
    assert!(!Path::new(&st).exists(), "a command that only reads creates no state directory");

    // The table is the configuration itself; --only picks one file.
    let text = run(&["--shards-per-gpu", "4", "--dev-root", "/fake/dev", "--gres-type", "hopper"]);
    assert!(text.contains("\nNodeName=n1 Gres=gpu:hopper:3,shard:12\n"), "{text}");
    assert!(
        text.contains(&format!(
            "\nNodeName=n1 Name=gpu Type=hopper File=/fake/dev/nvidia{} # Slurm index 0",
            minors[0]
        )),
        "{text}"
    );
    assert!(text.contains(&format!("\nNodeName=n1 Name=shard Count=4 File=/fake/dev/nvidia{}\n", minors[2])), "{text}");
    let gres = run(&["--only", "gres.conf"]);
    assert!(gres.starts_with("# gres.conf for Slurm node n1") && !gres.contains("GresTypes"), "{gres}");
    assert_eq!(run(&["--only", "slurm.conf"]), "GresTypes=gpu,shard\nNodeName=n1 Gres=gpu:h100:3,shard:24\n");

    // A static-MIG GPU: a comment, no record; the GPU after it moves up.
    let text = run(&["--mig-mode-override", "1=static"]);
    assert!(text.contains("Gres=gpu:h100:2,shard:16"), "{text}");
    let left_out = format!("File=/dev/nvidia{}", minors[1]);
    let records = text.lines().filter(|l| !l.starts_with('#'));
    assert!(!records.clone().any(|l| l.split_whitespace().any(|w| w == left_out)), "{text}");
    assert_eq!(records.filter(|l| l.contains("Name=shard")).count(), 2, "{text}");
    assert!(text.contains(&format!("/dev/nvidia{}) is left out: in static MIG mode", minors[1])), "{text}");
    assert!(text.contains(&format!("File=/dev/nvidia{} # Slurm index 1: NVML index 2", minors[2])), "{text}");

    // Values Slurm would reject.
    let mut args = base.to_vec();
    args.extend(["--gres-type", "H100"]);
    let e = usage_error(&args);
    assert!(e.contains("--gres-type \"H100\"") && e.contains("lowercase letters, digits, '_', '-' and '.'"), "{e}");
    let mut args = base.to_vec();
    args.extend(["--gres-type", "gpu:a"]);
    assert!(usage_error(&args).contains("\"gpu:a\""));
    let mut args = base.to_vec();
    args.extend(["--dev-root", "dev"]);
    let e = usage_error(&args);
    assert!(e.contains("--dev-root \"dev\"") && e.contains("absolute path"), "{e}");
}

/// `--host-root` is an absolute directory or `none`; anything else is refused before any work.
#[test]
fn host_root_is_absolute_or_none() {
    let out = migdra(&["--host-root", "dev", "layout", "--sim", "h100-80gb:1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("\"dev\": expected an absolute directory") && err.contains("or none"), "{err}");
    for ok in ["none", "/"] {
        let out = migdra(&["--host-root", ok, "layout", "--sim", "h100-80gb:1"]);
        assert!(out.status.success(), "{ok}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// An administrator's map that points two of this node's GPUs at one Slurm index: every command
/// that reads it refuses with one line naming both GPUs and the index, and `serve` stops before
/// it writes or publishes anything.
#[test]
fn a_map_with_one_index_twice_is_refused_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let s = state_arg(&dir.path().join("gpus.json"));
    let v: Value =
        serde_json::from_str(&ok(&["layout", "--sim", "h100-80gb:2", "--sim-state", &s, "-o", "json"])).unwrap();
    let (uuid0, bus1) = (v["gpus"][0]["uuid"].as_str().unwrap(), v["gpus"][1]["pci_bus_id"].as_str().unwrap());
    let uuid1 = v["gpus"][1]["uuid"].as_str().unwrap();
    let map = dir.path().join("map.yaml");
    std::fs::write(&map, format!("# node n1\n{uuid0}: 3\n\"{bus1}\": 3\n")).unwrap();
    let m = state_arg(&map);
    let none = state_arg(&dir.path().join("no-slurm.conf"));
    let bus1 = bus1.split_once(':').unwrap().1.to_ascii_lowercase();
    let want = format!(
        "{m}: GPU {uuid0} (line 2) and GPU {uuid1} (as 0000:{bus1}, line 3) both have Slurm index 3 on this node"
    );
    let flags = ["--sim-state", &s, "--slurm-index-map", &m, "--slurm-conf", &none, "--slurmd", "none"];
    for cmd in [&["status"][..], &["slices", "--node-name", "n1"], &["slurm-conf", "--node-name", "n1"]] {
        let mut args = cmd.to_vec();
        args.extend(flags);
        let e = usage_error(&args);
        assert!(e.contains(&want), "{cmd:?}: {e}\nwant {want}");
    }
    let (plugins, registry, state) =
        (dir.path().join("plugins"), dir.path().join("registry"), dir.path().join("state"));
    let mut args = vec!["serve", "--node-name", "n1", "--claims-dir", &none];
    let (p, r, st) = (state_arg(&plugins), state_arg(&registry), state_arg(&state));
    args.extend(["--plugin-dir", &p, "--registry-dir", &r, "--state-dir", &st]);
    args.extend(flags);
    let e = usage_error(&args);
    assert!(e.contains(&want), "serve: {e}");
    for d in [&plugins, &registry, &state] {
        assert!(!d.exists(), "serve refused at start, so it made no {}", d.display());
    }
}

/// `--profiles` publishes only the listed profiles, with a counter set made for them; a name no
/// GPU knows, or a list that leaves a GPU empty, is refused in one line before serve makes a file.
#[test]
fn profiles_allowlist_publishes_only_its_profiles_and_refuses_bad_names() {
    let slices: Value = serde_json::from_str(&ok(&[
        "slices",
        "--sim",
        "h100-80gb:2",
        "--node-name",
        "n1",
        "-o",
        "json",
        "--profiles",
        "1g.10gb,3g.40gb",
    ]))
    .unwrap();
    let items = slices["items"].as_array().unwrap();
    let devices: Vec<&Value> =
        items.iter().flat_map(|i| i["spec"]["devices"].as_array().into_iter().flatten()).collect();
    let profiles: std::collections::BTreeSet<&str> =
        devices.iter().map(|d| d["attributes"]["profile"]["string"].as_str().unwrap()).collect();
    assert_eq!(profiles.into_iter().collect::<Vec<_>>(), ["1g.10gb", "3g.40gb"]);
    assert_eq!(devices.len(), 2 * (7 + 2), "seven 1g.10gb and two 3g.40gb per GPU");
    for set in items.iter().flat_map(|i| i["spec"]["sharedCounters"].as_array().into_iter().flatten()) {
        let names: Vec<&String> = set["counters"].as_object().unwrap().keys().collect();
        // No +me profile, so no engine counter; slice 7 only ever comes with slice 6.
        assert_eq!(names.len(), 7, "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("memory-slice-")), "{names:?}");
    }

    let e = usage_error(&["slices", "--sim", "h100-80gb:1", "--node-name", "n1", "--profiles", "1g.10gb,1g.11gb"]);
    assert!(e.contains("\"1g.11gb\" is not a MIG profile") && e.contains("1g.10gb+me"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let (plugins, registry, state) = (dir.path().join("p"), dir.path().join("r"), dir.path().join("s"));
    let (p, r, st) = (state_arg(&plugins), state_arg(&registry), state_arg(&state));
    let none = state_arg(&dir.path().join("none"));
    let e = usage_error(&[
        "serve",
        "--sim",
        "h100-80gb:2",
        "--node-name",
        "n1",
        "--claims-dir",
        &none,
        "--plugin-dir",
        &p,
        "--registry-dir",
        &r,
        "--state-dir",
        &st,
        "--profiles",
        "1g.18gb",
    ]);
    assert!(e.contains("GPU 0 (NVIDIA H100 80GB HBM3) has none of 1g.18gb") && e.contains("7g.80gb (ID 0)"), "{e}");
    for d in [&plugins, &registry, &state] {
        assert!(!d.exists(), "serve refused at start, so it made no {}", d.display());
    }
}

/// An admin-access claim that reaches migdra without the API server's check (a claims file in a
/// namespace that has no admin-access label) is prepared as its allocation says: a spec, no
/// instance; `migdra claims` lists it as `AdminAccess`; a claim mixing admin access with an
/// ordinary request is refused in one line, with nothing written.
#[test]
fn an_admin_access_claim_file_prepares_a_spec_and_no_instance() {
    use crate::support::claim::{Claim, uid};
    use crate::support::node::NodeDir;
    let node = NodeDir::new().simulate("h100-80gb:1");
    let minor = node.minors()[0];
    let device = format!("gpu-{minor}-mig-1g10gb-19-0");
    let monitor = |n| {
        let result = serde_json::json!({
            "request": "gpu", "driver": crate::support::DRIVER, "pool": node.node_name(), "device": device,
            "adminAccess": true
        });
        Claim::new(uid(n)).result(result)
    };
    node.write(&monitor(1));
    node.cli(&["claims", "prepare", &uid(1)]);
    assert!(node.instances().is_empty(), "no instance for admin access");
    assert_eq!(node.cdi_specs(), 1);
    let listed: Value = serde_json::from_str(&node.cli(&["claims", "-o", "json"])).unwrap();
    assert_eq!(listed[0]["state"], "AdminAccess", "{listed}");

    let mixed = monitor(2).device(node.node_name(), &format!("gpu-{minor}-mig-1g10gb-19-1"));
    node.write(&mixed);
    let out = node.command(&["claims", "prepare", &uid(2)]).run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.lines().count() == 1, "{stderr}");
    assert!(stderr.contains("put admin-access requests in a claim of their own"), "{stderr}");
    assert_eq!(node.cdi_specs(), 1, "nothing written for the refused claim");

    node.cli(&["claims", "unprepare", &uid(1)]);
    assert_eq!((node.cdi_specs(), node.instances().len()), (0, 0));
}

/// `serve --resync` below a second would list the node's slices in a tight loop: refused in one
/// line before anything is made.
#[test]
fn serve_refuses_a_resync_below_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    let p = state_arg(&plugins);
    let e =
        usage_error(&["serve", "--sim", "h100-80gb:1", "--claims-dir", &p, "--plugin-dir", &p, "--resync", "500ms"]);
    assert!(e.contains("--resync 500ms is below 1s"), "{e}");
    assert!(!plugins.exists(), "nothing made");
}

/// `serve --kubeconfig` with a file that is missing or not a kubeconfig, one whose context names
/// no cluster, or one whose certificate authority is not a certificate or not there: one line
/// naming the file, exit 2, and nothing made or left in the daemon's directories.
#[test]
fn serve_refuses_a_bad_kubeconfig_in_one_line_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let not_yaml = dir.path().join("not-yaml");
    std::fs::write(&not_yaml, "{ this is: [not a kubeconfig").unwrap();
    let no_cluster = dir.path().join("no-cluster");
    std::fs::write(
        &no_cluster,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n\
         - name: c\n  context: {cluster: gone, user: u}\nusers:\n- name: u\n  user: {}\n",
    )
    .unwrap();
    let kubeconfig_with = |cluster: &str| {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n\
             - name: c\n  context: {{cluster: k, user: u}}\n\
             clusters:\n- name: k\n  cluster: {{server: \"https://127.0.0.1:1\", {cluster}}}\n\
             users:\n- name: u\n  user: {{token: t}}\n"
        )
    };
    // base64 of "not a certificate\n": read without complaint by the client, then no handshake works.
    let bad_ca = dir.path().join("bad-ca");
    std::fs::write(&bad_ca, kubeconfig_with("certificate-authority-data: bm90IGEgY2VydGlmaWNhdGUK")).unwrap();
    let no_ca = dir.path().join("no-ca");
    std::fs::write(&no_ca, kubeconfig_with("certificate-authority: /nonexistent/ca.crt")).unwrap();
    let cases = [
        ("missing", dir.path().join("missing")),
        ("not YAML", not_yaml),
        ("no cluster", no_cluster),
        ("not a certificate", bad_ca),
        ("no CA file", no_ca),
    ];
    for (case, path) in cases {
        let run = dir.path().join(format!("run-{}", case.replace(' ', "-")));
        let (plugins, registry, state) = (run.join("plugins"), run.join("registry"), run.join("state"));
        let (p, r, st, k) = (state_arg(&plugins), state_arg(&registry), state_arg(&state), state_arg(&path));
        let out = migdra(&[
            "serve",
            "--sim",
            "h100-80gb:1",
            "--node-name",
            "n1",
            "--kubeconfig",
            &k,
            "--plugin-dir",
            &p,
            "--registry-dir",
            &r,
            "--state-dir",
            &st,
            "--slurmd",
            "none",
        ]);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{case}: {stderr}");
        // A file that cannot be read is refused before anything is logged; a context without its
        // cluster is found once the daemon builds its client, after its log says which GPUs it has.
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("migdra: error: ")).collect();
        assert_eq!(errors, stderr.lines().last().into_iter().collect::<Vec<_>>(), "{case}: one error, last: {stderr}");
        assert!(errors[0].starts_with(&format!("migdra: error: --kubeconfig {k}: ")), "{case}: {stderr}");
        if matches!(case, "missing" | "not YAML") {
            assert_eq!(stderr.lines().count(), 1, "{case}: {stderr}");
        }
        let left: Vec<_> = [&plugins, &registry]
            .into_iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flat_map(|d| d.flatten().map(|e| e.path()))
            .collect();
        assert_eq!(left, Vec::<std::path::PathBuf>::new(), "{case}: files left behind");
    }
}

/// A GPU lost at run time (every NVML call on it says GPU_IS_LOST, as for a GPU fallen off the
/// bus): `layout` and `status` show it LOST and the other GPU as before, and `serve` still
/// starts on the node.
#[test]
fn a_lost_gpu_is_shown_lost_and_the_others_go_on() {
    use crate::support::node::NodeDir;
    let node = NodeDir::new().simulate("h100-80gb:2");
    node.cli(&["sim", "create", "--gpu", "0", "--profile", "1g.10gb", "--placement", "0"]);
    node.cli(&["sim", "fail", "list-gi=gpu-is-lost#1"]);
    let picture = node.cli(&["layout"]);
    let line = |gpu: &str| picture.lines().find(|l| l.starts_with(gpu)).unwrap_or_default().to_string();
    assert!(line("GPU 1 ").contains("LOST (GPU_IS_LOST"), "{picture}");
    assert!(!line("GPU 0 ").contains("LOST") && picture.contains("1g.10gb"), "{picture}");
    let json = node.layout();
    assert_eq!(json["gpus"][1]["lost"], true, "{json}");
    assert!(json["gpus"][0].get("lost").is_none() && json["gpus"][0]["instances"].as_array().unwrap().len() == 1);
    let status = node.command(&["status", "-o", "json"]).json();
    let lost: Vec<bool> = status["gpus"].as_array().unwrap().iter().map(|g| g["lost"] == true).collect();
    assert_eq!(lost, [false, true], "{status}");
    assert!(node.cli(&["status"]).lines().nth(2).is_some_and(|l| l.contains("LOST")));
}

/// Linked as `kubectl-migdra`, the binary is the kubectl plugin: its help says `kubectl migdra`,
/// lists its two commands and only the flags they read, none of the node daemon's.
#[test]
fn the_kubectl_plugin_has_a_help_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = command::kubectl_plugin(dir.path());
    let help = |args: &[&str]| {
        let out = command::scrubbed(&plugin).args(args).run();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let top = help(&["--help"]);
    assert!(top.contains("Usage: kubectl migdra"), "{top}");
    for command in ["usage", "why"] {
        assert!(top.lines().any(|l| l.trim_start().starts_with(command)), "{command} missing:\n{top}");
    }
    for command in ["serve", "claims", "cleanup", "status"] {
        assert!(!top.lines().any(|l| l.trim_start().starts_with(command)), "the plugin lists {command}:\n{top}");
    }
    for flag in ["--sim", "--plugin-dir", "--nvml-lib"] {
        assert!(!top.contains(flag), "the plugin's help names {flag}:\n{top}");
    }
    let why = help(&["why", "--help"]);
    assert!(why.contains("Usage: kubectl migdra why"), "{why}");
    let options: Vec<&str> =
        why.lines().map(str::trim_start).filter(|l| l.starts_with("-") && !l.starts_with("- ")).collect();
    for wanted in ["-n, --namespace", "-o, --output", "--driver-name", "--kubeconfig", "-h, --help"] {
        assert!(options.iter().any(|o| o.starts_with(wanted)), "{wanted} missing: {options:?}");
    }
    assert!(options.len() <= 6, "only what why reads: {options:?}");
    let usage = help(&["usage", "--help"]);
    for wanted in ["--node <NAME>", "-l, --selector <SELECTOR>", "--summary"] {
        assert!(usage.contains(wanted), "{wanted} missing:\n{usage}");
    }
    // The same binary under its own name keeps the node's command line.
    assert!(ok(&["--help"]).contains("serve"));
}
