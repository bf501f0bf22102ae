//! `kubectl migdra why POD`: for each request of each of the pod's claims, which devices match,
//! and for each GPU with a matching device why the scheduler cannot give it now: counters held
//! by other claims (which ones), free memory slices that are not contiguous (which claim to move),
//! a device taint, a Slurm pin on a full GPU, or selectors that match nothing. The model is the
//! one the scheduler applies to migdra's slices ([`super::model`]); a selector this module cannot
//! evaluate exactly is said to be so ([`super::cel`]), never guessed.

use super::cel::{DeviceInput, Selector, Verdict};
use super::model::{Cluster, Device, Gpu, Holder, Node, taint_text};
use super::nodes::NodeView;
use super::wire::Taint;
use crate::mig::fit;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceToleration, ResourceClaim};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The attribute slurm-bridge pins a claim to Slurm's GPU with.
pub const SLURM_PIN: &str = "slurmGpuIndex";

/// One of the pod's claims: found, the one the scheduler will make for its extended resources,
/// or not created yet from its template.
pub enum ClaimSlot<'a> {
    Found(&'a ResourceClaim),
    Extended(Box<ResourceClaim>),
    Missing { name: String, template: Option<String> },
}

/// The claim the scheduler makes at binding for a pod's extended resources that a DeviceClass
/// names (`nvidia.com/mig-1g.10gb`, or `deviceclass.resource.kubernetes.io/<class>`): one request
/// per container and resource, as many devices as its limit (its request where no limit is set).
/// `None` when the pod asks for none, or when the scheduler already made it.
pub fn extended_claim(pod: &Pod, classes: &[DeviceClass]) -> Option<ResourceClaim> {
    use k8s_openapi::api::resource::v1 as api;
    if pod.status.as_ref().is_some_and(|s| s.extended_resource_claim_status.is_some()) {
        return None;
    }
    let class_for = |resource: &str| {
        classes.iter().find(|c| {
            let name = c.metadata.name.as_deref().unwrap_or("");
            c.spec.as_ref().and_then(|s| s.extended_resource_name.as_deref()) == Some(resource)
                || resource.strip_prefix("deviceclass.resource.kubernetes.io/") == Some(name)
        })
    };
    let spec = pod.spec.as_ref()?;
    let mut requests = Vec::new();
    for c in spec.init_containers.iter().flatten().chain(&spec.containers) {
        let res = c.resources.as_ref();
        let amounts = res.and_then(|r| r.limits.as_ref()).or_else(|| res.and_then(|r| r.requests.as_ref()));
        for (resource, q) in amounts.into_iter().flatten() {
            let Some(class) = class_for(resource) else { continue };
            let count = q.0.parse::<i64>().unwrap_or(1);
            requests.push(api::DeviceRequest {
                name: format!("{}-{}", c.name, resource.rsplit('/').next().unwrap_or(resource)),
                exactly: Some(api::ExactDeviceRequest {
                    device_class_name: class.metadata.name.clone().unwrap_or_default(),
                    count: Some(count),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    (!requests.is_empty()).then(|| api::ResourceClaim {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("(extended resources)".into()),
            namespace: pod.metadata.namespace.clone(),
            ..Default::default()
        },
        spec: Some(api::ResourceClaimSpec {
            devices: Some(api::DeviceClaim { requests: Some(requests), ..Default::default() }),
        }),
        status: None,
    })
}

#[derive(Debug, Serialize)]
pub struct Why {
    /// `namespace/name`; absent when asked about a claim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The scheduler's own message, when it left one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<String>,
    pub claims: Vec<ClaimWhy>,
    /// What this answer does not look at.
    pub notes: Vec<String>,
    /// What the reader's rights kept from it (a tenant's); absent when it read everything.
    #[serde(skip_serializing_if = "Sight::whole")]
    pub sight: Sight,
}

/// What could be read. A tenant whose rights end at their namespace still gets an answer: their
/// pod's claims and requests, and what the missing reads leave open, instead of an error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sight {
    /// Claims were listed in this namespace only (listing them across namespaces is forbidden):
    /// a device held by a claim elsewhere looks free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claims_only_in: Option<String>,
    /// Kinds that could not be read at all (`ResourceSlices`, `DeviceClasses`): without them no
    /// device is evaluated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unread: Vec<String>,
}

impl Sight {
    /// The kinds [`Sight::unread`] names, as the notes print them.
    pub const SLICES: &str = "ResourceSlices";
    pub const CLASSES: &str = "DeviceClasses";
    pub const CLAIMS: &str = "ResourceClaims";

    /// `kind` could not be read.
    pub fn lacks(&self, kind: &str) -> bool {
        self.unread.iter().any(|k| k == kind)
    }

    pub fn whole(&self) -> bool {
        self == &Self::default()
    }

    /// No device can be evaluated: the slices or the classes are missing.
    pub fn blind(&self) -> bool {
        !self.unread.is_empty()
    }
}

#[derive(Debug, Serialize)]
pub struct ClaimWhy {
    pub claim: String,
    /// `node/device` for each allocated device; empty while pending.
    pub allocated: Vec<String>,
    pub requests: Vec<RequestWhy>,
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestWhy {
    pub request: String,
    pub class: String,
    /// The class's own CEL: in `-o json`, not in the text (the class's name says it there).
    pub class_selectors: Vec<String>,
    /// The request's own selectors.
    pub selectors: Vec<String>,
    /// `1`, `2`, … or `all`.
    pub count: String,
    pub matching_devices: usize,
    pub matching_nodes: usize,
    /// Devices whose match the selectors leave open (a construct the evaluator does not decide):
    /// with any, `matching_devices` is a lower bound.
    pub undecided_devices: usize,
    /// Where it could be allocated now.
    pub fits: Vec<Place>,
    /// `fits` holds for this request alone: no node takes it together with the pod's (or the
    /// claim's) other pending requests.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub alone: bool,
    /// No device was evaluated (see [`Why::sight`]): the counts mean nothing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unevaluated: bool,
    pub reasons: Vec<Reason>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Place {
    pub node: String,
    pub gpu: String,
    pub device: String,
}

#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Reason {
    /// The DeviceClass does not exist.
    ClassMissing { class: String },
    /// The selectors ask for a profile no node publishes.
    NotPublished { profile: String, published: Vec<String> },
    /// The selectors pin a Slurm GPU index no GPU has.
    NoSlurmGpu { index: String },
    /// The selectors match no published device.
    NoMatch,
    /// Selectors outside what this tool evaluates: the answer is not exact.
    Unevaluable { why: Vec<String> },
    /// A selector fails on a device, which makes the scheduler abort the allocation.
    SelectorError { device: String, error: String },
    /// The GPU fell off the bus.
    Lost { node: String, gpu: String },
    /// A matching device is free but tainted, and the request does not tolerate it.
    Tainted { node: String, gpu: String, taints: Vec<String> },
    /// Every matching device of the GPU is held itself, by these claims (of the same profile).
    #[serde(rename_all = "camelCase")]
    Taken { node: String, gpu: String, held_by: Vec<Holder> },
    /// Its memory slices are held by these claims.
    #[serde(rename_all = "camelCase")]
    Full { node: String, gpu: String, free_slices: u32, memory_slices: u32, needs: u32, held_by: Vec<Holder> },
    /// Memory would do, but an engine it needs (the GPU's one OFA engine, say) is held.
    Engines { node: String, gpu: String, counters: Vec<String>, held_by: Vec<Holder> },
    /// Enough memory slices are free, but not where a placement of the profile fits: moving
    /// these claims frees `frees`.
    #[serde(rename_all = "camelCase")]
    Fragmented {
        node: String,
        gpu: String,
        /// The free memory slices, by index.
        free_slices: Vec<u32>,
        /// Memory slices the profile needs.
        needs: u32,
        /// The claims whose partitions stand in the way.
        move_claims: Vec<Holder>,
        /// The placement moving them frees.
        frees: String,
    },
    /// The request is pinned to the GPU with this Slurm index; without the pin it would fit here.
    SlurmPin { index: String, elsewhere: Vec<Place> },
    /// Only this many of the devices the request needs fit on one node at once.
    TooFew { node: String, fit: usize, needs: usize },
    /// The node has matching devices, but the pod cannot go there (cordoned, NotReady, a taint, its
    /// nodeSelector or affinity, another of its claims allocated elsewhere).
    NodeBlocked { node: String, why: Vec<String> },
}

/// The explanation for a pod's claims, or for one claim (`pod` absent).
/// `nodes`: the cluster's Node objects, `None` when they could not be read (then the pod's node
/// constraints and the nodes' taints are not evaluated, and a note says so).
pub fn why(
    cluster: &Cluster,
    pod: Option<&Pod>,
    claims: &[ClaimSlot<'_>],
    classes: &[DeviceClass],
    nodes: Option<&[NodeView]>,
    sight: &Sight,
) -> Why {
    let mut notes = Vec::new();
    if sight.blind() {
        notes.push(format!(
            "{} could not be read (forbidden): no device is evaluated, only the pod's claims; a cluster admin can \
             run this command, or grant you get and list on resourceslices, deviceclasses and resourceclaims",
            sight.unread.join(", ")
        ));
    }
    if let Some(ns) = &sight.claims_only_in {
        notes.push(format!(
            "only the claims of namespace {ns} could be read (listing resourceclaims across namespaces is \
             forbidden): a device held by a claim in a namespace you cannot read looks free here"
        ));
    }
    let spec = pod.and_then(|p| p.spec.as_ref());
    let bound = spec.and_then(|s| s.node_name.as_deref());
    if let Some(node) = bound {
        let phase = pod.and_then(|p| p.status.as_ref()).and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        notes.push(format!("the pod is bound to node {node} (phase {phase}): it waits for no device"));
    }
    let conditions = pod.and_then(|p| p.status.as_ref()).and_then(|s| s.conditions.as_ref());
    let scheduled = conditions.and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
    let scheduler = scheduled.filter(|c| c.status == "False").and_then(|c| c.message.clone());
    if let Some(p) = pod
        && bound.is_none()
        && scheduled.is_none()
    {
        let name = spec.and_then(|s| s.scheduler_name.as_deref()).unwrap_or("default-scheduler");
        notes.push(format!(
            "the scheduler has not tried the pod yet (no PodScheduled condition): check that a scheduler named \
             {name} runs (kube-scheduler's log), and the pod's events (kubectl describe pod {})",
            p.metadata.name.as_deref().unwrap_or("")
        ));
    }
    let mut blocked: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // A bound pod has its node: the Node side is the scheduler's question, not its any more.
    if let Some(p) = pod
        && bound.is_none()
    {
        match nodes {
            Some(nodes) => {
                for n in nodes {
                    let why = super::nodes::blocks(n, p);
                    if !why.is_empty() {
                        blocked.insert(n.name.clone(), why);
                    }
                }
            }
            None => notes.push(
                "Node objects could not be read (get, list nodes): the pod's nodeSelector and affinity and the \
                 nodes' taints are not evaluated"
                    .into(),
            ),
        }
        // An allocated claim ties the pod to its node: the scheduler only looks there.
        if let Some((claim, node)) = claims.iter().find_map(|slot| allocated_node(slot)) {
            notes.push(format!("claim {claim} is allocated on node {node}: the pod can only run there"));
            for n in cluster.nodes.iter().filter(|n| n.name != node) {
                blocked
                    .entry(n.name.clone())
                    .or_default()
                    .push(format!("claim {claim} of the pod is allocated on node {node}"));
            }
        }
    }
    if let Some(nodes) = nodes {
        let publishing: Vec<&str> = cluster.nodes.iter().map(|n| n.name.as_str()).collect();
        let not_ready = super::nodes::not_ready(nodes, &publishing);
        if !not_ready.is_empty() {
            notes.push(format!(
                "NotReady: {} (the scheduler may still choose its devices; the pod would not start there until \
                 it is Ready)",
                not_ready.join(", ")
            ));
        }
        let silent = super::nodes::silent(&cluster.driver, nodes, &publishing);
        if !silent.is_empty() {
            notes.push(format!(
                "opted in to migdra but publishing no devices: {} (is migdra's pod Running there? \
                 kubectl get pods -n <migdra namespace> -o wide)",
                silent.join(", ")
            ));
        }
    }
    let (mut claims, wanted): (Vec<ClaimWhy>, Vec<Vec<Wanted<'_>>>) =
        claims.iter().map(|slot| claim_why(cluster, slot, classes, &blocked, sight.blind())).unzip();
    let wanted: Vec<Wanted<'_>> = wanted.into_iter().flatten().collect();
    if wanted.len() > 1 {
        notes.extend(together(cluster, &wanted, &mut claims, &blocked));
    }
    let pod = pod.map(|p| {
        format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or(""), p.metadata.name.as_deref().unwrap_or(""))
    });
    Why { pod, scheduler, claims, notes, sight: sight.clone() }
}

/// Whether a claim asks for (or holds) devices of `driver`: its allocation names the driver, or a
/// selector of one of its requests or of their classes names it. A class that does not exist
/// counts, so that its absence is explained.
pub fn is_for_driver(driver: &str, claim: &ResourceClaim, classes: &[DeviceClass]) -> bool {
    let allocated = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .is_some_and(|d| d.results.iter().flatten().any(|r| r.driver == driver));
    allocated
        || requests(claim).iter().any(|r| match classes.iter().find(|c| c.metadata.name.as_deref() == Some(r.class)) {
            None => true,
            Some(c) => expressions(c, r)
                .iter()
                .any(|e| e.contains(&format!("\"{driver}\"")) || e.contains(&format!("'{driver}'"))),
        })
}

/// A request or sub-request, flattened.
struct Request<'a> {
    name: String,
    /// The request it belongs to: itself, or the one whose `firstAvailable` lists it.
    group: &'a str,
    class: &'a str,
    selectors: Vec<&'a str>,
    mode_all: bool,
    count: usize,
    tolerations: &'a [DeviceToleration],
}

fn requests(claim: &ResourceClaim) -> Vec<Request<'_>> {
    let mut out = Vec::new();
    let all = claim.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_ref());
    for r in all.into_iter().flatten() {
        if let Some(e) = &r.exactly {
            out.push(Request {
                name: r.name.clone(),
                group: &r.name,
                class: &e.device_class_name,
                selectors: sel_exprs(&e.selectors),
                mode_all: e.allocation_mode.as_deref() == Some("All"),
                count: e.count.unwrap_or(1).max(1) as usize,
                tolerations: e.tolerations.as_deref().unwrap_or_default(),
            });
        }
        for s in r.first_available.iter().flatten() {
            out.push(Request {
                name: format!("{}/{}", r.name, s.name),
                group: &r.name,
                class: &s.device_class_name,
                selectors: sel_exprs(&s.selectors),
                mode_all: s.allocation_mode.as_deref() == Some("All"),
                count: s.count.unwrap_or(1).max(1) as usize,
                tolerations: s.tolerations.as_deref().unwrap_or_default(),
            });
        }
    }
    out
}

fn sel_exprs(s: &Option<Vec<k8s_openapi::api::resource::v1::DeviceSelector>>) -> Vec<&str> {
    s.iter().flatten().filter_map(|s| s.cel.as_ref()).map(|c| c.expression.as_str()).collect()
}

/// The class's selectors, then the request's.
fn expressions<'a>(class: &'a DeviceClass, r: &Request<'a>) -> Vec<&'a str> {
    let mut all = sel_exprs(class.spec.as_ref().map_or(&None, |s| &s.selectors));
    all.extend(r.selectors.iter().copied());
    all
}

/// The claim a slot holds, and the node its allocation ties it to (the `metadata.name` its
/// allocation's node selector names), when it is allocated.
fn allocated_node(slot: &ClaimSlot<'_>) -> Option<(String, String)> {
    let claim = match slot {
        ClaimSlot::Found(c) => *c,
        ClaimSlot::Extended(c) => c,
        ClaimSlot::Missing { .. } => return None,
    };
    let selector = claim.status.as_ref()?.allocation.as_ref()?.node_selector.as_ref()?;
    let node = selector
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|f| f.key == "metadata.name" && f.operator == "In")
        .and_then(|f| f.values.as_ref()?.first().cloned())?;
    Some((claim.metadata.name.clone().unwrap_or_default(), node))
}

/// Nodes the pod cannot use (by name), and why: the scheduler's node filters, or another claim of
/// the pod allocated elsewhere.
type BlockedNodes = BTreeMap<String, Vec<String>>;

fn claim_why<'s>(
    cluster: &Cluster,
    slot: &'s ClaimSlot<'_>,
    classes: &[DeviceClass],
    blocked: &BlockedNodes,
    blind: bool,
) -> (ClaimWhy, Vec<Wanted<'s>>) {
    let claim = match slot {
        ClaimSlot::Found(c) => *c,
        ClaimSlot::Extended(c) => c,
        ClaimSlot::Missing { name, template } => {
            let from = template.as_deref().map_or_else(String::new, |t| format!(" from template {t}"));
            let why = ClaimWhy {
                claim: name.clone(),
                allocated: Vec::new(),
                requests: Vec::new(),
                notes: vec![format!(
                    "the claim{from} does not exist yet: the resourceclaim controller creates it; \
                     if it stays missing, check that the template exists in the pod's namespace"
                )],
            };
            return (why, Vec::new());
        }
    };
    let name = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or(""),
        claim.metadata.name.as_deref().unwrap_or("")
    );
    let allocated: Vec<String> = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .map(|d| d.results.iter().flatten().map(|r| format!("{}/{}", r.pool, r.device)).collect())
        .unwrap_or_default();
    let mut notes = Vec::new();
    if !allocated.is_empty() {
        notes.push("allocated: this claim keeps nothing pending".into());
        return (ClaimWhy { claim: name, allocated, requests: Vec::new(), notes }, Vec::new());
    }
    if claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.constraints.as_ref())
        .is_some_and(|c| !c.is_empty())
    {
        notes.push("the claim's constraints (matchAttribute across requests) are not evaluated here".into());
    }
    let mut wanted: Vec<Wanted<'s>> = Vec::new();
    let mut whys = Vec::new();
    if blind {
        let whys = requests(claim).iter().map(unevaluated).collect();
        return (ClaimWhy { claim: name, allocated, requests: whys, notes }, wanted);
    }
    for r in requests(claim) {
        let (why, matches) = request_why(cluster, &r, classes, blocked);
        whys.push(why);
        let alternative = Alternative { matches, all: r.mode_all, count: r.count, tolerations: r.tolerations };
        match wanted.last_mut() {
            Some(w) if w.group == r.group => w.alternatives.push(alternative),
            _ => wanted.push(Wanted { group: r.group, alternatives: vec![alternative] }),
        }
    }
    (ClaimWhy { claim: name, allocated, requests: whys, notes }, wanted)
}

