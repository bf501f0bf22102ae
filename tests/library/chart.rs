//! The Helm chart (daemonset/helm/migdra) against the kustomize base it must not drift from.
//!
//! - `helm template` with default values renders exactly the objects of `kustomize build
//!   daemonset/`, object by object (kind, namespace and name, then every field); and with each
//!   overlay's values file (`ci/<overlay>-values.yaml`) exactly the objects of that overlay. The
//!   differences are printed as JSON pointers. Two things are allowed, and checked to be only
//!   that: Helm's four standard labels on each object's `metadata.labels` (and nowhere else), and
//!   the Namespace, which `helm install --create-namespace` makes and the chart renders only with
//!   `namespace.create=true` (then exactly the base's).
//! - The packaged chart (`helm package`) renders what the directory does: files/ holds links into
//!   daemonset/base/, so the DeviceClasses (`migdra device-classes`, checked by tests/process/cli.rs) and
//!   the Slurm index map exist once.
//! - The values: the schema's choices are the CLI's, every value is in daemonset/README.md's
//!   table with its default, and setting them renders what `migdra serve` reads.
//! - One release serves a mixed fleet: the libnvidia-ml each architecture's pod would load, on
//!   fake driver roots laid out like the hosts.
//!
//! The typed round trip, CEL and RBAC checks of tests/library/manifests.rs also run on the chart's
//! renders; tests/controlplane.rs applies the chart's render to a real API server.
#![allow(clippy::print_stdout)] // the tests report what they compared

use crate::support::render::{self, CHART, CHART_VALUES_DIR, HELM, KUSTOMIZE, NAMESPACE, RELEASE, repo};
use clap::CommandFactory;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// The labels Helm's conventions put on every object, which the kustomize base does not have.
const HELM_LABELS: [&str; 4] =
    ["helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"];

/// kind, namespace ("" when cluster-scoped), name.
type Key = (String, String, String);

fn key(v: &Value) -> Key {
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
    (s("/kind"), s("/metadata/namespace"), s("/metadata/name"))
}

fn show(k: &Key) -> String {
    if k.1.is_empty() { format!("{} {}", k.0, k.2) } else { format!("{} {}/{}", k.0, k.1, k.2) }
}

/// Objects by key; a key seen twice is a failure.
fn by_key(source: &str, docs: Vec<Value>, failures: &mut Vec<String>) -> BTreeMap<Key, Value> {
    let mut out = BTreeMap::new();
    for d in docs {
        let k = key(&d);
        if out.insert(k.clone(), d).is_some() {
            failures.push(format!("{source}: {} twice", show(&k)));
        }
    }
    out
}

/// Where `a` and `b` differ, as JSON pointers.
fn differences(at: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                let path = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => differences(&path, va, vb, out),
                    (Some(va), None) => out.push(format!("{path}: {va} is missing")),
                    (None, Some(vb)) => out.push(format!("{path}: {vb} is extra")),
                    (None, None) => unreachable!(),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                differences(&format!("{at}/{i}"), va, vb, out);
            }
            for (i, va) in x.iter().enumerate().skip(y.len()) {
                out.push(format!("{at}/{i}: {va} is missing"));
            }
            for (i, vb) in y.iter().enumerate().skip(x.len()) {
                out.push(format!("{at}/{i}: {vb} is extra"));
            }
        }
        _ if a != b => out.push(format!("{at}: {a} became {b}")),
        _ => {}
    }
}

/// The chart's object with Helm's labels taken off `metadata.labels` (and the map dropped when
/// nothing else is in it); a failure when any of them is missing or has another value.
fn without_helm_labels(source: &str, mut v: Value, failures: &mut Vec<String>) -> Value {
    let k = show(&key(&v));
    let chart = std::fs::read_to_string(repo().join(CHART).join("Chart.yaml")).unwrap();
    let chart: Value = serde_norway::from_str(&chart).unwrap();
    let want = json!({
        "helm.sh/chart": format!("{}-{}", chart["name"].as_str().unwrap(), chart["version"].as_str().unwrap()),
        "app.kubernetes.io/managed-by": "Helm",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/version": chart["appVersion"],
    });
    let Some(labels) = v.pointer_mut("/metadata/labels").and_then(Value::as_object_mut) else {
        failures.push(format!("{source}: {k} has no labels; Helm's four belong on every object"));
        return v;
    };
    for l in HELM_LABELS {
        match labels.remove(l) {
            Some(got) if got == want[l] => {}
            got => failures.push(format!("{source}: {k} label {l} is {got:?}, not {}", want[l])),
        }
    }
    if labels.is_empty() {
        v["metadata"].as_object_mut().unwrap().remove("labels");
    }
    v
}

