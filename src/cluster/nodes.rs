//! The Node side of a pending pod: what kube-scheduler's node filters (NodeUnschedulable,
//! NodeAffinity, TaintToleration) say before any device is looked at, and the nodes opted in to
//! migdra (the chart's node label) that publish nothing. Pure: the caller reads the objects.

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration};
use serde::Serialize;
use std::collections::BTreeMap;

/// What the filters read of one Node.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
    /// Cordoned (`spec.unschedulable`).
    pub unschedulable: bool,
}

impl NodeView {
    pub fn of(n: &Node) -> Self {
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let spec = n.spec.as_ref();
        Self {
            name: n.metadata.name.clone().unwrap_or_default(),
            labels: n.metadata.labels.clone().unwrap_or_default(),
            taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
            ready,
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        }
    }
}

/// A node the pod cannot use, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Blocked {
    pub node: String,
    pub why: Vec<String>,
}

/// Why the scheduler's node filters keep `pod` off `node`; empty: they let it through. NotReady is
/// not among them: the scheduler filters on the node lifecycle controller's not-ready taint, not
/// on the condition ([`not_ready`] says it apart).
pub fn blocks(node: &NodeView, pod: &Pod) -> Vec<String> {
    let spec = pod.spec.as_ref();
    let tolerations = spec.and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
    let mut why = Vec::new();
    if node.unschedulable && !tolerated(tolerations, "node.kubernetes.io/unschedulable", None, "NoSchedule") {
        why.push("cordoned (kubectl uncordon)".to_string());
    }
    for (key, want) in spec.and_then(|s| s.node_selector.as_ref()).into_iter().flatten() {
        match node.labels.get(key) {
            Some(v) if v == want => {}
            Some(v) => why.push(format!("nodeSelector {key}={want}: the node has {key}={v}")),
            None => why.push(format!("nodeSelector {key}={want}: the node has no {key} label")),
        }
    }
    let required = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    if let Some(required) = required
        && !required.node_selector_terms.iter().any(|t| term_matches(t, node))
    {
        why.push("required node affinity: none of its terms matches the node's labels".to_string());
    }
    for t in node.taints.iter().filter(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")) {
        if !tolerated(tolerations, &t.key, t.value.as_deref(), &t.effect) {
            let value = t.value.as_deref().map_or_else(String::new, |v| format!("={v}"));
            why.push(format!("taint {}{value}:{} not tolerated", t.key, t.effect));
        }
    }
    why
}

/// The nodes among `names` whose Ready condition is not True: the scheduler may still place a pod
/// there until the not-ready taint comes, and the pod does not start; said beside the answer.
pub fn not_ready<'n>(nodes: &'n [NodeView], names: &[&str]) -> Vec<&'n str> {
    nodes.iter().filter(|n| !n.ready && names.contains(&n.name.as_str())).map(|n| n.name.as_str()).collect()
}

/// The nodes opted in to migdra (label `<driver>/enabled=true`, the chart's node selector) that
/// are not among `publishing`: migdra is not running there, or its slices are gone.
pub fn silent<'n>(driver: &str, nodes: &'n [NodeView], publishing: &[&str]) -> Vec<&'n str> {
    let label = format!("{driver}/enabled");
    nodes
        .iter()
        .filter(|n| n.labels.get(&label).is_some_and(|v| v == "true"))
        .filter(|n| !publishing.contains(&n.name.as_str()))
        .map(|n| n.name.as_str())
        .collect()
}

/// Kubernetes' toleration rule, the same for pods and devices: the effect matches (or the
/// toleration names none), and `Exists` matches the key (an empty key every key) or `Equal` (the
/// default) key and value. Arguments: the toleration's key, operator, value and effect, then the
/// taint's key, value and effect.
pub(super) fn toleration_matches(tol: [Option<&str>; 4], key: &str, value: Option<&str>, effect: &str) -> bool {
    let [tkey, operator, tvalue, teffect] = tol;
    let effect_ok = teffect.is_none_or(|e| e.is_empty() || e == effect);
    let tkey = tkey.unwrap_or("");
    let key_ok = match operator {
        Some("Exists") => tkey.is_empty() || tkey == key,
        _ => tkey == key && tvalue.unwrap_or("") == value.unwrap_or(""),
    };
    effect_ok && key_ok
}

fn tolerated(tolerations: &[Toleration], key: &str, value: Option<&str>, effect: &str) -> bool {
    tolerations.iter().any(|t| {
        let tol = [t.key.as_deref(), t.operator.as_deref(), t.value.as_deref(), t.effect.as_deref()];
        toleration_matches(tol, key, value, effect)
    })
}

/// A node selector term: every expression on the labels and every field (`metadata.name`) holds.
/// A term with neither matches nothing, as in the scheduler.
fn term_matches(t: &NodeSelectorTerm, node: &NodeView) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let name = BTreeMap::from([("metadata.name".to_string(), node.name.clone())]);
    exprs.iter().all(|r| requirement(r, &node.labels)) && fields.iter().all(|r| requirement(r, &name))
}