/// (node, gpu, device) positions in the cluster.
type At = (usize, usize, usize);

/// A request as the claim writes it, with nothing evaluated.
fn unevaluated(r: &Request<'_>) -> RequestWhy {
    RequestWhy {
        request: r.name.clone(),
        class: r.class.to_string(),
        class_selectors: Vec::new(),
        selectors: r.selectors.iter().map(|e| e.to_string()).collect(),
        count: if r.mode_all { "all".into() } else { r.count.to_string() },
        matching_devices: 0,
        matching_nodes: 0,
        undecided_devices: 0,
        fits: Vec::new(),
        alone: false,
        unevaluated: true,
        reasons: Vec::new(),
    }
}

fn request_why(
    cluster: &Cluster,
    r: &Request<'_>,
    classes: &[DeviceClass],
    blocked: &BlockedNodes,
) -> (RequestWhy, Vec<At>) {
    let mut out = RequestWhy { unevaluated: false, selectors: Vec::new(), ..unevaluated(r) };
    let Some(class) = classes.iter().find(|c| c.metadata.name.as_deref() == Some(r.class)) else {
        out.reasons.push(Reason::ClassMissing { class: r.class.to_string() });
        return (out, Vec::new());
    };
    let exprs = expressions(class, r);
    let own = r.selectors.len();
    out.class_selectors = exprs[..exprs.len() - own].iter().map(|e| e.to_string()).collect();
    out.selectors = exprs[exprs.len() - own..].iter().map(|e| e.to_string()).collect();
    let selectors: Vec<Selector> = exprs.iter().map(|e| Selector::parse(e)).collect();
    let scan = scan(cluster, &selectors);
    if !scan.unknown.is_empty() {
        out.reasons.push(Reason::Unevaluable { why: scan.unknown.iter().cloned().collect() });
    }
    if let Some((device, error)) = scan.error {
        out.reasons.push(Reason::SelectorError { device, error });
        return (out, Vec::new());
    }
    out.matching_devices = scan.matches.len();
    out.undecided_devices = scan.undecided;
    out.matching_nodes = scan.matches.iter().map(|a| a.0).collect::<BTreeSet<_>>().len();
    if scan.matches.is_empty() {
        if scan.unknown.is_empty() {
            out.reasons.push(nothing_matches(cluster, &selectors));
        }
        return (out, Vec::new());
    }
    let needs = if r.mode_all { scan.matches.len() } else { r.count };
    for (n, node) in cluster.nodes.iter().enumerate() {
        let here: Vec<&At> = scan.matches.iter().filter(|a| a.0 == n).collect();
        if here.is_empty() {
            continue;
        }
        if let Some(why) = blocked.get(&node.name) {
            out.reasons.push(Reason::NodeBlocked { node: node.name.clone(), why: why.clone() });
            continue;
        }
        let picked = first_fit(node, here.iter().map(|a| (a.1, a.2)), r.tolerations, needs);
        if picked.len() >= needs {
            out.fits.extend(picked.iter().map(|&(g, d)| place(node, g, d)));
            continue;
        }
        if !picked.is_empty() {
            out.reasons.push(Reason::TooFew { node: node.name.clone(), fit: picked.len(), needs });
        }
        let gpus: BTreeSet<usize> = here.iter().map(|a| a.1).collect();
        for g in gpus {
            let devices: Vec<&Device> = here.iter().filter(|a| a.1 == g).map(|a| &node.gpus[g].devices[a.2]).collect();
            out.reasons.extend(gpu_reason(cluster, node, &node.gpus[g], &devices, r.tolerations));
        }
    }
    if out.fits.is_empty()
        && let Some(index) = selectors.iter().find_map(|s| s.pinned(SLURM_PIN))
    {
        let unpinned: Vec<Selector> = selectors.iter().filter_map(|s| s.without_attribute(SLURM_PIN)).collect();
        let elsewhere = scan_fits(cluster, &unpinned, r.tolerations);
        out.reasons.push(Reason::SlurmPin { index, elsewhere });
    }
    (out, scan.matches)
}