/// What differs between the kustomize render and the chart's, object by object. The chart's may
/// lack the Namespace the base renders when `namespace_by_helm` (the chart leaves it to
/// `helm install --create-namespace`).
fn compare(kustomize: (&str, &str), chart: (&str, &str), namespace_by_helm: bool) -> Vec<String> {
    let mut failures = Vec::new();
    let k = by_key(kustomize.0, render::documents(kustomize.0, kustomize.1), &mut failures);
    let docs = render::documents(chart.0, chart.1).into_iter().map(|d| without_helm_labels(chart.0, d, &mut failures));
    let c = by_key(chart.0, docs.collect(), &mut failures);
    for (key, want) in &k {
        let Some(got) = c.get(key) else {
            let created_by_helm = namespace_by_helm && key.0 == "Namespace" && key.2 == NAMESPACE;
            if !created_by_helm
                || want != &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            {
                failures.push(format!("{}: {} is missing", chart.0, show(key)));
            }
            continue;
        };
        let mut diff = Vec::new();
        differences("", want, got, &mut diff);
        failures.extend(diff.into_iter().map(|d| format!("{} {}: {d}", chart.0, show(key))));
    }
    for key in c.keys().filter(|key| !k.contains_key(*key)) {
        failures.push(format!("{}: {} is extra (not in {})", chart.0, show(key), kustomize.0));
    }
    failures
}

/// Both renderers, or `None` (said) where a test may skip.
fn tools() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    Some((KUSTOMIZE.find()?, HELM.find()?))
}

/// `helm template` with default values renders `kustomize build daemonset/` exactly, but for
/// Helm's labels and the Namespace; with `namespace.create=true`, the Namespace too.
#[test]
fn chart_renders_the_kustomize_base_with_default_values() {
    let Some((kustomize, helm)) = tools() else { return };
    let base = render::kustomize_build(&kustomize, "daemonset");
    let defaults = render::helm_template(&helm, &[]);
    let with_namespace = render::helm_template(&helm, &["--set", "namespace.create=true"]);
    let mut failures = compare(("kustomize build daemonset", &base), ("helm template (defaults)", &defaults), true);
    failures.extend(compare(
        ("kustomize build daemonset", &base),
        ("helm template --set namespace.create=true", &with_namespace),
        false,
    ));
    assert!(failures.is_empty(), "the chart drifted from the kustomize base:\n{}", failures.join("\n"));
    println!(
        "chart with default values = kustomize build daemonset: {} objects, Helm's labels and the Namespace aside",
        render::documents("", &defaults).len()
    );
}

/// Each kustomize overlay has a values file in the chart's ci/ directory, and the chart with it
/// renders the overlay exactly.
#[test]
fn chart_renders_each_overlay_with_its_values_file() {
    let Some((kustomize, helm)) = tools() else { return };
    let overlays = repo().join("daemonset/overlays");
    let mut names: Vec<String> = std::fs::read_dir(&overlays)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| overlays.join(n).join("kustomization.yaml").is_file())
        .collect();
    names.sort();
    assert!(names.len() >= 2, "overlays: {names:?}");
    let mut failures = Vec::new();
    for name in &names {
        let values = format!("{CHART_VALUES_DIR}/{name}-values.yaml");
        if !repo().join(&values).is_file() {
            failures.push(format!("overlay {name} has no values file {values}: write the values that render it"));
            continue;
        }
        let dir = format!("daemonset/overlays/{name}");
        let overlay = render::kustomize_build(&kustomize, &dir);
        let chart = render::helm_template(&helm, &["-f", &values]);
        failures.extend(compare(
            (&format!("kustomize build {dir}"), &overlay),
            (&format!("helm template -f {values}"), &chart),
            true,
        ));
    }
    assert!(failures.is_empty(), "the chart drifted from an overlay:\n{}", failures.join("\n"));
    println!("chart with ci/<overlay>-values.yaml = kustomize build daemonset/overlays/<overlay> for {names:?}");
}

