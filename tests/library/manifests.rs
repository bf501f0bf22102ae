//! The manifests in daemonset/ against the code that runs them.
//!
//! - Every YAML document parses into its typed k8s-openapi object and serializes back to the same
//!   JSON, so no field is misspelled, misplaced or silently dropped (k8s-openapi ignores unknown
//!   fields; the round trip is what notices them). The same holds for what `kustomize build`
//!   renders from each kustomization and `helm template` from the chart (default values and each
//!   `daemonset/helm/migdra/ci/*-values.yaml`), when the binaries are at hand (tests/support/
//!   render.rs finds them; .ci/run requires them); `hack/render-daemonset.sh` and
//!   `hack/render-chart.sh` render them in CI.
//! - The CEL of the DeviceClasses and claim templates names only attributes and capacities that
//!   migdra publishes, taken from `migdra::mig::devices` for every catalog model and mode, and
//!   compares `type`, `profile`, `migMode` and `architecture` only with values they can take.
//! - The ClusterRole allows every call in `migdra::kube::api_calls::API_CALLS`, and each of its
//!   rules is used by one or is an allowance listed here with its reason, in rbac.yaml and in
//!   every render; the list itself is checked against the `kube::Api` calls in `src/`.
//! - The DaemonSet agrees with the code: socket paths in the probes, downward-API variables,
//!   kubelet directories, the service account of the RBAC and of the admission policy, `MIGDRA_*`
//!   variables the CLI reads, and the Slurm index map's file and format.
#![allow(clippy::print_stdout)] // the tests report what they checked and the kustomize renders

use crate::support::render;

use clap::CommandFactory;
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use migdra::kube::api_calls::{API_CALLS, ApiCall, NON_RESOURCE_CALLS, OPERATOR_CALLS, ObjectName};
use migdra::mig::{catalog, devices};
use serde::Serialize;
use serde::de::{Deserialize, DeserializeOwned};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Everything the test reads lives under this directory.
const MANIFESTS: &str = "daemonset";

// === the documents ===

/// One YAML document and where it came from.
#[derive(Debug, Clone)]
struct Doc {
    source: String,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or("")
    }

    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or("")
    }

    fn typed<T: DeserializeOwned>(&self) -> T {
        serde_json::from_value(self.value.clone()).unwrap_or_else(|e| panic!("{}: {e}", self.source))
    }
}

fn is_kustomization(path: &Path) -> bool {
    matches!(path.file_name().and_then(|n| n.to_str()), Some("kustomization.yaml" | "kustomization.yml"))
}

/// Directories of daemonset/ without Kubernetes objects: slurm-bridge's configuration for
/// migdra's classes (tests/process/cli.rs checks it against `migdra device-classes --slurm-bridge`), and
/// the Helm chart, whose templates are checked through their renders.
const NOT_MANIFESTS: [&str; 2] = ["slurm-bridge", "helm"];

/// Every YAML file under daemonset/ that holds Kubernetes objects, sorted.
fn yaml_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() && path.file_name().is_some_and(|n| NOT_MANIFESTS.iter().any(|m| n == *m)) {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join(MANIFESTS), &mut out);
    out.sort();
    assert!(!out.is_empty(), "no YAML under {MANIFESTS}/");
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(repo()).unwrap_or(path).display().to_string()
}

/// The documents of a YAML text, empty ones left out.
fn parse_documents(source: &str, text: &str) -> Vec<Doc> {
    serde_norway::Deserializer::from_str(text)
        .enumerate()
        .map(|(i, d)| {
            let value = Value::deserialize(d).unwrap_or_else(|e| panic!("{source}: document {i}: {e}"));
            Doc { source: format!("{source} #{i}"), value }
        })
        .filter(|d| !d.value.is_null())
        .collect()
}

fn file_documents(path: &Path) -> Vec<Doc> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_documents(&relative(path), &text)
}

/// The Kubernetes objects in daemonset/'s files (kustomizations are kustomize's, not the API's).
fn file_objects() -> Vec<Doc> {
    yaml_files().iter().filter(|p| !is_kustomization(p)).flat_map(|p| file_documents(p)).collect()
}

/// Directories holding a kustomization.yaml, relative to the repository.
fn kustomize_dirs() -> Vec<String> {
    yaml_files().iter().filter(|p| is_kustomization(p)).map(|p| relative(p.parent().unwrap())).collect()
}

/// A render's command (`kustomize build DIR`, `helm template … -f FILE`) and its objects.
type Render = (String, Vec<Doc>);

/// `kustomize build` of every kustomization, then `helm template` of the chart with its default
/// values and with each of its values files; each renderer's are left out (said) without its
/// binary, unless `MIGDRA_REQUIRE_RENDERS=1`.
fn renders() -> &'static [Render] {
    static RENDERS: OnceLock<Vec<Render>> = OnceLock::new();
    RENDERS.get_or_init(|| {
        let mut renders = Vec::new();
        let mut add = |what: String, text: String| {
            let docs = parse_documents(&what, &text);
            assert!(!docs.is_empty(), "{what} rendered nothing");
            renders.push((what, docs));
        };
        if let Some(bin) = render::KUSTOMIZE.find() {
            for dir in kustomize_dirs() {
                add(format!("kustomize build {dir}"), render::kustomize_build(&bin, &dir));
            }
        }
        if let Some(bin) = render::HELM.find() {
            add(format!("helm template {}", render::CHART), render::helm_template(&bin, &[]));
            for file in render::chart_values_files() {
                add(format!("helm template {} -f {file}", render::CHART), render::helm_template(&bin, &["-f", &file]));
            }
        }
        renders
    })
}

/// The files' objects, then every render's.
fn all_objects() -> Vec<Doc> {
    let mut docs = file_objects();
    for (_, rendered) in renders() {
        docs.extend(rendered.iter().cloned());
    }
    docs
}