struct Scan {
    matches: Vec<At>,
    /// Devices whose verdict is unknown, and why.
    undecided: usize,
    unknown: BTreeSet<String>,
    error: Option<(String, String)>,
}

/// Every device against every selector (all must hold).
fn scan(cluster: &Cluster, selectors: &[Selector]) -> Scan {
    let mut s = Scan { matches: Vec::new(), undecided: 0, unknown: BTreeSet::new(), error: None };
    for (n, node) in cluster.nodes.iter().enumerate() {
        for (g, gpu) in node.gpus.iter().enumerate() {
            for (d, dev) in gpu.devices.iter().enumerate() {
                let input =
                    DeviceInput { driver: &cluster.driver, attributes: &dev.attributes, capacity: &dev.capacity };
                match all(selectors.iter().map(|sel| sel.eval(&input))) {
                    Verdict::Match => s.matches.push((n, g, d)),
                    Verdict::NoMatch => {}
                    Verdict::Unknown(why) => {
                        s.undecided += 1;
                        s.unknown.insert(why);
                    }
                    Verdict::Error(e) => {
                        s.error.get_or_insert_with(|| (format!("{}/{}", node.name, dev.name()), e));
                    }
                }
            }
        }
    }
    s
}

/// CEL's `&&` over the selectors: false wins, then unknown, then an error.
fn all(verdicts: impl Iterator<Item = Verdict>) -> Verdict {
    let mut worst = Verdict::Match;
    for v in verdicts {
        worst = match (worst, v) {
            (_, Verdict::NoMatch) | (Verdict::NoMatch, _) => return Verdict::NoMatch,
            (Verdict::Unknown(u), _) | (_, Verdict::Unknown(u)) => Verdict::Unknown(u),
            (Verdict::Error(e), _) | (_, Verdict::Error(e)) => Verdict::Error(e),
            _ => Verdict::Match,
        };
    }
    worst
}

