//! Every Kubernetes API call migdra makes, in one place, so the RBAC in `daemonset/base/rbac.yaml` can
//! be checked against it (`tests/library/manifests.rs`): each call here must be allowed by the
//! ClusterRole, and a rule that no call here needs must be a documented allowance there.
//!
//! Add a line when code in `src/` starts calling the API (a new `Api` method, a new resource or
//! subresource); `tests/library/manifests.rs` also scans `src/` for `kube::Api` methods and fails on a
//! call this list does not name for that file.

/// Which objects of a resource a call touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectName {
    /// Any object: a list, a watch, a create, or a name only known at run time.
    Any,
    /// Only the object named after the DRA driver (`--driver-name`, default
    /// `mig.slinky.slurm.net`), so a rule may name it in `resourceNames`.
    Driver,
}

/// One kind of request to the API server, as RBAC sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiCall {
    /// API group; `""` is the core group.
    pub group: &'static str,
    /// Resource, plural (`resourceslices`).
    pub resource: &'static str,
    /// Subresource (`status`), if any.
    pub subresource: Option<&'static str>,
    /// RBAC verb: `get`, `list`, `watch`, `create`, `update` (a PUT, `Api::replace`), `patch`,
    /// `delete`; or a verb the server checks on its own (`associated-node:update`).
    pub verb: &'static str,
    /// Which objects.
    pub name: ObjectName,
    /// The file that makes the call.
    pub file: &'static str,
    /// What it is for.
    pub why: &'static str,
}

/// A request to a path outside the resource API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonResourceCall {
    /// URL path, e.g. `/version`.
    pub path: &'static str,
    /// RBAC verb (`get` for a GET).
    pub verb: &'static str,
    /// The file that makes the call.
    pub file: &'static str,
    /// What it is for, and who allows it.
    pub why: &'static str,
}

const fn call(
    group: &'static str,
    resource: &'static str,
    subresource: Option<&'static str>,
    verb: &'static str,
    file: &'static str,
    why: &'static str,
) -> ApiCall {
    ApiCall { group, resource, subresource, verb, name: ObjectName::Any, file, why }
}

const RESOURCE: &str = "resource.k8s.io";
const PUBLISHER: &str = "src/kube/publisher.rs";
const CLAIMS: &str = "src/kube/claims.rs";
const STATUS: &str = "src/kube/claim_status.rs";
const EVENTS: &str = "src/kube/events.rs";
const ALLOCATIONS: &str = "src/kube/allocations.rs";

/// Every resource request migdra makes.
pub const API_CALLS: &[ApiCall] = &[
    call(RESOURCE, "resourceslices", None, "list", PUBLISHER, "this node's slices (label and field selector)"),
    call(
        RESOURCE,
        "resourceslices",
        None,
        "watch",
        PUBLISHER,
        "notice drift: a slice deleted or changed by someone else",
    ),
    call(RESOURCE, "resourceslices", None, "create", PUBLISHER, "publish a slice"),
    call(RESOURCE, "resourceslices", None, "update", PUBLISHER, "replace a changed slice in place"),
    call(RESOURCE, "resourceslices", None, "delete", PUBLISHER, "remove a slice the node no longer has"),
    call("", "nodes", None, "get", PUBLISHER, "the Node's UID, for the slices' ownerReference"),
    call(RESOURCE, "resourceclaims", None, "get", CLAIMS, "a claim's allocation, on NodePrepareResources"),
    call(RESOURCE, "resourceclaims", None, "get", STATUS, "the claim's current status, before writing ours"),
    call(RESOURCE, "resourceclaims", Some("status"), "update", STATUS, "status.devices: Ready and the bridge's data"),
    // Kubernetes 1.36+ (DRAResourceClaimGranularStatusAuthorization) also authorizes the status
    // write above per driver: a node-bound service account writing status.devices of a claim
    // allocated on its node needs this verb on resourceclaims/driver, named for the driver.
    ApiCall {
        group: RESOURCE,
        resource: "resourceclaims",
        subresource: Some("driver"),
        verb: "associated-node:update",
        name: ObjectName::Driver,
        file: STATUS,
        why: "1.36+: the server's own check on the status.devices write",
    },
    call(
        RESOURCE,
        "resourceclaims",
        None,
        "list",
        ALLOCATIONS,
        "every claim, paged: the devices of this node's pool held",
    ),
    call(RESOURCE, "resourceclaims", None, "watch", ALLOCATIONS, "follow allocations and releases on this node's pool"),
    call("", "events", None, "get", EVENTS, "find the Event a repeated failure already has"),
    call("", "events", None, "create", EVENTS, "a Warning on a failed claim or on the Node"),
    call("", "events", None, "update", EVENTS, "count a repeat of the same failure"),
];

const KUBECTL_PLUGIN: &str = "src/cli/cluster.rs";

/// What `kubectl migdra usage` and `why` ask, as the operator running them (their kubeconfig),
/// never as the DaemonSet's service account: docs/operating.md gives the ClusterRole rule.
pub const OPERATOR_CALLS: &[ApiCall] = &[
    call(RESOURCE, "resourceslices", None, "list", KUBECTL_PLUGIN, "every node's slices, page by page"),
    call(RESOURCE, "resourceclaims", None, "list", KUBECTL_PLUGIN, "every claim: who holds which device"),
    call(RESOURCE, "deviceclasses", None, "list", KUBECTL_PLUGIN, "the classes' selectors, for why"),
    call("", "pods", None, "get", KUBECTL_PLUGIN, "the pod why explains"),
    call("", "nodes", None, "list", KUBECTL_PLUGIN, "the nodes' taints, labels and readiness; the opted-in nodes"),
];

/// Requests outside the resource API.
pub const NON_RESOURCE_CALLS: &[NonResourceCall] = &[NonResourceCall {
    path: "/version",
    verb: "get",
    file: PUBLISHER,
    why: "pick the slice layout from the server's version; the default ClusterRole \
          system:public-info-viewer allows it to everyone",
}];