// === typed round trip ===

type RoundTrip = fn(&Value) -> Result<Value, String>;

fn round_trip<T: DeserializeOwned + Serialize>(v: &Value) -> Result<Value, String> {
    let t: T = serde_json::from_value(v.clone()).map_err(|e| format!("does not parse: {e}"))?;
    serde_json::to_value(&t).map_err(|e| format!("does not serialize: {e}"))
}

fn typed<T: k8s_openapi::Resource + DeserializeOwned + Serialize>() -> (&'static str, &'static str, RoundTrip) {
    (T::API_VERSION, T::KIND, round_trip::<T>)
}

/// The kinds daemonset/ may hold; a new kind needs a line here.
fn kinds() -> Vec<(&'static str, &'static str, RoundTrip)> {
    vec![
        typed::<Namespace>(),
        typed::<ServiceAccount>(),
        typed::<ConfigMap>(),
        typed::<Pod>(),
        typed::<DaemonSet>(),
        typed::<ClusterRole>(),
        typed::<ClusterRoleBinding>(),
        typed::<Role>(),
        typed::<RoleBinding>(),
        typed::<ValidatingAdmissionPolicy>(),
        typed::<ValidatingAdmissionPolicyBinding>(),
        typed::<DeviceClass>(),
        typed::<ResourceClaimTemplate>(),
        typed::<ResourceClaim>(),
        mirrored::<monitoring::PodMonitor>("monitoring.coreos.com/v1", "PodMonitor"),
        mirrored::<monitoring::PrometheusRule>("monitoring.coreos.com/v1", "PrometheusRule"),
    ]
}

/// A kind without a Kubernetes crate's type, checked against our mirror of its schema.
fn mirrored<T: DeserializeOwned + Serialize>(
    api_version: &'static str,
    kind: &'static str,
) -> (&'static str, &'static str, RoundTrip) {
    (api_version, kind, round_trip::<T>)
}