/// One pending request of the pod, for the question the scheduler asks of a node: do all of
/// them fit there at once? Its alternatives are the request itself, or its `firstAvailable`
/// sub-requests in order.
struct Wanted<'a> {
    group: &'a str,
    alternatives: Vec<Alternative<'a>>,
}

struct Alternative<'a> {
    /// Every matching device in the cluster.
    matches: Vec<At>,
    all: bool,
    count: usize,
    tolerations: &'a [DeviceToleration],
}

/// How many devices the search of one node may try before it says "not decided": the scheduler
/// gives up too (its allocator has a deadline), and a pod's requests on one node rarely need more.
const SEARCH_STEPS: usize = 200_000;

/// The pod's (or the claim's) pending requests together, as the scheduler places them: on one
/// node, each device beside the others, trying another device for an earlier request when a
/// later one does not fit. Where no node takes them all, each request's "fits now" becomes
/// "fits alone", and the note says so; the answer is never "fits now" for a pod that fits nowhere.
fn together(cluster: &Cluster, wanted: &[Wanted<'_>], claims: &mut [ClaimWhy], blocked: &BlockedNodes) -> Vec<String> {
    let any_fits = claims.iter().flat_map(|c| &c.requests).any(|r| !r.fits.is_empty());
    if !any_fits {
        return Vec::new();
    }
    let mut whole = Vec::new();
    let mut undecided = Vec::new();
    for (n, node) in cluster.nodes.iter().enumerate().filter(|(_, node)| !blocked.contains_key(&node.name)) {
        let mut search = Search { node, n, steps: 0 };
        match search.place(wanted, &node.pool, &mut Vec::new()) {
            Some(true) => whole.push(node.name.clone()),
            Some(false) => {}
            None => undecided.push(node.name.clone()),
        }
    }
    let total = wanted.len();
    if !whole.is_empty() {
        return vec![format!("all {total} pending requests fit at once on {}", whole.join(", "))];
    }
    for r in claims.iter_mut().flat_map(|c| c.requests.iter_mut()).filter(|r| !r.fits.is_empty()) {
        r.alone = true;
    }
    let mut notes = vec![format!(
        "no node takes all {total} pending requests at once (the scheduler places them on one node \
         together); the places shown fit one request alone"
    )];
    if !undecided.is_empty() {
        notes.push(format!("not decided on {} (too many combinations to try)", undecided.join(", ")));
    }
    notes
}

/// The scheduler's search on one node, with backtracking, bounded by [`SEARCH_STEPS`].
struct Search<'c> {
    node: &'c Node,
    n: usize,
    steps: usize,
}

impl Search<'_> {
    /// Whether `wanted` all fit beside `pool` and the devices `taken`; `None`: not decided.
    fn place(&mut self, wanted: &[Wanted<'_>], pool: &fit::Pool, taken: &mut Vec<(usize, usize)>) -> Option<bool> {
        let Some((first, rest)) = wanted.split_first() else { return Some(true) };
        for alt in &first.alternatives {
            let here: Vec<(usize, usize)> = alt.matches.iter().filter(|a| a.0 == self.n).map(|a| (a.1, a.2)).collect();
            let needs = if alt.all { here.len() } else { alt.count };
            if here.is_empty() || here.len() < needs {
                continue;
            }
            if self.fill(alt, &here, 0, needs, pool, taken, rest)? {
                return Some(true);
            }
        }
        Some(false)
    }

    /// Take `left` more devices for `alt` from `here[from..]`, then place `rest`.
    #[allow(clippy::too_many_arguments)]
    fn fill(
        &mut self,
        alt: &Alternative<'_>,
        here: &[(usize, usize)],
        from: usize,
        left: usize,
        pool: &fit::Pool,
        taken: &mut Vec<(usize, usize)>,
        rest: &[Wanted<'_>],
    ) -> Option<bool> {
        if left == 0 {
            return self.place(rest, pool, taken);
        }
        for (i, &(g, d)) in here.iter().enumerate().skip(from) {
            self.steps += 1;
            if self.steps > SEARCH_STEPS {
                return None;
            }
            let device = &self.node.gpus[g].devices[d];
            let c = Candidate { at: (g, d), device };
            if taken.contains(&(g, d))
                || device.holder.is_some()
                || !tolerated(device, alt.tolerations)
                || !pool.fits(&c)
            {
                continue;
            }
            let mut beside = pool.clone();
            beside.take(&c);
            taken.push((g, d));
            if self.fill(alt, here, i + 1, left - 1, &beside, taken, rest)? {
                return Some(true);
            }
            taken.pop();
        }
        Some(false)
    }
}

/// Free devices matching `selectors` that the request tolerates, one per GPU, at most three.
fn scan_fits(cluster: &Cluster, selectors: &[Selector], tolerations: &[DeviceToleration]) -> Vec<Place> {
    if selectors.is_empty() {
        return Vec::new();
    }
    let s = scan(cluster, selectors);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for &(n, g, d) in &s.matches {
        let node = &cluster.nodes[n];
        let dev = &node.gpus[g].devices[d];
        if out.len() < 3 && node.fits(dev) && tolerated(dev, tolerations) && seen.insert((n, g)) {
            out.push(place(node, g, d));
        }
    }
    out
}

/// Why no device matches: a profile nobody publishes, a Slurm index no GPU has, or plainly none.
fn nothing_matches(cluster: &Cluster, selectors: &[Selector]) -> Reason {
    let published = cluster.profiles();
    if let Some(p) = selectors.iter().find_map(|s| s.pinned("profile"))
        && !published.contains(p.as_str())
    {
        return Reason::NotPublished { profile: p, published: published.iter().map(|s| s.to_string()).collect() };
    }
    if let Some(k) = selectors.iter().find_map(|s| s.pinned(SLURM_PIN))
        && !cluster.devices().any(|(_, g, _)| g.slurm_index.map(|i| i.to_string()).as_deref() == Some(k.as_str()))
    {
        return Reason::NoSlurmGpu { index: k };
    }
    Reason::NoMatch
}

/// The scheduler's walk on one node ([`fit::first_fit`]): devices in published order, each taken
/// when it is free, tolerated, and fits beside those taken before.
fn first_fit(
    node: &Node,
    candidates: impl Iterator<Item = (usize, usize)>,
    tolerations: &[DeviceToleration],
    needs: usize,
) -> Vec<(usize, usize)> {
    let candidates: Vec<Candidate> =
        candidates.map(|(g, d)| Candidate { at: (g, d), device: &node.gpus[g].devices[d] }).collect();
    let accept = |c: &Candidate| c.device.holder.is_none() && tolerated(c.device, tolerations);
    fit::first_fit(&node.pool, &candidates, needs, accept).into_iter().map(|c| c.at).collect()
}

/// A device the walk meets, with where it is on its node: (GPU, device).
struct Candidate<'a> {
    at: (usize, usize),
    device: &'a Device,
}

impl fit::Consumer for Candidate<'_> {
    fn consumes(&self) -> Vec<(&str, &str, Option<u128>)> {
        self.device.consumes()
    }
}