/// The comparison reports each kind of drift, with the path.
#[test]
fn comparison_reports_every_drift() {
    let base = r#"
apiVersion: v1
kind: Namespace
metadata: {name: migdra-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: m, namespace: migdra-system, labels: {a: b}}
data: {k: v, l: w}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: s, namespace: migdra-system}
"#;
    let labels = "helm.sh/chart: migdra-0.1.0, app.kubernetes.io/managed-by: Helm, \
                  app.kubernetes.io/instance: migdra, app.kubernetes.io/version: '0.1.0'";
    let same = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: m, namespace: migdra-system, labels: {{a: b, {labels}}}}}\n\
         data: {{k: v, l: w}}\n---\napiVersion: v1\nkind: ServiceAccount\n\
         metadata: {{name: s, namespace: migdra-system, labels: {{{labels}}}}}\n"
    );
    assert_eq!(compare(("k", base), ("c", &same), true), Vec::<String>::new());
    let missing_namespace = compare(("k", base), ("c", &same), false);
    assert_eq!(missing_namespace, ["c: Namespace migdra-system is missing"]);

    let drifted = same
        .replace("k: v", "k: x")
        .replace("l: w", "l: w, extra: 1")
        .replace("name: s", "name: t")
        .replace("app.kubernetes.io/instance: migdra", "app.kubernetes.io/instance: other");
    let got = compare(("k", base), ("c", &drifted), true);
    let want = [
        "c: label app.kubernetes.io/instance is Some(String(\"other\")), not \"migdra\"",
        "c ConfigMap migdra-system/m: /data/k: \"v\" became \"x\"",
        "c ConfigMap migdra-system/m: /data/extra: 1 is extra",
        "c: ServiceAccount migdra-system/s is missing",
        "c: ServiceAccount migdra-system/t is extra (not in k)",
    ];
    for w in want {
        assert!(got.iter().any(|g| g.contains(w.trim_start_matches("c: "))), "{w:?} not in {got:#?}");
    }
    // A Helm label anywhere but metadata.labels is drift, as is an object without them.
    let in_selector = same.replace("data: {k: v, l: w}", "data: {k: v, l: w, helm.sh/chart: migdra-0.1.0}");
    assert!(compare(("k", base), ("c", &in_selector), true).iter().any(|g| g.contains("/data/helm.sh~1chart")));
    let unlabelled = same.replace(&format!("labels: {{{labels}}}"), "labels: {}");
    assert!(compare(("k", base), ("c", &unlabelled), true).iter().any(|g| g.contains("label helm.sh/chart is None")));
}

/// `helm package` keeps what files/ links to: the packaged chart renders what the directory does.
#[test]
fn packaged_chart_renders_as_the_directory() {
    let Some(helm) = HELM.find() else { return };
    for file in ["deviceclasses.yaml", "slurm-index-map.yaml"] {
        let link = repo().join(CHART).join("files").join(file);
        let target = std::fs::read_link(&link).unwrap_or_else(|e| panic!("{}: {e}", link.display()));
        assert_eq!(
            link.parent().unwrap().join(&target).canonicalize().unwrap(),
            repo().join("daemonset/base").join(file).canonicalize().unwrap(),
            "{} must link to daemonset/base/{file}",
            link.display()
        );
    }
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().to_str().unwrap();
    render::run(&helm, &["package", CHART, "-d", dest]);
    let package = std::fs::read_dir(out.path()).unwrap().next().unwrap().unwrap().path();
    let from_package = render::run(
        &helm,
        &["template", RELEASE, package.to_str().unwrap(), "-n", NAMESPACE, "--set", "namespace.create=true"],
    );
    let from_dir = render::helm_template(&helm, &["--set", "namespace.create=true"]);
    assert_eq!(from_package, from_dir, "{} renders differently from {CHART}", package.display());
    let classes = render::documents("package", &from_package).iter().filter(|d| d["kind"] == "DeviceClass").count();
    assert!(classes > 2, "the package renders {classes} DeviceClasses");
    println!("{} renders as {CHART} ({classes} DeviceClasses)", package.file_name().unwrap().to_string_lossy());
}

