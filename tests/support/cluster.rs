//! What the end-to-end tests put in a real cluster and read back from it: the Node a kubelet
//! would register, the manifests of daemonset/ and the chart's objects, and a node's published
//! pool.

use super::eventually::eventually;
use super::{DRIVER, NODE};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use migdra::claims::ClaimRef;
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The repository, for the manifests in daemonset/.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A Node named `name`, Ready and untainted, as its kubelet would leave it: no kubelet runs in
/// these tests, so nothing else would.
pub async fn create_node(client: &kube::Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let resources = json!({"cpu": "64", "memory": "512Gi", "pods": "110"});
    let status = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "the test's kubelet"}]
    }});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    // No taints, whatever admission added.
    nodes.patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": null}}))).await.unwrap();
}

/// The documents of a YAML file.
pub fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// `kubectl apply -n <namespace> -f FILE` for the kinds daemonset/ holds.
pub async fn apply(client: &kube::Client, path: &Path, namespace: &str) {
    create_all(client, &path.display().to_string(), documents(path), namespace).await;
}

/// The API of a kind daemonset/ holds, for `doc`'s namespace (else `namespace`) when namespaced.
///
/// # Panics
/// A kind not listed here.
fn api_of(client: &kube::Client, source: &str, doc: &Value, namespace: &str) -> Api<kube::api::DynamicObject> {
    // (group, version, plural, namespaced)
    let (group, version, plural, namespaced) = match doc["kind"].as_str() {
        Some("Namespace") => ("", "v1", "namespaces", false),
        Some("ServiceAccount") => ("", "v1", "serviceaccounts", true),
        Some("ConfigMap") => ("", "v1", "configmaps", true),
        Some("DaemonSet") => ("apps", "v1", "daemonsets", true),
        Some("ClusterRole") => ("rbac.authorization.k8s.io", "v1", "clusterroles", false),
        Some("ClusterRoleBinding") => ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", false),
        Some("ValidatingAdmissionPolicy") => {
            ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", false)
        }
        Some("ValidatingAdmissionPolicyBinding") => {
            ("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", false)
        }
        Some("DeviceClass") => ("resource.k8s.io", "v1", "deviceclasses", false),
        Some("ResourceClaimTemplate") => ("resource.k8s.io", "v1", "resourceclaimtemplates", true),
        other => panic!("{source}: unexpected kind {other:?}"),
    };
    let gvk = kube::api::GroupVersionKind::gvk(group, version, doc["kind"].as_str().unwrap());
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
    if namespaced {
        let ns = doc["metadata"]["namespace"].as_str().unwrap_or(namespace);
        Api::namespaced_with(client.clone(), ns, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    }
}

/// Create each object of `docs` (from `source`: a file, a render) in the API server, in order;
/// namespaced ones without a namespace go to `namespace`.
///
/// # Panics
/// The server refuses one: the source, kind and name, and the server's reason.
pub async fn create_all(client: &kube::Client, source: &str, docs: Vec<Value>, namespace: &str) {
    for doc in docs {
        let api = api_of(client, source, &doc, namespace);
        let obj: kube::api::DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        let (kind, name) = (&doc["kind"], obj.metadata.name.clone().unwrap_or_default());
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("{source}: create {kind} {name}: {e}"));
    }
}

/// The objects of `docs` (from `source`) that the API server does not hold, as "kind name".
pub async fn missing(client: &kube::Client, source: &str, docs: &[Value], namespace: &str) -> Vec<String> {
    let mut out = Vec::new();
    for doc in docs {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let found = api_of(client, source, doc, namespace).get_opt(name).await;
        if !matches!(found, Ok(Some(_))) {
            out.push(format!("{} {name} ({found:?})", doc["kind"]));
        }
    }
    out
}

/// The newest generation of a pool's slices, if it is complete: as many slices as each counts.
/// Before that the scheduler sees an incomplete pool and allocates nothing from it.
pub fn complete(slices: Vec<ResourceSlice>) -> Option<Vec<ResourceSlice>> {
    let generation = slices.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0);
    let current: Vec<ResourceSlice> = slices.into_iter().filter(|s| s.spec.pool.generation == generation).collect();
    current.first().is_some_and(|s| s.spec.pool.resource_slice_count as usize == current.len()).then_some(current)
}

/// Our complete pool of node `node`, once the API server has it; how long that took.
///
/// # Panics
/// After `timeout`, with `explain`'s diagnostics.
pub async fn pool(
    client: &kube::Client,
    node: &str,
    timeout: Duration,
    explain: impl Fn() -> String,
) -> (Vec<ResourceSlice>, Duration) {
    let t = Instant::now();
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let params = ListParams::default().labels(&format!("{}={node}", migdra::kube::slices::node_label(DRIVER)));
    let (api, params) = (&api, &params);
    let slices = eventually(format!("a complete pool of {node}"))
        .within(timeout)
        .every(Duration::from_millis(100))
        .explain(explain)
        .until_async(move || async move { complete(api.list(params).await.unwrap().items) })
        .await;
    (slices, t.elapsed())
}

/// The kubelet's reference to a claim.
pub fn claim_ref(c: &ResourceClaim) -> ClaimRef {
    ClaimRef {
        uid: c.metadata.uid.clone().unwrap(),
        namespace: c.metadata.namespace.clone().unwrap(),
        name: c.metadata.name.clone().unwrap(),
    }
}

/// Our devices (driver [`DRIVER`], pool [`NODE`]) in a claim's allocation.
pub fn allocated(c: &ResourceClaim) -> Vec<String> {
    c.status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .map(|rs| rs.iter().filter(|r| r.driver == DRIVER && r.pool == NODE).map(|r| r.device.clone()).collect())
        .unwrap_or_default()
}

/// Our entries of a claim's `status.devices`, as JSON.
pub fn ours(c: &ResourceClaim) -> Vec<Value> {
    let devices = c.status.as_ref().and_then(|s| s.devices.clone()).unwrap_or_default();
    devices.into_iter().filter(|d| d.driver == DRIVER).map(|d| serde_json::to_value(d).unwrap()).collect()
}

/// What the scheduler did with a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Bound,
    Unschedulable(String),
}

/// Wait until the scheduler binds the pod or calls it unschedulable.
pub async fn outcome(pods: &Api<Pod>, name: &str, timeout: Duration, explain: impl Fn() -> String) -> Outcome {
    eventually(format!("pod {name} bound or unschedulable"))
        .within(timeout)
        .every(Duration::from_millis(100))
        .explain(explain)
        .until_async(move || async move {
            let pod = pods.get(name).await.unwrap();
            if pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                return Ok(Outcome::Bound);
            }
            let unschedulable = pod.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|cs| {
                cs.iter().find(|c| {
                    c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
                })
            });
            match unschedulable {
                Some(c) => Ok(Outcome::Unschedulable(c.message.clone().unwrap_or_default())),
                None => Err(format!("{:?}", pod.status)),
            }
        })
        .await
}