/// Why none of `devices` (the GPU's matching ones) can be allocated now.
fn gpu_reason(
    cluster: &Cluster,
    node: &Node,
    gpu: &Gpu,
    devices: &[&Device],
    tolerations: &[DeviceToleration],
) -> Option<Reason> {
    let (n, g) = (node.name.clone(), gpu.label());
    if gpu.lost(&cluster.driver) {
        return Some(Reason::Lost { node: n, gpu: g });
    }
    if devices.iter().any(|d| node.fits(d)) {
        // Fits but was not picked: a taint keeps it off, or the request needs more devices
        // than the node holds at once (said by TooFew).
        let taints: BTreeSet<String> = devices
            .iter()
            .filter(|d| node.fits(d))
            .flat_map(|d| d.taints().filter(|t| !tolerates(tolerations, t)).map(taint_text))
            .collect();
        return (!taints.is_empty()).then(|| Reason::Tainted { node: n, gpu: g, taints: taints.into_iter().collect() });
    }
    let free: Vec<u32> =
        gpu.slice_holders().iter().enumerate().filter(|(_, h)| h.is_none()).map(|(i, _)| i as u32).collect();
    // A device held itself is taken, not in the way: moving its holder frees nothing for this
    // request (the holder needs the same room).
    let unheld: Vec<&&Device> = devices.iter().filter(|d| d.holder.is_none()).collect();
    if unheld.is_empty() {
        let held_by: BTreeSet<Holder> = devices.iter().filter_map(|d| d.holder.clone()).collect();
        return Some(Reason::Taken { node: n, gpu: g, held_by: held_by.into_iter().collect() });
    }
    let best = unheld.into_iter().min_by_key(|d| node.blockers(gpu, d).len())?;
    let needs = best.placement.map_or(gpu.memory_slices, |p| p.1);
    let blockers: Vec<Holder> = node.blockers(gpu, best).into_iter().collect();
    let engines: Vec<String> =
        node.short(best).iter().filter(|(_, c)| !c.starts_with("memory-slice-")).map(|(_, c)| c.to_string()).collect();
    if !engines.is_empty() && free.len() as u32 >= needs {
        return Some(Reason::Engines { node: n, gpu: g, counters: engines, held_by: blockers });
    }
    if free.len() as u32 >= needs && !blockers.is_empty() {
        return Some(Reason::Fragmented {
            node: n,
            gpu: g,
            free_slices: free,
            needs,
            move_claims: blockers,
            frees: best.name().to_string(),
        });
    }
    let held: BTreeSet<Holder> = gpu.devices.iter().filter_map(|d| d.holder.clone()).collect();
    Some(Reason::Full {
        node: n,
        gpu: g,
        free_slices: free.len() as u32,
        memory_slices: gpu.memory_slices,
        needs,
        held_by: held.into_iter().collect(),
    })
}

fn place(node: &Node, g: usize, d: usize) -> Place {
    Place { node: node.name.clone(), gpu: node.gpus[g].label(), device: node.gpus[g].devices[d].name().to_string() }
}

fn tolerated(d: &Device, tolerations: &[DeviceToleration]) -> bool {
    d.taints().all(|t| tolerates(tolerations, t))
}

/// Whether a device toleration tolerates the taint ([`super::nodes::toleration_matches`], the one rule).
fn tolerates(tolerations: &[DeviceToleration], t: &Taint) -> bool {
    tolerations.iter().any(|tol| {
        let tol = [tol.key.as_deref(), tol.operator.as_deref(), tol.value.as_deref(), tol.effect.as_deref()];
        super::nodes::toleration_matches(tol, &t.key, t.value.as_deref(), &t.effect)
    })
}

/// One short paragraph per request, for people.
pub fn text(w: &Why) -> Vec<String> {
    let mut lines: Vec<String> = w.pod.iter().map(|p| format!("pod {p}")).collect();
    if let Some(m) = &w.scheduler {
        lines.push(format!("  scheduler: {m}"));
    }
    for c in &w.claims {
        lines.push(format!("claim {}", c.claim));
        for a in &c.allocated {
            lines.push(format!("  allocated {a}"));
        }
        for n in &c.notes {
            lines.push(format!("  note: {n}"));
        }
        for r in &c.requests {
            lines.push(format!(
                "  request {}: class {}, {} device{}; {}",
                r.request,
                r.class,
                r.count,
                if r.count == "1" { "" } else { "s" },
                matching_text(r),
            ));
            for s in &r.selectors {
                lines.push(format!("    selector: {s}"));
            }
            if !r.fits.is_empty() {
                let places: Vec<String> =
                    r.fits.iter().take(SHOWN).map(|p| format!("{} {} {}", p.node, p.gpu, p.device)).collect();
                let how = match (r.alone, &w.sight.claims_only_in) {
                    (true, _) => "fits alone, not beside the other requests",
                    (false, None) => "fits now",
                    (false, Some(_)) => "looks free (a claim in a namespace you cannot read may hold it)",
                };
                lines.push(format!("    {how}: {}{}", places.join(", "), more(r.fits.len(), SHOWN, "places")));
            }
            lines.extend(grouped(&r.reasons).into_iter().map(|l| format!("    {l}")));
        }
    }
    for n in &w.notes {
        lines.push(format!("note: {n}"));
    }
    lines
}

/// How many places, lines or node names the text shows before "… and N more": a big cluster's
/// answer stays readable; `-o json` lists everything.
const SHOWN: usize = 8;

/// ", … and N more WHAT (-o json lists all)" when `total` is over `shown`.
fn more(total: usize, shown: usize, what: &str) -> String {
    if total > shown { format!(", … and {} more {what} (-o json lists all)", total - shown) } else { String::new() }
}

/// The reasons' lines, those that differ only in their node said once with the nodes named
/// (`node-1, node-2 … (40 nodes) gpu-0 (…): full: …`), and at most [`SHOWN`] lines.
fn grouped(reasons: &[Reason]) -> Vec<String> {
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for r in reasons {
        let text = reason_text(r);
        let Some(node) = r.node().filter(|n| text.starts_with(n)) else {
            groups.push((text, Vec::new()));
            continue;
        };
        let rest = text[node.len()..].to_string();
        match groups.iter_mut().find(|(t, nodes)| !nodes.is_empty() && *t == rest) {
            Some((_, nodes)) => nodes.push(node),
            None => groups.push((rest, vec![node])),
        }
    }
    let mut lines: Vec<String> = groups
        .iter()
        .take(SHOWN)
        .map(|(text, nodes)| match nodes.len() {
            0 => text.clone(),
            1 => format!("{}{text}", nodes[0]),
            n if n <= 3 => format!("{}{text}", nodes.join(", ")),
            n => format!("{} … ({n} nodes){text}", nodes[..3].join(", ")),
        })
        .collect();
    if groups.len() > SHOWN {
        lines.push(format!("… and {} more lines (-o json lists all)", groups.len() - SHOWN));
    }
    lines
}

impl Reason {
    /// The node the reason is about, where it is about one.
    fn node(&self) -> Option<&str> {
        match self {
            Self::Lost { node, .. }
            | Self::Tainted { node, .. }
            | Self::Taken { node, .. }
            | Self::Full { node, .. }
            | Self::Engines { node, .. }
            | Self::Fragmented { node, .. }
            | Self::TooFew { node, .. }
            | Self::NodeBlocked { node, .. } => Some(node),
            Self::ClassMissing { .. }
            | Self::NotPublished { .. }
            | Self::NoSlurmGpu { .. }
            | Self::NoMatch
            | Self::Unevaluable { .. }
            | Self::SelectorError { .. }
            | Self::SlurmPin { .. } => None,
        }
    }
}

fn holders_text(hs: &[Holder]) -> String {
    let v: Vec<String> = hs.iter().map(|h| format!("{} (claim {})", h.who(), h.claim)).collect();
    v.join(", ")
}