/// The flag of `migdra serve` that a value sets through its environment variable: the values the
/// schema allows (besides "", migdra's default) are the flag's.
#[test]
fn schema_choices_are_the_cli_choices() {
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join(CHART).join("values.schema.json")).unwrap()).unwrap();
    let cli = migdra::cli::Cli::command();
    let serve = cli.find_subcommand("serve").expect("migdra serve");
    let mut failures = Vec::new();
    for (pointer, flag) in [
        ("/properties/migMode", "mig_mode"),
        ("/properties/deviceOrder", "device_order"),
        ("/properties/deviceNames", "device_names"),
        ("/properties/log/properties/format", "log_format"),
    ] {
        let arg = serve
            .get_arguments()
            .chain(cli.get_arguments())
            .find(|a| a.get_id() == flag)
            .unwrap_or_else(|| panic!("no flag {flag}"));
        let cli_values: BTreeSet<String> = arg.get_possible_values().iter().map(|v| v.get_name().to_string()).collect();
        let schema_values: BTreeSet<String> = schema
            .pointer(&format!("{pointer}/enum"))
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("values.schema.json {pointer} has no enum"))
            .iter()
            .filter_map(Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect();
        if cli_values != schema_values {
            failures
                .push(format!("values.schema.json {pointer}: {schema_values:?}, but --{flag} takes {cli_values:?}"));
        }
    }
    // A plain string flag (its bad values get migdra's one-line error), checked against the list
    // that error names.
    let taint_values: BTreeSet<&str> = migdra::mig::taints::TaintPolicy::VALUES.split(", ").collect();
    let schema_taints: BTreeSet<&str> = schema["properties"]["unhealthyTaintEffect"]["enum"]
        .as_array()
        .expect("values.schema.json unhealthyTaintEffect has an enum")
        .iter()
        .filter_map(Value::as_str)
        .filter(|v| !v.is_empty())
        .collect();
    if schema_taints != taint_values {
        failures.push(format!("unhealthyTaintEffect: {schema_taints:?}, but the flag takes {taint_values:?}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every leaf of values.yaml (a scalar, a list, or an empty map) by its dotted path.
fn leaves(at: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() && at != "nodeSelector" && at != "resources" && !at.ends_with(".labels") => {
            for (k, v) in m {
                let path = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                leaves(&path, v, out);
            }
        }
        _ => {
            out.insert(at.to_string(), v.clone());
        }
    }
}

/// daemonset/README.md's values table has one row per value of values.yaml, each with its
/// default as compact JSON (`""` for an empty string), and nothing else.
#[test]
fn readme_table_lists_every_value_with_its_default() {
    let text = std::fs::read_to_string(repo().join(CHART).join("values.yaml")).unwrap();
    let values: Value = serde_norway::from_str(&text).unwrap();
    let mut want = BTreeMap::new();
    leaves("", &values, &mut want);
    let readme = std::fs::read_to_string(repo().join("daemonset/README.md")).unwrap();
    let table = readme.split("### Helm values").nth(1).expect("daemonset/README.md has no '### Helm values' section");
    let mut got = BTreeMap::new();
    for line in table.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).skip(2) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        let (Some(name), Some(default)) = (cells.first(), cells.get(1)) else { continue };
        got.insert(name.trim_matches('`').to_string(), default.trim_matches('`').to_string());
    }
    let mut failures = Vec::new();
    for (name, value) in &want {
        let json = serde_json::to_string(value).unwrap();
        match got.get(name) {
            None => failures.push(format!("`{name}` (default `{json}`) is not in the table")),
            Some(d) if *d != json => failures.push(format!("`{name}`: the table says `{d}`, values.yaml `{json}`")),
            Some(_) => {}
        }
    }
    for name in got.keys().filter(|n| !want.contains_key(*n)) {
        failures.push(format!("`{name}` is in the table but not in values.yaml"));
    }
    assert!(failures.is_empty(), "daemonset/README.md '### Helm values':\n{}", failures.join("\n"));
    println!("{} values in the README's table", want.len());
}