/// The Prometheus Operator's PodMonitor and PrometheusRule (monitoring.coreos.com/v1), which no
/// Kubernetes crate has: the fields the chart writes, with the operator's names and types, and no
/// other (a misspelt or misplaced field fails the round trip).
mod monitoring {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use serde::{Deserialize, Serialize};
    use std::collections::BTreeMap;

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PodMonitor {
        api_version: String,
        kind: String,
        metadata: ObjectMeta,
        spec: PodMonitorSpec,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct PodMonitorSpec {
        selector: LabelSelector,
        pod_metrics_endpoints: Vec<PodMetricsEndpoint>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct PodMetricsEndpoint {
        port: String,
        path: String,
        interval: String,
        relabelings: Vec<Relabeling>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Relabeling {
        source_labels: Vec<String>,
        target_label: String,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PrometheusRule {
        api_version: String,
        kind: String,
        metadata: ObjectMeta,
        spec: RuleSpec,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RuleSpec {
        groups: Vec<RuleGroup>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RuleGroup {
        name: String,
        rules: Vec<Rule>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rule {
        alert: String,
        expr: String,
        #[serde(rename = "for", skip_serializing_if = "Option::is_none")]
        for_: Option<String>,
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
    }
}

/// Where `a` and `b` differ, as JSON pointers.
fn differences(at: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                let (va, vb) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                differences(&format!("{at}/{k}"), va, vb, out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                differences(&format!("{at}/{i}"), va, vb, out);
            }
        }
        _ if a != b => out.push(format!("{at}: {a} became {b}")),
        _ => {}
    }
}

/// Every document of every manifest, and of every render, parses into the typed object of its
/// apiVersion and kind and serializes back to the same JSON.
#[test]
fn every_manifest_round_trips_through_its_typed_object() {
    let kinds = kinds();
    let mut failures = Vec::new();
    let mut checked = BTreeMap::<String, usize>::new();
    for doc in all_objects() {
        let api_version = doc.value["apiVersion"].as_str().unwrap_or("");
        let Some((_, _, round_trip)) = kinds.iter().find(|(v, k, _)| *v == api_version && *k == doc.kind()) else {
            failures.push(format!("{}: {api_version} {} is not a kind this test knows", doc.source, doc.kind()));
            continue;
        };
        match round_trip(&doc.value) {
            Err(e) => failures.push(format!("{}: {e}", doc.source)),
            Ok(back) => {
                let mut diff = Vec::new();
                differences("", &doc.value, &back, &mut diff);
                for d in diff {
                    failures.push(format!("{} ({} {}): {d}", doc.source, doc.kind(), doc.name()));
                }
            }
        }
        *checked.entry(doc.kind().to_string()).or_default() += 1;
    }
    println!("round-tripped: {checked:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for kind in ["DaemonSet", "ClusterRole", "DeviceClass", "ResourceClaimTemplate", "ConfigMap", "Pod"] {
        assert!(checked.contains_key(kind), "no {kind} in {MANIFESTS}/");
    }
}

/// The round trip notices a misspelled field, which plain parsing would ignore.
#[test]
fn round_trip_notices_an_unknown_field() {
    let doc = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "x"},
        "spec": {"selector": [{"cel": {"expression": "true"}}]},
    });
    let (_, _, round_trip) = typed::<DeviceClass>();
    let mut diff = Vec::new();
    differences("", &doc, &round_trip(&doc).unwrap(), &mut diff);
    assert_eq!(diff, [r#"/spec/selector: [{"cel":{"expression":"true"}}] became null"#]);
}

/// Each kustomization names files and directories that exist, and every manifest file is named
/// by one, so none is left out of what an admin applies.
#[test]
fn kustomizations_name_every_manifest() {
    let mut named = BTreeSet::new();
    let mut failures = Vec::new();
    for path in yaml_files().iter().filter(|p| is_kustomization(p)) {
        let dir = path.parent().unwrap();
        for doc in file_documents(path) {
            assert_eq!(doc.value["apiVersion"], "kustomize.config.k8s.io/v1beta1", "{}", doc.source);
            assert_eq!(doc.kind(), "Kustomization", "{}", doc.source);
            let resources = doc.value["resources"].as_array().cloned().unwrap_or_default();
            for r in resources.iter().filter_map(Value::as_str) {
                let target = dir.join(r);
                match target.canonicalize() {
                    Ok(t) if t.is_dir() && !t.join("kustomization.yaml").is_file() => {
                        failures.push(format!("{}: {r} is a directory without kustomization.yaml", doc.source));
                    }
                    Ok(t) => {
                        named.insert(t);
                    }
                    Err(e) => failures.push(format!("{}: {r}: {e}", doc.source)),
                }
            }
        }
    }
    for path in yaml_files().iter().filter(|p| !is_kustomization(p)) {
        if !named.contains(&path.canonicalize().unwrap()) {
            failures.push(format!("{} is in no kustomization's resources", relative(path)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("rendered: {:?}", renders().iter().map(|(d, docs)| (d, docs.len())).collect::<Vec<_>>());
}

// === CEL against the published attributes ===

/// The CLI's default for a flag (`driver_name`, `registry_dir`, `cdi_dir`).
fn cli_default(id: &str) -> String {
    let cmd = migdra::cli::Cli::command();
    let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap_or_else(|| panic!("no flag {id}"));
    arg.get_default_values().first().unwrap_or_else(|| panic!("{id} has no default")).to_string_lossy().into_owned()
}

fn driver() -> String {
    cli_default("driver_name")
}

/// What migdra publishes, over every catalog model in every mode.
struct Published {
    /// Qualified attribute names (`mig.slinky.slurm.net/profile`, `resource.kubernetes.io/pciBusID`).
    attributes: BTreeSet<String>,
    /// Qualified capacity names.
    capacities: BTreeSet<String>,
    /// The values string attributes that do not depend on the hardware at hand can take.
    values: BTreeMap<String, BTreeSet<String>>,
}

/// Attributes whose values come from the catalog and the mode, not from one GPU.
const ENUMERATED: &[&str] = &["type", "profile", "migMode", "architecture"];

fn qualify(driver: &str, key: &str) -> String {
    if key.contains('/') { key.to_string() } else { format!("{driver}/{key}") }
}

fn published(driver: &str) -> Published {
    let mut p = Published { attributes: BTreeSet::new(), capacities: BTreeSet::new(), values: BTreeMap::new() };
    for model in catalog::models() {
        let gpu = devices::GpuIdentity {
            index: 0,
            minor: 0,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            pci_bus_id: "0000:3b:00.0".into(),
            product_name: model.product_name.clone(),
            memory_mib: model.memory_mib,
            driver_version: "580.95.05".into(),
            cuda_compute_capability: model.cuda_compute_capability,
            slurm_index: Some(0),
            slurm_index_source: "gres.conf".into(),
            shards_per_gpu: 8,
            topology: devices::Topology { pcie_root: Some("pci0000:37".into()), numa_node: Some(0) },
        };
        let existing: Vec<devices::ExistingInstance> = model
            .profiles
            .iter()
            .map(|prof| devices::ExistingInstance {
                profile_id: prof.id,
                start: prof.placements[0],
                uuid: "MIG-00000000-0000-0000-0000-000000000000".into(),
                slurm_index: Some(1),
            })
            .collect();
        use migdra::mig::naming::NameStyle::Minor;
        let all = [
            devices::gpu_devices(
                model,
                &gpu,
                devices::GpuMode::Full,
                false,
                &[],
                Minor,
                &migdra::mig::allowlist::Allowlist::all(),
            ),
            devices::gpu_devices(
                model,
                &gpu,
                devices::GpuMode::Dynamic,
                true,
                &existing,
                Minor,
                &migdra::mig::allowlist::Allowlist::all(),
            ),
            devices::gpu_devices(
                model,
                &gpu,
                devices::GpuMode::Static,
                false,
                &existing,
                Minor,
                &migdra::mig::allowlist::Allowlist::all(),
            ),
        ];
        for d in all.iter().flatten() {
            for (k, v) in &d.attributes {
                p.attributes.insert(qualify(driver, k));
                if let (true, devices::AttributeValue::String(s)) = (ENUMERATED.contains(&k.as_str()), v) {
                    p.values.entry(qualify(driver, k)).or_default().insert(s.clone());
                }
            }
            p.capacities.extend(d.capacity.keys().map(|k| qualify(driver, k)));
        }
    }
    p
}

/// `device.attributes[...]` or `device.capacity[...]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Attribute,
    Capacity,
}

/// One reference of a CEL expression to a device field.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CelRef {
    field: Field,
    /// Qualified: `domain/name`.
    name: String,
    /// The string it is compared with (`==` or `!=`), if any.
    compared_to: Option<String>,
}

/// What a CEL expression says about devices: its references, and the drivers `device.driver`
/// is compared with. Understands `device.attributes["domain"].name`, `…["domain"]["name"]`,
/// the same for `device.capacity`, and `device.driver == "x"`; any other use of those fails, so
/// nothing slips past unchecked.
fn scan_cel(expr: &str) -> Result<(Vec<CelRef>, Vec<String>), String> {
    let b = expr.as_bytes();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    let ident = |i: usize| {
        let mut j = i;
        while j < b.len() && is_ident(b[j]) {
            j += 1;
        }
        (&expr[i..j], j)
    };
    let quoted = |i: usize| -> Option<(String, usize)> {
        let q = *b.get(i).filter(|c| **c == b'"' || **c == b'\'')?;
        let mut s = String::new();
        let mut j = i + 1;
        while j < b.len() && b[j] != q {
            if b[j] == b'\\' {
                j += 1;
            }
            s.push(*b.get(j)? as char);
            j += 1;
        }
        (j < b.len()).then(|| (s, j + 1))
    };
    let comparison = |i: usize| -> Option<String> {
        let i = skip_ws(i);
        let op = expr.get(i..i + 2)?;
        (op == "==" || op == "!=").then_some(())?;
        quoted(skip_ws(i + 2)).map(|(s, _)| s)
    };
    let (mut refs, mut drivers) = (Vec::new(), Vec::new());
    let mut from = 0;
    while let Some(pos) = expr[from..].find("device.").map(|p| p + from) {
        from = pos + "device.".len();
        if pos > 0 && (is_ident(b[pos - 1]) || b[pos - 1] == b'.') {
            continue;
        }
        let (member, after) = ident(from);
        let field = match member {
            "driver" => {
                drivers.push(
                    comparison(after).ok_or_else(|| format!("{expr:?}: compare device.driver with == \"driver\""))?,
                );
                continue;
            }
            "attributes" => Field::Attribute,
            "capacity" => Field::Capacity,
            _ => continue,
        };
        let bad = || format!("{expr:?}: write device.{member}[\"domain\"].name at byte {pos}");
        let i = skip_ws(after);
        (b.get(i) == Some(&b'[')).then_some(()).ok_or_else(bad)?;
        let (domain, i) = quoted(skip_ws(i + 1)).ok_or_else(bad)?;
        let i = skip_ws(i);
        (b.get(i) == Some(&b']')).then_some(()).ok_or_else(bad)?;
        let (name, end) = match b.get(i + 1) {
            Some(b'.') => {
                let (n, end) = ident(i + 2);
                (n.to_string(), end)
            }
            Some(b'[') => {
                let (n, j) = quoted(skip_ws(i + 2)).ok_or_else(bad)?;
                let j = skip_ws(j);
                (b.get(j) == Some(&b']')).then_some(()).ok_or_else(bad)?;
                (n, j + 1)
            }
            _ => return Err(bad()),
        };
        if name.is_empty() {
            return Err(bad());
        }
        refs.push(CelRef { field, name: format!("{domain}/{name}"), compared_to: comparison(end) });
        from = end;
    }
    Ok((refs, drivers))
}

/// What is wrong with one CEL expression, given what migdra publishes.
fn check_cel(expr: &str, driver: &str, p: &Published) -> Vec<String> {
    let (refs, drivers) = match scan_cel(expr) {
        Ok(r) => r,
        Err(e) => return vec![e],
    };
    let mut problems = Vec::new();
    for d in drivers.iter().filter(|d| *d != driver) {
        problems.push(format!("device.driver == {d:?}: migdra's driver is {driver:?}"));
    }
    for r in refs {
        let (known, what) = match r.field {
            Field::Attribute => (&p.attributes, "attribute"),
            Field::Capacity => (&p.capacities, "capacity"),
        };
        if !known.contains(&r.name) {
            problems.push(format!("{what} {} is not one migdra publishes", r.name));
            continue;
        }
        if let (Some(v), Some(values)) = (&r.compared_to, p.values.get(&r.name))
            && !values.contains(v)
        {
            problems.push(format!("{} is never {v:?}; it takes {values:?}", r.name));
        }
    }
    problems
}

/// A string found in a document, and its JSON pointer.
type Found = Vec<(String, String)>;

/// The CEL expressions (and `matchAttribute` names) in a document, with where they are.
fn cel_of(doc: &Value) -> (Found, Found) {
    fn walk(at: &str, v: &Value, cel: &mut Found, attrs: &mut Found) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let here = format!("{at}/{k}");
                    match (k.as_str(), v) {
                        ("cel", Value::Object(c)) => {
                            if let Some(e) = c.get("expression").and_then(Value::as_str) {
                                cel.push((format!("{here}/expression"), e.to_string()));
                            }
                        }
                        ("matchAttribute", Value::String(s)) => attrs.push((here, s.clone())),
                        _ => walk(&here, v, cel, attrs),
                    }
                }
            }
            Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| walk(&format!("{at}/{i}"), v, cel, attrs)),
            _ => {}
        }
    }
    let (mut cel, mut attrs) = (Vec::new(), Vec::new());
    walk("", doc, &mut cel, &mut attrs);
    (cel, attrs)
}

/// The CEL in DeviceClasses and claim templates names only attributes and capacities migdra
/// publishes, compares enumerated attributes only with values they take, and names migdra's
/// driver.
#[test]
fn cel_names_only_attributes_migdra_publishes() {
    let driver = driver();
    let p = published(&driver);
    assert!(p.attributes.contains(&format!("{driver}/profile")), "{:?}", p.attributes);
    assert!(p.attributes.contains(devices::PCI_BUS_ID));
    let mut failures = Vec::new();
    let mut expressions = 0;
    for doc in all_objects() {
        if !matches!(doc.kind(), "DeviceClass" | "ResourceClaimTemplate" | "ResourceClaim") {
            continue;
        }
        let (cel, match_attributes) = cel_of(&doc.value);
        for (at, expr) in cel {
            expressions += 1;
            for problem in check_cel(&expr, &driver, &p) {
                failures.push(format!("{} {} {at}: {problem}", doc.source, doc.name()));
            }
        }
        for (at, name) in match_attributes {
            if !p.attributes.contains(&qualify(&driver, &name)) {
                failures.push(format!(
                    "{} {} {at}: attribute {name} is not one migdra publishes",
                    doc.source,
                    doc.name()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(expressions >= 3, "only {expressions} CEL expressions found");
    println!("{expressions} CEL expressions checked against {} attributes", p.attributes.len());
}

/// The checker itself: what it must refuse, and what it must let through.
#[test]
fn cel_checker_refuses_what_migdra_does_not_publish() {
    let driver = driver();
    let p = published(&driver);
    let ok = [
        r#"device.driver == "mig.slinky.slurm.net" && device.attributes["mig.slinky.slurm.net"].type == "mig""#,
        r#"device.attributes['mig.slinky.slurm.net']['profile'] == '1g.10gb'"#,
        r#"device.attributes["resource.kubernetes.io"].pciBusID.startsWith("0000:3b")"#,
        r#"device.capacity["mig.slinky.slurm.net"].memory.compareTo(quantity("10Gi")) >= 0"#,
        r#"device.attributes["mig.slinky.slurm.net"].computeSlices == 1"#,
    ];
    for expr in ok {
        assert_eq!(check_cel(expr, &driver, &p), Vec::<String>::new(), "{expr}");
    }
    let refused = [
        (r#"device.attributes["mig.slinky.slurm.net"].profil == "1g.10gb""#, "profil is not"),
        (r#"device.attributes["gpu.nvidia.com"].profile == "1g.10gb""#, "gpu.nvidia.com/profile is not"),
        (r#"device.attributes["mig.slinky.slurm.net"].profile == "1g.11gb""#, "never \"1g.11gb\""),
        (r#"device.attributes["mig.slinky.slurm.net"].type != "vfio""#, "never \"vfio\""),
        (r#"device.capacity["mig.slinky.slurm.net"].memorySlices.isGreaterThan(quantity("1"))"#, "capacity"),
        (r#"device.driver == "gpu.nvidia.com""#, "migdra's driver"),
        (r#"device.attributes[d].profile == "1g.10gb""#, "write device.attributes"),
        (r#""profile" in device.attributes["mig.slinky.slurm.net"]"#, "write device.attributes"),
    ];
    for (expr, want) in refused {
        let problems = check_cel(expr, &driver, &p);
        assert!(problems.iter().any(|e| e.contains(want)), "{expr}: {problems:?} lacks {want:?}");
    }
}

/// Claim templates name DeviceClasses that exist; pods name claim templates that exist, and
/// their containers name the pod's claims.
#[test]
fn templates_and_pods_name_what_exists() {
    let docs = file_objects();
    let of =
        |kind: &str| docs.iter().filter(|d| d.kind() == kind).map(|d| d.name().to_string()).collect::<BTreeSet<_>>();
    let (classes, templates) = (of("DeviceClass"), of("ResourceClaimTemplate"));
    let mut failures = Vec::new();
    for doc in docs.iter().filter(|d| d.kind() == "ResourceClaimTemplate") {
        let t: ResourceClaimTemplate = doc.typed();
        let devices = t.spec.iter().flat_map(|t| t.spec.iter()).flat_map(|s| s.devices.iter());
        for r in devices.flat_map(|d| d.requests.iter().flatten()) {
            let named = r.exactly.iter().map(|e| e.device_class_name.clone());
            let named = named.chain(r.first_available.iter().flatten().map(|s| s.device_class_name.clone()));
            for class in named.filter(|c| !classes.contains(c)) {
                failures.push(format!(
                    "{}: request {} names DeviceClass {class:?}, not in {classes:?}",
                    doc.source, r.name
                ));
            }
        }
    }
    let mut pods = 0;
    for doc in docs.iter().filter(|d| d.kind() == "Pod") {
        pods += 1;
        let pod: Pod = doc.typed();
        let spec = pod.spec.unwrap();
        let claims: BTreeSet<String> = spec.resource_claims.iter().flatten().map(|c| c.name.clone()).collect();
        for c in spec.resource_claims.iter().flatten() {
            if let Some(t) = c.resource_claim_template_name.as_ref().filter(|t| !templates.contains(*t)) {
                failures.push(format!("{}: claim {} names template {t:?}, not in {templates:?}", doc.source, c.name));
            }
        }
        for container in &spec.containers {
            for c in container.resources.iter().flat_map(|r| r.claims.iter().flatten()) {
                if !claims.contains(&c.name) {
                    failures.push(format!(
                        "{}: container {} uses claim {:?}, not the pod's",
                        doc.source, container.name, c.name
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(pods > 0 && templates.contains("notebook-1g"), "the notebook example is missing");
}

// === RBAC against the API calls ===

/// Rules the ClusterRole may hold that no call in API_CALLS uses: (group, resource, verb, why).
const ALLOWANCES: &[(&str, &str, &str, &str)] = &[
    (
        "resource.k8s.io",
        "resourceslices",
        "get",
        "the plugin may use every verb on its slices; the admission policy keeps writes to its own node",
    ),
    ("resource.k8s.io", "resourceslices", "patch", "the plugin may use every verb on its slices"),
    ("resource.k8s.io", "resourceclaims/status", "patch", "the patch twin of update"),
    (
        "resource.k8s.io",
        "resourceclaims/driver",
        "associated-node:patch",
        "1.36+: the patch twin of associated-node:update",
    ),
    ("", "configmaps", "get", "the Slurm index map may be read from the API; the DaemonSet mounts it as a file"),
];

/// Paths every authenticated user may read (the default ClusterRole system:public-info-viewer).
const PUBLIC_PATHS: &[&str] = &["/version", "/healthz", "/livez", "/readyz"];

/// The ClusterRoles bound to migdra's service account.
fn migdra_rules(docs: &[Doc]) -> (String, String, Vec<PolicyRule>) {
    let sa: ServiceAccount =
        docs.iter().find(|d| d.kind() == "ServiceAccount").expect("a ServiceAccount in rbac.yaml").typed();
    let (sa_name, sa_ns) = (sa.metadata.name.unwrap(), sa.metadata.namespace.unwrap());
    let mut rules = Vec::new();
    for doc in docs.iter().filter(|d| d.kind() == "ClusterRoleBinding") {
        let b: ClusterRoleBinding = doc.typed();
        let bound =
            b.subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount" && s.name == sa_name && s.namespace.as_deref() == Some(sa_ns.as_str())
            });
        if !bound {
            continue;
        }
        assert_eq!(b.role_ref.kind, "ClusterRole", "{}", doc.source);
        let role: ClusterRole = docs
            .iter()
            .find(|d| d.kind() == "ClusterRole" && d.name() == b.role_ref.name)
            .unwrap_or_else(|| panic!("{}: ClusterRole {} not found", doc.source, b.role_ref.name))
            .typed();
        rules.extend(role.rules.into_iter().flatten());
    }
    assert!(!rules.is_empty(), "no ClusterRole bound to {sa_ns}/{sa_name}");
    (sa_ns, sa_name, rules)
}

fn resource_of(call: &ApiCall) -> String {
    match call.subresource {
        Some(sub) => format!("{}/{sub}", call.resource),
        None => call.resource.to_string(),
    }
}

fn has(list: &Option<Vec<String>>, want: &str) -> bool {
    list.iter().flatten().any(|x| x == want || x == "*")
}

/// Whether `rule` allows `call` (the object names being `driver`'s when the call names one).
fn allows(rule: &PolicyRule, call: &ApiCall, driver: &str) -> bool {
    let names_ok = match (rule.resource_names.as_deref().unwrap_or_default(), call.name) {
        ([], _) => true,
        (names, ObjectName::Driver) => names.iter().any(|n| n == driver),
        (_, ObjectName::Any) => false,
    };
    has(&rule.api_groups, call.group)
        && has(&rule.resources, &resource_of(call))
        && rule.verbs.iter().any(|v| v == call.verb || v == "*")
        && names_ok
}

/// The ClusterRole bound to migdra's service account allows every call in API_CALLS, and each
/// (group, resource, verb) it grants is used by a call or is a listed allowance: in rbac.yaml,
/// and in every render that holds the service account (the chart's with rbac.create too).
#[test]
fn rbac_allows_every_api_call_and_nothing_unexplained() {
    let driver = driver();
    let mut checked =
        vec![("daemonset/base/rbac.yaml".to_string(), file_documents(&repo().join(MANIFESTS).join("base/rbac.yaml")))];
    checked.extend(renders().iter().filter(|(_, docs)| docs.iter().any(|d| d.kind() == "ServiceAccount")).cloned());
    let mut failures = Vec::new();
    for (source, docs) in &checked {
        let problems = rbac_problems(docs, &driver);
        failures.extend(problems.into_iter().map(|p| format!("{source}: {p}")));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("RBAC checked in {:?}", checked.iter().map(|(s, _)| s).collect::<Vec<_>>());
}

/// What is wrong with the rules bound to migdra's service account in `docs`.
fn rbac_problems(docs: &[Doc], driver: &str) -> Vec<String> {
    let (_, _, rules) = migdra_rules(docs);
    let mut failures = Vec::new();
    for call in API_CALLS {
        if !rules.iter().any(|r| allows(r, call, driver)) {
            failures.push(format!(
                "not allowed: {} {} {:?} ({}: {})",
                call.verb,
                resource_of(call),
                call.group,
                call.file,
                call.why
            ));
        }
    }
    for call in NON_RESOURCE_CALLS {
        let granted =
            rules.iter().any(|r| has(&r.non_resource_urls, call.path) && r.verbs.iter().any(|v| v == call.verb));
        if !granted && !PUBLIC_PATHS.contains(&call.path) {
            failures.push(format!("not allowed: {} {} ({})", call.verb, call.path, call.file));
        }
    }
    let mut granted = BTreeSet::new();
    for r in &rules {
        assert!(r.non_resource_urls.is_none(), "nonResourceURLs in a ClusterRole migdra needs none of: {r:?}");
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    assert!(g != "*" && res != "*" && v != "*", "wildcard in {r:?}");
                    granted.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    for (g, res, v) in &granted {
        let used = API_CALLS.iter().any(|c| c.group == g && resource_of(c) == *res && c.verb == v);
        let allowed = ALLOWANCES.iter().any(|(ag, ar, av, _)| ag == g && ar == res && av == v);
        if !used && !allowed {
            failures.push(format!("granted, used by no call in API_CALLS and no allowance: {v} {res} {g:?}"));
        }
    }
    for (g, res, v, why) in ALLOWANCES {
        if !granted.contains(&(g.to_string(), res.to_string(), v.to_string())) {
            failures.push(format!("allowance for a rule rbac.yaml does not have: {v} {res} {g:?} ({why})"));
        }
        if API_CALLS.iter().any(|c| c.group == *g && resource_of(c) == *res && c.verb == *v) {
            println!("note: allowance {v} {res} is now used by API_CALLS; it can go");
        }
    }
    if failures.is_empty() {
        println!(
            "{} calls allowed; {} grants, {} of them allowances",
            API_CALLS.len(),
            granted.len(),
            ALLOWANCES.len()
        );
    }
    failures
}

/// `kube::Api` methods found in `text` (a source file): (verb, subresource) pairs.
fn api_methods(text: &str) -> BTreeSet<(&'static str, Option<&'static str>)> {
    // Methods whose names say they are kube::Api's, and common ones that are only counted when
    // their first argument is a reference (`api.create(&pp, &obj)`, not `s.replace('.', "-")`).
    const OWN: &[(&str, &str, Option<&str>)] = &[
        ("get_opt", "get", None),
        ("get_status", "get", Some("status")),
        ("get_metadata", "get", None),
        ("list_metadata", "list", None),
        ("watch_metadata", "watch", None),
        ("replace_status", "update", Some("status")),
        ("patch_status", "patch", Some("status")),
        ("delete_collection", "deletecollection", None),
    ];
    const COMMON: &[(&str, &str)] = &[
        ("list", "list"),
        ("watch", "watch"),
        ("create", "create"),
        ("replace", "update"),
        ("patch", "patch"),
        ("delete", "delete"),
    ];
    let mut found = BTreeSet::new();
    for (name, verb, sub) in OWN {
        if text.contains(&format!(".{name}(")) {
            found.insert((*verb, *sub));
        }
    }
    for (name, verb) in COMMON {
        let pat = format!(".{name}(");
        for (i, _) in text.match_indices(&pat) {
            if text[i + pat.len()..].trim_start().starts_with('&') {
                found.insert((*verb, None));
            }
        }
    }
    found
}

/// API_CALLS (the DaemonSet's) and OPERATOR_CALLS (`kubectl migdra`'s) name each file's
/// `kube::Api` calls (by verb and subresource), and every entry's file exists and makes a call of
/// that verb. Plain `.get(` is too common on maps to scan; its
/// entries are trusted when the file has one.
#[test]
fn api_calls_list_what_the_source_calls() {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo().join("src"), &mut files);
    let mut failures = Vec::new();
    let mut scanned = 0;
    for path in files {
        let file = relative(&path);
        let text = std::fs::read_to_string(&path).unwrap();
        if file == "src/kube/api_calls.rs" || !(text.contains("Api<") || text.contains("Api::")) {
            continue;
        }
        scanned += 1;
        let listed: Vec<&ApiCall> = API_CALLS.iter().chain(OPERATOR_CALLS).filter(|c| c.file == file).collect();
        for (verb, sub) in api_methods(&text) {
            if !listed.iter().any(|c| c.verb == verb && c.subresource == sub) {
                failures.push(format!(
                    "{file} calls {verb}{} but API_CALLS does not list it",
                    sub.map(|s| format!(" on /{s}")).unwrap_or_default()
                ));
            }
        }
        if text.contains("apiserver_version(")
            && !NON_RESOURCE_CALLS.iter().any(|c| c.file == file && c.path == "/version")
        {
            failures.push(format!("{file} reads /version but NON_RESOURCE_CALLS does not list it"));
        }
    }
    for c in API_CALLS.iter().chain(OPERATOR_CALLS) {
        let text = std::fs::read_to_string(repo().join(c.file)).unwrap_or_default();
        // The kubectl plugin pages through the slices with raw requests (request.list).
        let raw = c.verb == "list" && text.contains("request.list(");
        let seen = raw
            || c.verb.contains(':')
            || api_methods(&text).contains(&(c.verb, c.subresource))
            || (c.verb == "get" && c.subresource.is_none() && text.contains(".get("));
        if !seen {
            failures.push(format!(
                "API_CALLS lists {} {} in {}, which makes no such call",
                c.verb,
                resource_of(c),
                c.file
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(scanned >= 4, "only {scanned} files with kube::Api calls found");
}

/// The ClusterRole rule docs/operating.md gives operators for `kubectl migdra` allows every
/// resource.k8s.io call in OPERATOR_CALLS, and the text names the rest.
#[test]
fn the_operators_rule_in_the_docs_covers_kubectl_migdra() {
    let doc = std::fs::read_to_string(repo().join("docs/operating.md")).unwrap();
    let at = doc.find("read-only operator needs a ClusterRole with this rule").expect("the rule's paragraph");
    let block = &doc[at..];
    let line =
        |key: &str| block.lines().find(|l| l.trim_start().trim_start_matches("- ").starts_with(key)).unwrap_or("");
    let (resources, verbs) = (line("resources:"), line("verbs:"));
    for c in OPERATOR_CALLS {
        if c.group == "resource.k8s.io" {
            assert!(
                resources.contains(c.resource) && verbs.contains(c.verb),
                "{} {}: {resources} / {verbs}",
                c.verb,
                c.resource
            );
        } else {
            assert!(
                block[..400.min(block.len())].contains(&format!("`{}` on `{}`", c.verb, c.resource)),
                "{} {} not named",
                c.verb,
                c.resource
            );
        }
    }
}

// === the DaemonSet against the code ===

/// The DaemonSet runs `migdra serve` the way the code expects: probes on the sockets the code
/// binds, the downward API for NODE_NAME and POD_UID, the kubelet's directories at their own
/// paths, the service account the RBAC binds and the admission policy names, a seamless rolling
/// update, requests, a node selector, only `MIGDRA_*` variables the CLI reads, and the Slurm map
/// at the path it is mounted.
#[test]
fn daemonset_runs_migdra_as_the_code_expects() {
    let driver = driver();
    let base = |f: &str| file_documents(&repo().join(MANIFESTS).join("base").join(f));
    let ds: DaemonSet = base("daemonset.yaml").iter().find(|d| d.kind() == "DaemonSet").unwrap().typed();
    let (sa_ns, sa_name, _) = migdra_rules(&base("rbac.yaml"));
    let spec = ds.spec;
    let pod = spec.template.spec.unwrap();
    assert_eq!(ds.metadata.namespace.as_deref(), Some(sa_ns.as_str()));
    assert_eq!(pod.service_account_name.as_deref(), Some(sa_name.as_str()));
    let policy = base("admission-policy.yaml");
    let username = format!("system:serviceaccount:{sa_ns}:{sa_name}");
    assert!(policy[0].value.to_string().contains(&username), "admission-policy.yaml does not name {username}");

    let strategy = spec.update_strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.unwrap();
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    assert!(matches!(rolling.max_surge, Some(IntOrString::Int(n)) if n >= 1), "{:?}", rolling.max_surge);
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    assert!(!pod.node_selector.unwrap_or_default().is_empty(), "no node selector");

    let [c] = &pod.containers[..] else { panic!("one container expected") };
    assert_eq!(c.args.as_deref(), Some(&["serve".to_string()][..]));
    let env: BTreeMap<&str, _> = c.env.iter().flatten().map(|e| (e.name.as_str(), e)).collect();
    let field = |name: &str| {
        env.get(name).and_then(|e| e.value_from.as_ref()?.field_ref.as_ref()).map(|f| f.field_path.as_str())
    };
    assert_eq!(field("NODE_NAME"), Some("spec.nodeName"));
    assert_eq!(field("POD_UID"), Some("metadata.uid"));
    let known = render::cli_env();
    for name in env.keys().filter(|n| n.starts_with("MIGDRA_")) {
        assert!(known.contains(*name), "{name}: no migdra flag reads it (known: {known:?})");
    }

    let resources = c.resources.clone().unwrap();
    let requests = resources.requests.unwrap_or_default();
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"), "{requests:?}");
    assert!(resources.limits.unwrap_or_default().contains_key("memory"));

    // Host paths mounted at the same path, where the code's defaults put them.
    let volumes: BTreeMap<&str, _> = pod.volumes.iter().flatten().map(|v| (v.name.as_str(), v)).collect();
    let mounts: BTreeMap<&str, &str> =
        c.volume_mounts.iter().flatten().map(|m| (m.mount_path.as_str(), m.name.as_str())).collect();
    let host_path_at = |path: &str| {
        let name = mounts.get(path).unwrap_or_else(|| panic!("nothing mounted at {path}"));
        volumes[name].host_path.as_ref().map(|h| h.path.as_str())
    };
    let plugin_dir = format!("/var/lib/kubelet/plugins/{driver}");
    let registry_dir = cli_default("registry_dir");
    for dir in [plugin_dir.as_str(), registry_dir.as_str(), cli_default("cdi_dir").as_str()] {
        assert_eq!(host_path_at(dir), Some(dir), "{dir}");
    }
    assert!(host_path_at("/driver-root").is_some());
    // libnvidia-ml is looked up under the driver root's mount, for the node's architecture
    // (tests/library/chart.rs `each_architecture_loads_its_own_nvml`); a MIGDRA_NVML_LIB an
    // overlay adds must be under it too.
    let value = |name: &str| env.get(name).and_then(|e| e.value.as_deref());
    assert_eq!(value("MIGDRA_DRIVER_ROOT"), Some("/driver-root"), "MIGDRA_DRIVER_ROOT is the driver root's mount");
    if let Some(nvml_lib) = value("MIGDRA_NVML_LIB") {
        assert!(nvml_lib.starts_with("/driver-root/"), "{nvml_lib} is not under the driver root's mount");
    }

    // Probes ask the daemon through `migdra probe` (tests/process/probe.rs), which finds this pod's
    // sockets from the same environment as serve; the image puts the binary at that path, and
    // the kubelet's timeout leaves the probe's own --timeout room to report. Readiness alone
    // also needs the node's ResourceSlices published (--ready): liveness must not restart every
    // pod during an API server outage.
    let probe_cmd = migdra::cli::Cli::command().find_subcommand("probe").cloned().expect("a probe subcommand");
    let probe_timeout = probe_cmd.get_arguments().find(|a| a.get_id() == "timeout").unwrap().get_default_values()[0]
        .to_string_lossy()
        .into_owned();
    let probe_timeout = migdra::duration::parse(&probe_timeout).unwrap();
    let dockerfile = std::fs::read_to_string(repo().join("daemonset/image/Dockerfile")).unwrap();
    let image_bin = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("COPY --from=build ")?.split_whitespace().last())
        .expect("the Dockerfile copies the binary from the build stage");
    for (what, probe, args) in [
        ("startup", &c.startup_probe, &["probe"][..]),
        ("readiness", &c.readiness_probe, &["probe", "--ready"][..]),
        ("liveness", &c.liveness_probe, &["probe"][..]),
    ] {
        let probe = probe.as_ref().unwrap_or_else(|| panic!("no {what} probe"));
        let command = probe.exec.as_ref().and_then(|e| e.command.as_deref()).unwrap_or_default();
        let want: Vec<&str> = std::iter::once(image_bin).chain(args.iter().copied()).collect();
        assert_eq!(command, want, "{what} probe");
        let kubelet_timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).try_into().unwrap());
        assert!(
            kubelet_timeout > probe_timeout,
            "{what} probe: timeoutSeconds {kubelet_timeout:?} <= --timeout {probe_timeout:?}"
        );
    }

    // The Slurm index map: the variable names the file the ConfigMap's key becomes, and the
    // ConfigMap holds a `key: index` map.
    let map_path = env["MIGDRA_SLURM_INDEX_MAP"].value.as_deref().unwrap();
    let (dir, key) = map_path.rsplit_once('/').unwrap();
    let volume = volumes[mounts[dir]];
    let cm_name = &volume.config_map.as_ref().expect("the Slurm map is a ConfigMap volume").name;
    let cm: ConfigMap =
        base("slurm-index-map.yaml").iter().find(|d| d.kind() == "ConfigMap" && d.name() == cm_name).unwrap().typed();
    assert_eq!(cm.metadata.namespace.as_deref(), Some(sa_ns.as_str()));
    let text = &cm.data.unwrap()[key];
    // migdra's own parser reads the shipped map (empty) and the commented example lines.
    let parse =
        |t: &str| migdra::slurm::indexmap::parse(t, std::path::Path::new(key)).unwrap_or_else(|e| panic!("{e}"));
    let map = parse(text);
    assert!(map.is_empty(), "the base ships an empty map: {map:?}");
    let example = parse(
        &text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("# "))
            .filter(|l| l.contains("\": "))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    assert_eq!(example.len(), 2, "the commented example lines parse as the map format: {example:?}");
}