fn reason_text(r: &Reason) -> String {
    match r {
        Reason::ClassMissing { class } => format!("DeviceClass {class} does not exist"),
        Reason::NotPublished { profile, published } => {
            format!("profile {profile} is published by no node; published: {}", published.join(", "))
        }
        Reason::NoSlurmGpu { index } => format!("pinned to Slurm GPU {index}, which no migdra node has"),
        Reason::NoMatch => "the selectors match no published device".into(),
        Reason::Unevaluable { why } => {
            format!("cannot evaluate exactly (not counted as matching): {}", why.join("; "))
        }
        Reason::SelectorError { device, error } => {
            format!("the selectors fail on {device}: {error}; the scheduler aborts the allocation")
        }
        Reason::Lost { node, gpu } => format!("{node} {gpu}: lost (fallen off the bus)"),
        Reason::Tainted { node, gpu, taints } => {
            format!("{node} {gpu}: free but tainted {}, not tolerated", taints.join(", "))
        }
        Reason::Full { node, gpu, free_slices, memory_slices, needs, held_by } => format!(
            "{node} {gpu}: full: {free_slices} of {memory_slices} memory slices free, {needs} needed; held by {}",
            holders_text(held_by)
        ),
        Reason::Engines { node, gpu, counters, held_by } => {
            format!("{node} {gpu}: its {} taken, by {}", counters.join(", "), holders_text(held_by))
        }
        Reason::Fragmented { node, gpu, free_slices, needs, move_claims, frees } => {
            let free: Vec<String> = free_slices.iter().map(u32::to_string).collect();
            format!(
                "{node} {gpu}: fragmented: memory slices {} are free, {needs} needed in one \
                 placement; moving {} frees {frees}",
                free.join(","),
                holders_text(move_claims)
            )
        }
        Reason::SlurmPin { index, elsewhere } if elsewhere.is_empty() => {
            format!("pinned to Slurm GPU {index} (slurmGpuIndex); without the pin it would not fit anywhere either")
        }
        Reason::SlurmPin { index, elsewhere } => {
            let places: Vec<String> = elsewhere.iter().map(|p| format!("{} {}", p.node, p.gpu)).collect();
            format!(
                "pinned to Slurm GPU {index} (slurmGpuIndex); without the pin it would fit on {}",
                places.join(", ")
            )
        }
        Reason::TooFew { node, fit, needs } => format!("{node}: only {fit} of the {needs} devices fit at once"),
        Reason::Taken { node, gpu, held_by } => {
            format!("{node} {gpu}: taken: every matching device is held, by {}", holders_text(held_by))
        }
        Reason::NodeBlocked { node, why } => format!("{node}: the pod cannot go there: {}", why.join("; ")),
    }
}