/// Every value away from its default (`ci/every-value-values.yaml`) renders what migdra reads:
/// each MIGDRA_* variable is a flag's, the Slurm index map parses with migdra's own parser, the
/// metrics port is the address's; and a bad value is refused with the value named.
#[test]
fn values_render_what_migdra_reads() {
    let Some(helm) = HELM.find() else { return };
    let file = format!("{CHART_VALUES_DIR}/every-value-values.yaml");
    let docs = render::documents(&file, &render::helm_template(&helm, &["-f", &file]));
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let env: BTreeMap<&str, &str> =
        c["env"].as_array().unwrap().iter().filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?))).collect();
    let known = render::cli_env();
    for name in env.keys().filter(|n| n.starts_with("MIGDRA_")) {
        assert!(known.contains(*name), "{name}: no migdra flag reads it");
    }
    let expected = [
        ("MIGDRA_MIG_MODE", "static"),
        ("MIGDRA_DEVICE_ORDER", "ascending"),
        ("MIGDRA_DEVICE_NAMES", "slurm"),
        ("MIGDRA_UNHEALTHY_TAINT_EFFECT", "NoExecute"),
        ("MIGDRA_PROFILES", "1g.10gb,3g.40gb,7g.80gb"),
        ("MIGDRA_LOG_LEVEL", "debug"),
        ("MIGDRA_LOG_FORMAT", "text"),
        ("MIGDRA_METRICS_ADDR", "0.0.0.0:9400"),
        ("MIGDRA_METRICS_ALLOW_REMOTE", "true"),
        ("MIGDRA_NVML_LIB", "/driver-root/usr/lib64/libnvidia-ml.so.1"),
        ("MIGDRA_DRIVER_ROOT", "/driver-root"),
        ("MIGDRA_ORPHANS", "report"),
        ("MIGDRA_PLUGIN_DIR", "/var/lib/k0s/kubelet/plugins/mig.slinky.slurm.net"),
        ("MIGDRA_REGISTRY_DIR", "/var/lib/k0s/kubelet/plugins_registry"),
        ("MIGDRA_SIM", "h100-80gb:1,a100-40gb:1:mig-off"),
        ("MIGDRA_SIM_STATE", "/var/lib/migdra-sim/gpus.json"),
        ("MIGDRA_HOST_ROOT", "/driver-root"),
    ];
    for (name, value) in expected {
        assert_eq!(env.get(name).copied(), Some(value), "{name} in {env:?}");
    }
    assert_eq!(c["ports"], json!([{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]));
    assert_eq!(c["image"], "registry.example.com/migdra:0.1.1");
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(pod["nodeSelector"], json!({"nvidia.com/mig.capable": "true"}));
    assert!(pod.get("priorityClassName").is_none(), "an empty priorityClassName renders none");
    let volume = |name: &str| pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == name).unwrap().clone();
    assert_eq!(volume("driver-root")["hostPath"]["path"], "/run/nvidia/driver");
    assert_eq!(volume("slurm-conf")["hostPath"]["path"], "/etc/slurm-llnl");
    // Under another kubelet root dir the sockets sit at the same paths inside and outside, since
    // the kubelet dials the path migdra registers.
    let mount = |name: &str| c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap().clone();
    for (name, path) in [
        ("plugin-dir", "/var/lib/k0s/kubelet/plugins/mig.slinky.slurm.net"),
        ("registry-dir", "/var/lib/k0s/kubelet/plugins_registry"),
        ("simulation-state", "/var/lib/migdra-sim"),
    ] {
        assert_eq!(volume(name)["hostPath"]["path"], path, "{name}");
        assert_eq!(mount(name)["mountPath"], path, "{name}");
    }
    assert_eq!(volume("scratch")["emptyDir"], json!({}));
    assert_eq!(mount("scratch")["mountPath"], "/scratch");
    assert!(!docs.iter().any(|d| d["kind"] == "DeviceClass"), "deviceClasses.create=false renders none");

    let map =
        docs.iter().find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "migdra-slurm-index-map").unwrap();
    let text = map["data"]["slurm-index-map.yaml"].as_str().unwrap();
    let parsed = migdra::slurm::indexmap::parse(text, std::path::Path::new("slurm-index-map.yaml"))
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(parsed.len(), 3, "{parsed:?} from\n{text}");
    assert!(format!("{parsed:?}").contains("0000:18:00.0"), "the PCI bus ID 0000:18:00.0 stays a key: {parsed:?}");

    // A value outside the schema fails, naming the value and what it may be.
    let out = std::process::Command::new(&helm)
        .args(["template", RELEASE, CHART, "-n", NAMESPACE, "--set", "migMode=dynamc"])
        .current_dir(repo())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("/migMode") && err.contains("'static'"), "{err}");
}