fn requirement(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let have = labels.get(&r.key);
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => have.is_some_and(|v| values.contains(v)),
        "NotIn" => have.is_none_or(|v| !values.contains(v)),
        "Exists" => have.is_some(),
        "DoesNotExist" => have.is_none(),
        "Gt" | "Lt" => match (have.and_then(|v| number(v)), values.first().and_then(|v| number(v))) {
            (Some(h), Some(w)) => (r.operator == "Gt" && h > w) || (r.operator == "Lt" && h < w),
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, NodeSelector, PodSpec};

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeView {
        NodeView {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ready: true,
            ..NodeView::default()
        }
    }

    fn pod(spec: PodSpec) -> Pod {
        Pod { spec: Some(spec), ..Pod::default() }
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint { key: key.into(), value: value.map(Into::into), effect: effect.into(), ..Taint::default() }
    }

    #[test]
    fn a_plain_pod_goes_to_a_ready_untainted_node() {
        assert!(blocks(&node("a", &[]), &pod(PodSpec::default())).is_empty());
    }

    #[test]
    fn cordoned_and_untolerated_taints_block_not_ready_is_said_apart() {
        let mut n = node("a", &[]);
        n.unschedulable = true;
        n.ready = false;
        n.taints = vec![taint("gpu", Some("busy"), "NoSchedule"), taint("info", None, "PreferNoSchedule")];
        let p = pod(PodSpec::default());
        assert_eq!(blocks(&n, &p), ["cordoned (kubectl uncordon)", "taint gpu=busy:NoSchedule not tolerated"]);
        assert_eq!(not_ready(std::slice::from_ref(&n), &["a"]), ["a"]);
        let tolerant = pod(PodSpec {
            tolerations: Some(vec![
                Toleration { key: Some("gpu".into()), operator: Some("Exists".into()), ..Toleration::default() },
                Toleration {
                    key: Some("node.kubernetes.io/unschedulable".into()),
                    operator: Some("Exists".into()),
                    effect: Some("NoSchedule".into()),
                    ..Toleration::default()
                },
            ]),
            ..PodSpec::default()
        });
        assert!(blocks(&n, &tolerant).is_empty(), "NotReady alone is no filter of the scheduler's");
        // The node lifecycle controller's not-ready taint is.
        n.taints.push(taint("node.kubernetes.io/not-ready", None, "NoSchedule"));
        assert_eq!(blocks(&n, &tolerant), ["taint node.kubernetes.io/not-ready:NoSchedule not tolerated"]);
    }

    #[test]
    fn node_selector_and_required_affinity_are_the_schedulers() {
        let gpu = node("gpu-1", &[("pool", "mig"), ("gen", "9")]);
        let selecting = |k: &str, v: &str| {
            pod(PodSpec { node_selector: Some([(k.to_string(), v.to_string())].into()), ..PodSpec::default() })
        };
        assert!(blocks(&gpu, &selecting("pool", "mig")).is_empty());
        assert_eq!(blocks(&gpu, &selecting("pool", "cpu")), ["nodeSelector pool=cpu: the node has pool=mig"]);
        assert_eq!(blocks(&gpu, &selecting("zone", "a")), ["nodeSelector zone=a: the node has no zone label"]);
        let affinity = |terms: Vec<NodeSelectorTerm>| {
            pod(PodSpec {
                affinity: Some(Affinity {
                    node_affinity: Some(NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                            node_selector_terms: terms,
                        }),
                        ..NodeAffinity::default()
                    }),
                    ..Affinity::default()
                }),
                ..PodSpec::default()
            })
        };
        let expr = |key: &str, op: &str, values: &[&str]| NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        };
        let term = |exprs: Vec<NodeSelectorRequirement>| NodeSelectorTerm {
            match_expressions: Some(exprs),
            match_fields: None,
        };
        for (ok, terms) in [
            (true, vec![term(vec![expr("pool", "In", &["mig", "x"]), expr("gen", "Gt", &["8"])])]),
            (false, vec![term(vec![expr("pool", "In", &["mig"]), expr("gen", "Lt", &["8"])])]),
            (true, vec![term(vec![expr("zone", "DoesNotExist", &[])]), term(vec![expr("x", "Exists", &[])])]),
            (false, vec![term(vec![expr("pool", "NotIn", &["mig"])])]),
            (false, vec![NodeSelectorTerm::default()]),
            (
                true,
                vec![NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![expr("metadata.name", "In", &["gpu-1"])]),
                }],
            ),
        ] {
            let said = blocks(&gpu, &affinity(terms.clone()));
            assert_eq!(said.is_empty(), ok, "{terms:?}: {said:?}");
        }
    }

    #[test]
    fn opted_in_nodes_that_publish_nothing_are_named() {
        let nodes = [
            node("a", &[("mig.slinky.slurm.net/enabled", "true")]),
            node("b", &[("mig.slinky.slurm.net/enabled", "true")]),
            node("c", &[]),
        ];
        assert_eq!(silent("mig.slinky.slurm.net", &nodes, &["a"]), ["b"]);
        assert!(silent("mig.slinky.slurm.net", &nodes, &["a", "b"]).is_empty());
    }
}