/// How many devices match: with undecided ones the count is only a floor, never a bare 0.
fn matching_text(r: &RequestWhy) -> String {
    if r.unevaluated {
        return "devices not evaluated".into();
    }
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let (n, nodes) = (r.matching_devices, r.matching_nodes);
    match (r.undecided_devices, n) {
        (0, _) => format!("{n} matching device{} on {nodes} node{}", plural(n), plural(nodes)),
        (u, 0) => format!("? matching devices ({u} the selectors leave undecided)"),
        (u, _) => format!("{n} or more matching devices on {nodes} or more node{} ({u} undecided)", plural(nodes)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::fixture::*;
    use super::*;

    const PIN0: &str = "device.attributes[\"mig.slinky.slurm.net\"].slurmGpuIndex == 0";

    /// The explanation of `pending` on node-a (2 H100s) with these claims allocated.
    fn explain(held: &[(&str, &str)], pending: ResourceClaim, taint_gpu1: bool) -> RequestWhy {
        let mut slices = node("node-a", 2);
        if taint_gpu1 {
            for d in slices.iter_mut().flat_map(|s| s.spec.devices.iter_mut()) {
                if d.name.starts_with("gpu-1-") {
                    d.taints = vec![Taint {
                        key: "mig.slinky.slurm.net/xid".into(),
                        value: Some("79".into()),
                        effect: "NoSchedule".into(),
                    }];
                }
            }
        }
        let claims: Vec<ResourceClaim> =
            held.iter().map(|(name, device)| allocated(name, &format!("pod-{name}"), "node-a", device)).collect();
        let cluster = Cluster::build(DRIVER, slices, &claims);
        let w = why(&cluster, None, &[ClaimSlot::Found(&pending)], &classes(), None, &Sight::default());
        let mut claims = w.claims;
        assert_eq!(claims.len(), 1);
        let mut requests = claims.remove(0).requests;
        assert_eq!(requests.len(), 1);
        requests.remove(0)
    }

    fn kinds(r: &RequestWhy) -> Vec<String> {
        r.reasons.iter().map(|x| format!("{x:?}").split([' ', '{']).next().unwrap_or("").to_string()).collect()
    }

    #[test]
    fn fits_now_on_an_empty_node() {
        let r = explain(&[], pending("p", "mig-3g.40gb", &[]), false);
        assert!(r.reasons.is_empty(), "{:?}", r.reasons);
        assert_eq!(r.matching_devices, 4);
        assert_eq!(r.fits.len(), 1);
        assert_eq!(r.fits[0].device, "gpu-0-mig-3g40gb-9-0");
    }

    #[test]
    fn full_gpus_name_the_claims_holding_them() {
        let held = [("a", "gpu-0-mig-7g80gb-0-0"), ("b", "gpu-1-mig-7g80gb-0-0")];
        let r = explain(&held, pending("p", "mig-3g.40gb", &[]), false);
        assert!(r.fits.is_empty());
        assert_eq!(kinds(&r), ["Full", "Full"]);
        let Reason::Full { held_by, gpu, .. } = &r.reasons[1] else { unreachable!() };
        assert_eq!(gpu, "gpu-1 (GPU 1, slurm 1)");
        assert_eq!(held_by.iter().map(|h| h.who()).collect::<Vec<_>>(), ["default/pod-b"]);
    }

    #[test]
    fn fragmentation_names_the_claim_to_move() {
        // GPU 0: 1g.10gb on slices 1 and 5: six slices free, no four contiguous for a 3g.40gb.
        let held = [("s1", "gpu-0-mig-1g10gb-19-1"), ("s5", "gpu-0-mig-1g10gb-19-5"), ("b", "gpu-1-mig-7g80gb-0-0")];
        let r = explain(&held, pending("p", "mig-3g.40gb", &[]), false);
        assert_eq!(kinds(&r), ["Fragmented", "Full"]);
        let Reason::Fragmented { free_slices, needs, move_claims, frees, .. } = &r.reasons[0] else { unreachable!() };
        assert_eq!(free_slices, &[0, 2, 3, 4, 6, 7]);
        assert_eq!(*needs, 4);
        assert_eq!(move_claims.len(), 1);
        assert_eq!(frees, &format!("gpu-0-mig-3g40gb-9-{}", if move_claims[0].claim == "s1" { 0 } else { 4 }));
    }

    #[test]
    fn an_engine_held_elsewhere_is_named() {
        // The H100's one OFA engine goes with a +me profile: a second one waits for it, not for memory.
        let held = [("me", "gpu-0-mig-1g10gbme-20-0"), ("b", "gpu-1-mig-7g80gb-0-0")];
        let r = explain(&held, pending("p", "mig-1g.10gb.me", &[]), false);
        assert_eq!(kinds(&r), ["Engines", "Full"]);
        let Reason::Engines { counters, held_by, .. } = &r.reasons[0] else { unreachable!() };
        assert_eq!(counters, &["ofa-engines"]);
        assert_eq!(held_by.iter().map(|h| h.claim.as_str()).collect::<Vec<_>>(), ["me"]);
    }

    #[test]
    fn a_taint_keeps_it_off_unless_tolerated() {
        let held = [("a", "gpu-0-mig-7g80gb-0-0")];
        let r = explain(&held, pending("p", "mig-3g.40gb", &[]), true);
        assert_eq!(kinds(&r), ["Full", "Tainted"]);
        let Reason::Tainted { taints, .. } = &r.reasons[1] else { unreachable!() };
        assert_eq!(taints, &["mig.slinky.slurm.net/xid=79:NoSchedule"]);
        let tolerating = |key: &str| {
            let mut c = pending("p", "mig-3g.40gb", &[]);
            let requests = c.spec.as_mut().and_then(|s| s.devices.as_mut()).and_then(|d| d.requests.as_mut());
            if let Some(e) = requests.and_then(|r| r[0].exactly.as_mut()) {
                e.tolerations = Some(vec![DeviceToleration {
                    key: Some(key.into()),
                    operator: Some("Exists".into()),
                    ..Default::default()
                }]);
            }
            c
        };
        let r = explain(&held, tolerating("mig.slinky.slurm.net/xid"), true);
        assert_eq!(r.fits.len(), 1, "{:?}", r.reasons);
        assert!(r.fits[0].device.starts_with("gpu-1-"));
        let r = explain(&held, tolerating("mig.slinky.slurm.net/gpu-lost"), true);
        assert_eq!(kinds(&r), ["Full", "Tainted"], "another key's toleration does not help");
    }

    #[test]
    fn a_slurm_pin_on_a_full_gpu_says_where_it_would_fit() {
        let held = [("a", "gpu-0-mig-7g80gb-0-0")];
        let r = explain(&held, pending("p", "mig-3g.40gb", &[PIN0]), false);
        assert_eq!(r.matching_devices, 2, "only GPU 0's 3g.40gb placements match the pin");
        assert_eq!(kinds(&r), ["Full", "SlurmPin"]);
        let Reason::SlurmPin { index, elsewhere } = &r.reasons[1] else { unreachable!() };
        assert_eq!(index, "0");
        assert_eq!(elsewhere.len(), 1);
        assert_eq!(elsewhere[0].gpu, "gpu-1 (GPU 1, slurm 1)");
    }

    #[test]
    fn selectors_that_match_nothing_say_which_part() {
        let r = explain(
            &[],
            pending("p", "mig", &["device.attributes[\"mig.slinky.slurm.net\"].profile == \"5g.60gb\""]),
            false,
        );
        assert_eq!(kinds(&r), ["NotPublished"]);
        let r = explain(
            &[],
            pending("p", "mig-1g.10gb", &["device.attributes[\"mig.slinky.slurm.net\"].slurmGpuIndex == 9"]),
            false,
        );
        assert_eq!(kinds(&r), ["NoSlurmGpu"]);
        let r = explain(
            &[],
            pending("p", "mig", &["device.attributes[\"mig.slinky.slurm.net\"].productName == \"A100\""]),
            false,
        );
        assert_eq!(kinds(&r), ["NoMatch"]);
        let r = explain(&[], pending("p", "no-such-class", &[]), false);
        assert_eq!(kinds(&r), ["ClassMissing"]);
    }

    #[test]
    fn selectors_it_cannot_evaluate_are_said_so_and_errors_abort() {
        let r = explain(
            &[],
            pending("p", "mig", &["device.attributes[\"mig.slinky.slurm.net\"].profile.matches(\"^3g\")"]),
            false,
        );
        assert_eq!(kinds(&r), ["Unevaluable"]);
        assert!(r.fits.is_empty(), "never guessed as matching");
        assert_eq!((r.matching_devices, r.undecided_devices > 0), (0, true));
        let said = matching_text(&r);
        assert!(
            said.starts_with("? matching devices (") && said.ends_with(" the selectors leave undecided)"),
            "{said}"
        );
        let r = explain(
            &[],
            pending("p", "mig", &["device.attributes[\"mig.slinky.slurm.net\"].noSuchAttribute == 1"]),
            false,
        );
        assert_eq!(kinds(&r), ["SelectorError"]);
    }

    #[test]
    fn a_bound_pod_and_an_allocated_claim_are_said_to_wait_for_nothing() {
        let slices = node("node-a", 1);
        let claim = allocated("a", "pod-a", "node-a", "gpu-0-mig-1g10gb-19-0");
        let cluster = Cluster::build(DRIVER, slices, std::slice::from_ref(&claim));
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pod-a", "namespace": "default"},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let w = why(&cluster, Some(&pod), &[ClaimSlot::Found(&claim)], &classes(), Some(&[]), &Sight::default());
        assert_eq!(w.notes, ["the pod is bound to node node-a (phase Running): it waits for no device"]);
        assert_eq!(w.claims[0].allocated, ["node-a/gpu-0-mig-1g10gb-19-0"]);
        assert!(w.claims[0].requests.is_empty());
    }

    /// Two pending claims of one pod, each asking for a 3g.40gb, with one 3g.40gb placement free
    /// in the cluster: each fits alone, the pod nowhere; with a second GPU free, both at once.
    #[test]
    fn the_pod_fits_only_where_all_its_requests_fit_at_once() {
        let (p, q) = (pending("p", "mig-3g.40gb", &[]), pending("q", "mig-3g.40gb", &[]));
        let slots = [ClaimSlot::Found(&p), ClaimSlot::Found(&q)];
        let answer = |held: &[(&str, &str)]| {
            let claims: Vec<ResourceClaim> =
                held.iter().map(|(name, device)| allocated(name, &format!("pod-{name}"), "node-a", device)).collect();
            why(&Cluster::build(DRIVER, node("node-a", 2), &claims), None, &slots, &classes(), None, &Sight::default())
        };
        let one_free = answer(&[("h", "gpu-0-mig-3g40gb-9-4"), ("b", "gpu-1-mig-7g80gb-0-0")]);
        for c in &one_free.claims {
            assert_eq!(c.requests[0].fits.len(), 1, "alone, each fits on gpu-0");
            assert!(c.requests[0].alone, "but not beside the other");
        }
        let said = text(&one_free).join("\n");
        assert!(!said.contains("fits now"), "{said}");
        assert!(said.contains("fits alone, not beside the other requests: node-a gpu-0"), "{said}");
        assert!(said.contains("no node takes all 2 pending requests at once"), "{said}");

        let two_free = answer(&[("h", "gpu-0-mig-3g40gb-9-4")]);
        assert!(two_free.claims.iter().all(|c| !c.requests[0].alone));
        assert!(
            two_free.notes.iter().any(|n| n == "all 2 pending requests fit at once on node-a"),
            "{:?}",
            two_free.notes
        );
    }

    /// The Node side: a node the pod's nodeSelector excludes is blocked (its devices are never
    /// "fits now"), a claim of the pod allocated on a node ties the pod there, an opted-in node
    /// that publishes nothing is named, and without Node objects the answer says so.
    #[test]
    fn the_node_side_blocks_nodes_and_names_silent_ones() {
        let mut slices = node("node-a", 2);
        slices.extend(node("node-b", 2));
        let p = pending("p", "mig-3g.40gb", &[]);
        let pod = |selector: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {"containers": [], "nodeSelector": selector},
                "status": {"conditions": [{"type": "PodScheduled", "status": "False", "message": "0/2 nodes"}]}
            }))
            .unwrap()
        };
        let view = |name: &str, labels: &[(&str, &str)]| NodeView {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ready: true,
            ..NodeView::default()
        };
        let nodes = [
            view("node-a", &[]),
            view("node-b", &[("pool", "b")]),
            view("node-c", &[("mig.slinky.slurm.net/enabled", "true")]),
        ];
        let cluster = Cluster::build(DRIVER, slices.clone(), &[]);
        let selective = pod(serde_json::json!({"pool": "b"}));
        let w = why(&cluster, Some(&selective), &[ClaimSlot::Found(&p)], &classes(), Some(&nodes), &Sight::default());
        let r = &w.claims[0].requests[0];
        assert!(!r.fits.is_empty() && r.fits.iter().all(|f| f.node == "node-b"), "{:?}", r.fits);
        assert!(
            r.reasons.iter().any(|x| matches!(x, Reason::NodeBlocked { node, why }
                if node == "node-a" && why == &["nodeSelector pool=b: the node has no pool label"])),
            "{:?}",
            r.reasons
        );
        assert!(
            w.notes.iter().any(|n| n.starts_with("opted in to migdra but publishing no devices: node-c")),
            "{:?}",
            w.notes
        );

        // A claim of the pod allocated on node-a ties it there: node-b's room does not count.
        let held = allocated("h", "p", "node-a", "gpu-0-mig-1g10gb-19-0");
        let cluster = Cluster::build(DRIVER, slices, std::slice::from_ref(&held));
        let anywhere = pod(serde_json::json!({}));
        let w = why(
            &cluster,
            Some(&anywhere),
            &[ClaimSlot::Found(&held), ClaimSlot::Found(&p)],
            &classes(),
            Some(&nodes),
            &Sight::default(),
        );
        assert!(w.notes.iter().any(|n| n == "claim h is allocated on node node-a: the pod can only run there"));
        assert!(w.claims[1].requests[0].fits.iter().all(|f| f.node == "node-a"));

        let w = why(&cluster, Some(&anywhere), &[ClaimSlot::Found(&p)], &classes(), None, &Sight::default());
        assert!(w.notes.iter().any(|n| n.starts_with("Node objects could not be read")), "{:?}", w.notes);
    }

    /// A GPU's 2g.20gb placements at 0 and 2 held by 2g.20gb claims, the one at 4 blocked by two
    /// 1g.10gb claims: fragmented, and moving the 1g claims frees the placement at 4, never a
    /// placement its own holder keeps. Every matching device held: taken, not fragmented.
    #[test]
    fn a_device_held_itself_is_taken_not_in_the_way() {
        let held = [
            ("h1", "gpu-0-mig-2g20gb-14-0"),
            ("h2", "gpu-0-mig-2g20gb-14-2"),
            ("x", "gpu-0-mig-1g10gb-19-4"),
            ("y", "gpu-0-mig-1g10gb-19-5"),
            ("b", "gpu-1-mig-7g80gb-0-0"),
        ];
        let r = explain(&held, pending("p", "mig-2g.20gb", &[]), false);
        let fragmented = r.reasons.iter().find_map(|x| match x {
            Reason::Fragmented { move_claims, frees, .. } => Some((move_claims, frees)),
            _ => None,
        });
        let (moved, frees) = fragmented.expect("GPU 0 is fragmented");
        assert_eq!(frees, "gpu-0-mig-2g20gb-14-4");
        assert_eq!(moved.iter().map(|h| h.who()).collect::<Vec<_>>(), ["default/pod-x", "default/pod-y"]);
        let r = explain(&held, pending("p", "mig-7g.80gb", &[]), false);
        assert!(
            r.reasons.iter().any(|x| matches!(x, Reason::Taken { gpu, held_by, .. }
                if gpu.starts_with("gpu-1 ") && held_by.iter().map(|h| h.who()).eq(["default/pod-b".to_string()]))),
            "{:?}",
            r.reasons
        );
    }

    #[test]
    fn the_text_is_one_line_per_reason() {
        let held = [("s1", "gpu-0-mig-1g10gb-19-1"), ("s5", "gpu-0-mig-1g10gb-19-5"), ("b", "gpu-1-mig-7g80gb-0-0")];
        let slices = node("node-a", 2);
        let claims: Vec<ResourceClaim> =
            held.iter().map(|(name, device)| allocated(name, &format!("pod-{name}"), "node-a", device)).collect();
        let cluster = Cluster::build(DRIVER, slices, &claims);
        let p = pending("p", "mig-3g.40gb", &[]);
        let text =
            super::text(&why(&cluster, None, &[ClaimSlot::Found(&p)], &classes(), None, &Sight::default())).join("\n");
        assert!(
            text.contains("node-a gpu-0 (GPU 0, slurm 0): fragmented: memory slices 0,2,3,4,6,7 are free, 4 needed"),
            "{text}"
        );
        assert!(
            text.contains(
                "node-a gpu-1 (GPU 1, slurm 1): full: 0 of 8 memory slices free, 4 needed; \
                 held by default/pod-b (claim b)"
            ),
            "{text}"
        );
    }

    /// A tenant: without the slices and classes the answer is the claims as written, said to be
    /// unevaluated; with the slices but only their namespace's claims, a free device "looks free".
    #[test]
    fn a_tenant_gets_what_their_rights_allow() {
        let p = pending("p", "mig-1g.10gb", &[PIN0]);
        let blind = Sight { claims_only_in: None, unread: vec![Sight::SLICES.into(), Sight::CLASSES.into()] };
        let empty = Cluster::build(DRIVER, Vec::new(), &[]);
        let w = why(&empty, None, &[ClaimSlot::Found(&p)], &[], None, &blind);
        let text = super::text(&w).join("\n");
        for want in [
            "claim default/p",
            "  request gpu: class mig-1g.10gb, 1 device; devices not evaluated",
            &format!("    selector: {PIN0}"),
            "note: ResourceSlices, DeviceClasses could not be read (forbidden): no device is evaluated",
        ] {
            assert!(text.contains(want), "missing {want:?}:\n{text}");
        }
        assert!(!text.contains("does not exist") && !text.contains("matching device"), "{text}");
        let json = serde_json::to_value(&w).unwrap();
        assert_eq!(json["sight"]["unread"], serde_json::json!(["ResourceSlices", "DeviceClasses"]));
        assert_eq!(json["claims"][0]["requests"][0]["unevaluated"], true);

        let cluster = Cluster::build(DRIVER, node("node-a", 2), &[]);
        let whole = super::text(&why(&cluster, None, &[ClaimSlot::Found(&p)], &classes(), None, &Sight::default()));
        assert!(whole.iter().any(|l| l.starts_with("    fits now: node-a gpu-")), "{whole:?}");
        assert!(
            serde_json::to_value(why(&cluster, None, &[], &classes(), None, &Sight::default()))
                .unwrap()
                .get("sight")
                .is_none()
        );
        let partial = Sight { claims_only_in: Some("default".into()), unread: Vec::new() };
        let text = super::text(&why(&cluster, None, &[ClaimSlot::Found(&p)], &classes(), None, &partial)).join("\n");
        assert!(
            text.contains("    looks free (a claim in a namespace you cannot read may hold it): node-a gpu-"),
            "{text}"
        );
        assert!(!text.contains("fits now"), "{text}");
        assert!(text.contains("note: only the claims of namespace default could be read"), "{text}");
    }

    /// At 100 nodes the text stays short: reasons that differ only in their node are one line
    /// naming the nodes, at most [`SHOWN`] lines and places, and what is left is counted.
    #[test]
    fn long_answers_are_grouped_and_capped() {
        let blocked = |n: usize, why: &str| Reason::NodeBlocked { node: format!("node-{n}"), why: vec![why.into()] };
        let same: Vec<Reason> = (0..100).map(|n| blocked(n, "cordoned (kubectl uncordon)")).collect();
        assert_eq!(
            grouped(&same),
            ["node-0, node-1, node-2 … (100 nodes): the pod cannot go there: cordoned (kubectl uncordon)"]
        );
        let two = [blocked(0, "x"), blocked(1, "x")];
        assert_eq!(grouped(&two), ["node-0, node-1: the pod cannot go there: x"]);
        let distinct: Vec<Reason> = (0..11).map(|n| blocked(n, &format!("taint t{n}"))).collect();
        let lines = grouped(&distinct);
        assert_eq!(lines.len(), SHOWN + 1, "{lines:?}");
        assert_eq!(lines[0], "node-0: the pod cannot go there: taint t0");
        assert_eq!(lines[SHOWN], "… and 3 more lines (-o json lists all)");
        assert_eq!(grouped(&[Reason::NoMatch]), ["the selectors match no published device"]);
        assert_eq!(more(20, SHOWN, "places"), ", … and 12 more places (-o json lists all)");
        assert_eq!(more(SHOWN, SHOWN, "places"), "");
    }
}