/// The migdra container's environment in a render (name → value, plain values only), and the
/// path its `driver-root` volume is mounted at.
fn container_env(text: &str) -> (BTreeMap<String, String>, String) {
    let docs = render::documents("helm template", text);
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let c = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "migdra")
        .expect("a migdra container");
    let env = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
        .collect();
    let mount =
        c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "driver-root").expect("a driver-root mount");
    (env, mount["mountPath"].as_str().unwrap().to_string())
}

/// One release for a mixed fleet. With `driver.nvmlLib` empty (the default) the chart names only
/// the driver root, and each pod loads the libnvidia-ml.so.1 of its own architecture from it: on
/// fake driver roots laid out like an x86-64 Debian host, a Grace (aarch64) Ubuntu host and a
/// RHEL-like host (each also holding a stale copy in usr/lib, which must lose), `migdra`'s own
/// lookup picks the right file for `x86_64` and `aarch64`. With `driver.nvmlLib` set, that file
/// is what every node loads, whatever its architecture or layout.
#[test]
fn each_architecture_loads_its_own_nvml() {
    use migdra::gpu::nvml::locate::{Choice, choose};
    use std::path::{Path, PathBuf};
    let Some(helm) = HELM.find() else { return };

    let hosts = tempfile::tempdir().unwrap();
    let lib = "libnvidia-ml.so.1";
    for (host, dir) in [
        ("debian-x86", "usr/lib/x86_64-linux-gnu"),
        ("grace-arm", "usr/lib/aarch64-linux-gnu"),
        ("rhel", "usr/lib64"),
        ("debian-x86", "usr/lib"),
        ("grace-arm", "usr/lib"),
        ("rhel", "usr/lib"),
    ] {
        let d = hosts.path().join(host).join(dir);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(lib), format!("{host}/{dir}")).unwrap();
    }
    // A container path under the driver root's mount, as it is on `host`'s fake root.
    let on_host = |mount: &str, host: &str, path: &str| -> PathBuf {
        let rel = path.strip_prefix(mount).unwrap_or_else(|| panic!("{path} is not under the mount {mount}"));
        hosts.path().join(host).join(rel.trim_start_matches('/'))
    };
    // What a pod of `arch` on `host` would load with this environment, as a container path.
    let loads = |env: &BTreeMap<String, String>, mount: &str, host: &str, arch: &str| -> String {
        let root = env.get("MIGDRA_DRIVER_ROOT").map(|r| on_host(mount, host, r));
        let explicit = env.get("MIGDRA_NVML_LIB").map(|l| on_host(mount, host, l));
        let chosen = match choose(explicit.as_deref(), root.as_deref(), arch, Path::exists) {
            Choice::Explicit(p) | Choice::Found(p) => p,
            other => panic!("{arch} on {host}: nothing under the driver root ({other:?})"),
        };
        let rel = chosen.strip_prefix(hosts.path().join(host)).unwrap();
        format!("{mount}/{}", rel.display())
    };

    let (env, mount) = container_env(&render::helm_template(&helm, &[]));
    assert_eq!(env.get("MIGDRA_DRIVER_ROOT"), Some(&mount), "the driver root is its mount: {env:?}");
    assert!(!env.contains_key("MIGDRA_NVML_LIB"), "the default names no library: {env:?}");
    for (host, arch, want) in [
        ("debian-x86", "x86_64", "usr/lib/x86_64-linux-gnu"),
        ("grace-arm", "aarch64", "usr/lib/aarch64-linux-gnu"),
        ("rhel", "x86_64", "usr/lib64"),
        ("rhel", "aarch64", "usr/lib64"),
    ] {
        let got = loads(&env, &mount, host, arch);
        assert_eq!(got, format!("{mount}/{want}/{lib}"), "{arch} pod on {host}");
        println!("default values, {arch} pod on {host}: {got}");
    }

    let set = "usr/lib64/libnvidia-ml.so.1";
    let (env, mount) = container_env(&render::helm_template(&helm, &["--set", &format!("driver.nvmlLib={set}")]));
    assert_eq!(env.get("MIGDRA_NVML_LIB"), Some(&format!("{mount}/{set}")), "{env:?}");
    for (host, arch) in [("debian-x86", "x86_64"), ("grace-arm", "aarch64"), ("rhel", "aarch64")] {
        let got = loads(&env, &mount, host, arch);
        assert_eq!(got, format!("{mount}/{set}"), "driver.nvmlLib wins for the {arch} pod on {host}");
    }
    println!("driver.nvmlLib={set}: every pod loads {mount}/{set}");
}

/// Labels a scrape adds to every series: the target's (`instance`, `job`, and the pod's
/// `namespace`, `pod`, `container` from the Prometheus Operator) and the PodMonitor's `node`.
const TARGET_LABELS: [&str; 6] = ["instance", "job", "namespace", "pod", "container", "node"];

/// What one PromQL expression names: each `migdra_*` series with the labels of its matchers, and
/// the labels of every `by (…)`/`without (…)` clause.
#[derive(Debug, Default)]
struct Query {
    series: Vec<(String, Vec<String>)>,
    grouping: Vec<String>,
}

/// Scan a PromQL expression for what it names: identifiers, `{…}` matchers after a series and
/// `by`/`without` label lists. Enough for the chart's queries; strings are skipped whole. Not
/// `promql-parser`: this test asks only which series and labels a query names (against the
/// registry), not whether Prometheus accepts it, and that crate's LR parser generator (grmtools,
/// compiled by its build script) would join every cold build of this binary for that.
fn scan_promql(expr: &str) -> Query {
    let b = expr.as_bytes();
    let ident = |i: usize| {
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] == b':') {
            j += 1;
        }
        j
    };
    let list = |from: usize, close: u8| -> (Vec<String>, usize) {
        // Names before an operator (matchers) or alone (a label list); quoted values skipped.
        let (mut names, mut i, mut expect_name) = (Vec::new(), from, true);
        while i < b.len() && b[i] != close {
            match b[i] {
                b'"' => {
                    i += 1;
                    while i < b.len() && b[i] != b'"' {
                        i += if b[i] == b'\\' { 2 } else { 1 };
                    }
                    i += 1;
                }
                b',' => {
                    expect_name = true;
                    i += 1;
                }
                c if expect_name && (c.is_ascii_alphabetic() || c == b'_') => {
                    let j = ident(i);
                    names.push(expr[i..j].to_string());
                    expect_name = false;
                    i = j;
                }
                _ => i += 1,
            }
        }
        (names, i + 1)
    };
    let mut q = Query::default();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let j = ident(i);
            let word = &expr[i..j];
            let mut k = j;
            while k < b.len() && b[k] == b' ' {
                k += 1;
            }
            if (word == "by" || word == "without") && k < b.len() && b[k] == b'(' {
                let (names, end) = list(k + 1, b')');
                q.grouping.extend(names);
                i = end;
            } else if word.starts_with("migdra_") {
                let (labels, end) = if k < b.len() && b[k] == b'{' { list(k + 1, b'}') } else { (Vec::new(), j) };
                q.series.push((word.to_string(), labels));
                i = end;
            } else {
                i = j;
            }
        } else {
            i += 1;
        }
    }
    q
}

/// Every problem with `expr` against migdra's metric registry; `shown`: the labels a legend or an
/// alert's annotations take from its result.
fn check_query(expr: &str, shown: &[String]) -> Vec<String> {
    let q = scan_promql(expr);
    let mut problems = Vec::new();
    if q.series.is_empty() {
        problems.push(format!("{expr}: queries no migdra series"));
    }
    let mut available: BTreeSet<String> = BTreeSet::new();
    for (name, labels) in &q.series {
        let family = migdra::metrics::FAMILIES.iter().find(|f| {
            name == f.name
                || (f.kind == "histogram"
                    && ["_bucket", "_sum", "_count"].iter().any(|s| *name == format!("{}{s}", f.name)))
        });
        let Some(family) = family else {
            problems.push(format!("{expr}: {name} is not a metric migdra serves"));
            continue;
        };
        let mut own: BTreeSet<String> = family.labels.iter().map(|l| (*l).to_string()).collect();
        if name.ends_with("_bucket") {
            own.insert("le".into());
        }
        for l in labels.iter().filter(|l| !own.contains(*l)) {
            problems.push(format!("{expr}: {name} has no label {l} (it has {own:?})"));
        }
        available.extend(own);
    }
    available.extend(TARGET_LABELS.iter().map(|l| (*l).to_string()));
    for l in q.grouping.iter().filter(|l| !available.contains(*l)) {
        problems.push(format!("{expr}: groups by {l}, which none of its series has"));
    }
    // An aggregation keeps only its grouping labels.
    let result: BTreeSet<String> = if q.grouping.is_empty() { available } else { q.grouping.into_iter().collect() };
    for l in shown.iter().filter(|l| !result.contains(*l)) {
        problems.push(format!("{expr}: shows label {l}, which its result does not have ({result:?})"));
    }
    problems
}

/// The label names `{{name}}` (a Grafana legend) or `$labels.name` (an alert's template) take.
fn shown_labels(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in text.split("{{").skip(1) {
        let inner = part.split("}}").next().unwrap_or_default().trim();
        let name = inner.strip_prefix("$labels.").unwrap_or(inner);
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(name.to_string());
        }
    }
    out
}

/// The chart's dashboard, alerts and PodMonitor query only metrics migdra serves, with labels
/// they have: each expression is checked against `migdra::metrics::FAMILIES`, which a unit test
/// checks against what a scrape returns.
#[test]
fn dashboard_and_alerts_query_only_what_migdra_serves() {
    let Some(helm) = HELM.find() else { return };
    let text = render::helm_template(
        &helm,
        &[
            "--set",
            "monitoring.dashboard.enabled=true,monitoring.prometheusRule.enabled=true,\
             monitoring.podMonitor.enabled=true",
            "--set",
            "metrics.addr=0.0.0.0:9400,metrics.allowRemote=true",
        ],
    );
    let docs = render::documents("helm template (monitoring)", &text);
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
    };
    let mut problems = Vec::new();
    let mut checked = 0;

    let dashboard: Value =
        serde_json::from_str(find("ConfigMap", "migdra-dashboard")["data"]["migdra.json"].as_str().unwrap()).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        let targets = panel["targets"].as_array().map_or(&[][..], Vec::as_slice);
        if targets.is_empty() {
            problems.push(format!("panel {} has no query", panel["title"]));
        }
        for t in targets {
            let shown = shown_labels(t["legendFormat"].as_str().unwrap_or_default());
            problems.extend(check_query(t["expr"].as_str().unwrap_or_default(), &shown));
            checked += 1;
        }
    }
    for rule in find("PrometheusRule", "migdra")["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let name = rule["alert"].as_str().unwrap_or_default();
        let annotations = rule["annotations"].as_object().unwrap();
        for key in ["summary", "description"] {
            if annotations.get(key).and_then(Value::as_str).is_none_or(str::is_empty) {
                problems.push(format!("alert {name} has no {key}"));
            }
        }
        if !["info", "warning", "critical"].contains(&rule["labels"]["severity"].as_str().unwrap_or_default()) {
            problems.push(format!("alert {name}: severity must be info, warning or critical"));
        }
        let shown: Vec<String> = annotations.values().filter_map(Value::as_str).flat_map(shown_labels).collect();
        problems.extend(check_query(rule["expr"].as_str().unwrap_or_default(), &shown));
        checked += 1;
    }
    let endpoint = &find("PodMonitor", "migdra")["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], "metrics", "the PodMonitor scrapes the container port the chart names");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    println!("{checked} queries (dashboard and alerts) name only migdra's metrics and their labels");

    // The checks can fail: each broken query is caught.
    for (expr, shown, want) in [
        ("sum(rate(migdra_prepares_total[5m]))", vec![], "is not a metric migdra serves"),
        ("migdra_errors_total{op=\"prepare\"}", vec![], "has no label op"),
        ("sum by (gpu) (migdra_errors_total)", vec![], "groups by gpu"),
        ("sum by (node) (migdra_errors_total)", vec!["reason".to_string()], "shows label reason"),
        ("histogram_quantile(0.9, sum by (le) (rate(migdra_errors_total_bucket[5m])))", vec![], "not a metric"),
    ] {
        let got = check_query(expr, &shown);
        assert!(got.iter().any(|p| p.contains(want)), "{expr}: {got:?}");
    }
}
