//! The fake API server of tests/support, driven through kube::Api with k8s-openapi types, as
//! production code will drive it (and a real kube-apiserver later).

use std::time::{Duration, Instant};

use crate::support::fake_apiserver::{ApiServer, Fault, FaultKind, Options};
use hyper::Method;
use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_stream::{Stream, StreamExt};

fn typed<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

/// The `Status` of an API error; anything else fails the test.
fn status(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn node(name: &str) -> Node {
    typed(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": "a"}}}))
}

fn slice(name: &str, node: &str, driver: &str, spec: Value) -> ResourceSlice {
    let mut s = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"node": node}},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
    });
    crate_merge(&mut s["spec"], spec);
    typed(s)
}

fn crate_merge(dst: &mut Value, src: Value) {
    if let (Some(d), Value::Object(s)) = (dst.as_object_mut(), src) {
        d.extend(s);
    }
}

fn counter_sets() -> Value {
    json!({"sharedCounters": [{"name": "gpu-0-counter-set", "counters": {
        "memory": {"value": "80Gi"}, "multiprocessors": {"value": "132"},
        "memory-slice-0": {"value": "1"}, "memory-slice-1": {"value": "1"},
    }}]})
}

fn mig_devices() -> Value {
    json!({"devices": [{
        "name": "gpu-0-mig-1g-10gb-0",
        "attributes": {"profile": {"string": "1g.10gb"}, "index": {"int": 0}, "driverVersion": {"version": "580.65.6"}},
        "capacity": {"memory": {"value": "10Gi"}, "multiprocessors": {"value": "16"}},
        "consumesCounters": [{"counterSet": "gpu-0-counter-set", "counters": {
            "memory": {"value": "10Gi"}, "multiprocessors": {"value": "16"}, "memory-slice-0": {"value": "1"},
        }}],
    }]})
}

fn claim() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.example.com"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "mig", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0-mig-1g-10gb-0"},
        ]}}},
    })
}

fn device_status(driver: &str, device: &str) -> Value {
    json!({"driver": driver, "pool": "n1", "device": device, "data": {"migUUID": "MIG-1"}, "conditions": [{
        "type": "Ready", "status": "True", "reason": "Prepared", "message": "",
        "lastTransitionTime": "2025-01-01T00:00:00Z",
    }]})
}

async fn next<K, S>(stream: &mut S) -> WatchEvent<K>
where
    S: Stream<Item = kube::Result<WatchEvent<K>>> + Unpin,
{
    let item = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.expect("a watch event in time");
    item.expect("the watch is open").expect("a well-formed event")
}

fn name_of(ev: &WatchEvent<ResourceSlice>) -> (&'static str, String) {
    let (ty, obj) = match ev {
        WatchEvent::Added(o) => ("ADDED", o),
        WatchEvent::Modified(o) => ("MODIFIED", o),
        WatchEvent::Deleted(o) => ("DELETED", o),
        other => panic!("unexpected event {other:?}"),
    };
    (ty, obj.metadata.name.clone().unwrap_or_default())
}

#[tokio::test]
async fn node_create_get_list_replace_patch_delete() {
    let server = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    let pp = PostParams::default();

    let created = nodes.create(&pp, &node("n1")).await.unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some() && meta.resource_version.is_some());
    let err = status(nodes.create(&pp, &node("n1")).await.unwrap_err());
    assert!(err.is_already_exists() && err.code == 409, "{err:?}");
    assert_eq!(nodes.get("n1").await.unwrap(), created);
    let list = nodes.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items, vec![created.clone()]);
    assert!(list.metadata.resource_version.is_some());

    let mut changed = created.clone();
    changed.metadata.labels.get_or_insert_default().insert("role".into(), "gpu".into());
    let replaced = nodes.replace("n1", &pp, &changed).await.unwrap();
    assert_ne!(replaced.metadata.resource_version, created.metadata.resource_version);
    assert_eq!(replaced.metadata.uid, created.metadata.uid);
    let err = status(nodes.replace("n1", &pp, &changed).await.unwrap_err());
    assert!(err.is_conflict(), "a stale resourceVersion conflicts: {err:?}");

    let merge = Patch::Merge(json!({"metadata": {"labels": {"zone": null}}}));
    let patched = nodes.patch("n1", &PatchParams::default(), &merge).await.unwrap();
    let labels = patched.metadata.labels.clone().unwrap();
    assert_eq!((labels.get("zone"), labels.get("role").map(String::as_str)), (None, Some("gpu")));

    let apply =
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": {"migdra": "yes"}}});
    let applied = nodes.patch("n1", &PatchParams::apply("migdra").force(), &Patch::Apply(apply)).await.unwrap();
    assert_eq!(applied.metadata.annotations.unwrap()["migdra"], "yes");
    assert_eq!(applied.metadata.labels.unwrap()["role"], "gpu", "apply merges with what others set");
    // Server-side apply creates a missing object.
    let apply = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}});
    nodes.patch("n2", &PatchParams::apply("migdra"), &Patch::Apply(apply)).await.unwrap();
    assert!(server.get("nodes/n2").is_some());

    // JSON patch (kube's Patch::Json needs the jsonpatch feature, so send it by hand).
    let ops = json!([
        {"op": "test", "path": "/metadata/labels/role", "value": "gpu"},
        {"op": "add", "path": "/metadata/labels/x", "value": "y"},
        {"op": "replace", "path": "/metadata/labels/role", "value": "cpu"},
    ]);
    let req = |ops: &Value| {
        hyper::Request::patch("/api/v1/nodes/n1")
            .header("content-type", "application/json-patch+json")
            .body(ops.to_string().into_bytes())
            .unwrap()
    };
    let client = server.client();
    let after: Node = client.request(req(&ops)).await.unwrap();
    let labels = after.metadata.labels.unwrap();
    assert_eq!((labels["x"].as_str(), labels["role"].as_str()), ("y", "cpu"));
    let failing = json!([{"op": "test", "path": "/metadata/labels/role", "value": "gpu"}]);
    let err = status(client.request::<Node>(req(&failing)).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));

    assert!(nodes.delete("n1", &DeleteParams::default()).await.unwrap().is_left());
    let err = status(nodes.get("n1").await.unwrap_err());
    assert!(err.is_not_found() && err.code == 404, "{err:?}");
    assert!(status(nodes.delete("n1", &DeleteParams::default()).await.unwrap_err()).is_not_found());
}

#[tokio::test]
async fn resourceslices_keep_counters_and_follow_the_release_rules() {
    let server = ApiServer::start().await;
    let slices: Api<ResourceSlice> = Api::all(server.client());
    let pp = PostParams::default();

    // 1.35 layout: counter sets and devices in separate slices of one pool.
    let mut counters = slice("", "n1", "gpu.example.com", counter_sets());
    counters.metadata.generate_name = Some("n1-gpu.example.com-".into());
    let devices = slice("n1-gpu-0", "n1", "gpu.example.com", mig_devices());
    let c = slices.create(&pp, &counters).await.unwrap();
    let d = slices.create(&pp, &devices).await.unwrap();
    let generated = c.metadata.name.clone().unwrap();
    assert!(generated.starts_with("n1-gpu.example.com-") && generated.len() == "n1-gpu.example.com-".len() + 5);
    assert_eq!(c.spec, counters.spec, "sharedCounters round-trip unchanged");
    assert_eq!(d.spec, devices.spec, "consumesCounters round-trip unchanged");
    assert_eq!(slices.get("n1-gpu-0").await.unwrap().spec, devices.spec);
    assert_eq!(
        server.get("resourceslices/n1-gpu-0").unwrap()["spec"]["devices"][0]["consumesCounters"],
        mig_devices()["devices"][0]["consumesCounters"]
    );

    // Bump the pool generation in place, by merge patch and by apply.
    let bump = Patch::Merge(json!({"spec": {"pool": {"generation": 2}}}));
    let bumped = slices.patch("n1-gpu-0", &PatchParams::default(), &bump).await.unwrap();
    assert_eq!((bumped.spec.pool.generation, bumped.metadata.generation), (2, Some(2)));
    assert_eq!(bumped.spec.devices, devices.spec.devices);
    let mut again = slice("n1-gpu-0", "n1", "gpu.example.com", mig_devices());
    again.spec.pool.generation = 3;
    let applied =
        slices.patch("n1-gpu-0", &PatchParams::apply("gpu.example.com").force(), &Patch::Apply(&again)).await.unwrap();
    assert_eq!(applied.spec, again.spec);

    // From 1.35 a slice may not hold both.
    let mut both = serde_json::to_value(slice("both", "n1", "gpu.example.com", counter_sets())).unwrap();
    crate_merge(&mut both["spec"], mig_devices());
    let err = status(slices.create(&pp, &typed(both.clone())).await.unwrap_err());
    assert!(err.is_invalid() && err.message.contains("only one of"), "{err:?}");

    // 1.34: combined is the rule, and devices consume only sets of their own slice.
    let old = ApiServer::start_with(Options { minor: 34, ..Options::default() }).await;
    let old_slices: Api<ResourceSlice> = Api::all(old.client());
    let made = old_slices.create(&pp, &typed(both.clone())).await.unwrap();
    assert_eq!(serde_json::to_value(made.spec).unwrap(), both["spec"]);
    let err = status(old_slices.create(&pp, &devices).await.unwrap_err());
    assert!(err.is_invalid(), "{err:?}");
    assert_eq!(old.client().apiserver_version().await.unwrap().git_version, "v1.34.0");

    // Gate off: the counter fields vanish silently, as a real server drops them.
    let gated = ApiServer::start_with(Options { partitionable_devices: false, ..Options::default() }).await;
    let gated_slices: Api<ResourceSlice> = Api::all(gated.client());
    assert_eq!(gated_slices.create(&pp, &counters).await.unwrap().spec.shared_counters, None);
    let dropped = gated_slices.create(&pp, &devices).await.unwrap();
    assert_eq!(dropped.spec.devices.unwrap()[0].consumes_counters, None);
}

#[tokio::test]
async fn claim_status_subresource_conflicts_then_retry_succeeds() {
    let server = ApiServer::start().await;
    server.insert(claim());
    let claims: Api<ResourceClaim> = Api::namespaced(server.client(), "default");
    let pp = PostParams::default();
    let read = claims.get("c1").await.unwrap();
    assert_eq!(
        read.status.as_ref().unwrap().allocation.as_ref().unwrap().devices.as_ref().unwrap().results.as_ref().unwrap()
            [0]
        .pool,
        "n1"
    );

    // Someone else writes the claim between our read and our status write.
    let label = Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}}));
    claims.patch("c1", &PatchParams::default(), &label).await.unwrap();
    let ours = device_status("gpu.example.com", "gpu-0-mig-1g-10gb-0");
    let mut stale = read.clone();
    stale.status.as_mut().unwrap().devices = Some(vec![typed(ours.clone())]);
    let err = status(claims.replace_status("c1", &pp, &stale).await.unwrap_err());
    assert!(err.is_conflict() && err.code == 409, "{err:?}");

    let mut fresh = claims.get("c1").await.unwrap();
    fresh.status.as_mut().unwrap().devices = Some(vec![typed(ours.clone())]);
    fresh.metadata.labels = None; // ignored: /status writes change only the status
    let written = claims.replace_status("c1", &pp, &fresh).await.unwrap();
    assert_eq!(written.metadata.labels.unwrap()["touched"], "yes");
    assert_eq!(server.get("resourceclaims/default/c1").unwrap()["status"]["devices"][0], ours);

    // A write to the main resource keeps the stored status.
    let mut main = claims.get("c1").await.unwrap();
    main.status = None;
    let kept = claims.replace("c1", &pp, &main).await.unwrap();
    assert_eq!(kept.status.unwrap().devices.unwrap().len(), 1);

    // Apply on /status merges status.devices per (driver, pool, device) and per field manager.
    let other = device_status("other.example.com", "nic-0");
    let apply = |devices: Value| {
        Patch::Apply(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c1"},
            "status": {"devices": devices}
        }))
    };
    claims.patch_status("c1", &PatchParams::apply("other.example.com"), &apply(json!([other]))).await.unwrap();
    claims.patch_status("c1", &PatchParams::apply("gpu.example.com"), &apply(json!([ours]))).await.unwrap();
    let both = server.get("resourceclaims/default/c1").unwrap()["status"]["devices"].clone();
    assert_eq!(both, json!([ours, other]));
    claims.patch_status("c1", &PatchParams::apply("gpu.example.com"), &apply(json!([]))).await.unwrap();
    assert_eq!(
        server.get("resourceclaims/default/c1").unwrap()["status"]["devices"],
        json!([other]),
        "unprepare removes only ours"
    );

    // A create never carries status; a status write to a missing claim is NotFound.
    let mut copy: ResourceClaim = typed(claim());
    copy.metadata.name = Some("c2".into());
    assert_eq!(claims.create(&pp, &copy).await.unwrap().status, None);
    assert!(status(claims.replace_status("c3", &pp, &copy).await.unwrap_err()).is_not_found());

    // Deleted behind the driver's back, between the kubelet's call and the GET.
    assert!(server.remove("resourceclaims/default/c1").is_some());
    assert!(status(claims.get("c1").await.unwrap_err()).is_not_found());
}

#[tokio::test]
async fn label_and_field_selectors_list_and_delete_collections() {
    let server = ApiServer::start().await;
    let slices: Api<ResourceSlice> = Api::all(server.client());
    for (name, node, driver) in
        [("a", "n1", "gpu.example.com"), ("b", "n2", "gpu.example.com"), ("c", "n1", "nic.example.com")]
    {
        slices.create(&PostParams::default(), &slice(name, node, driver, mig_devices())).await.unwrap();
    }
    let names = |lp: ListParams| {
        let slices = slices.clone();
        async move {
            slices.list(&lp).await.unwrap().items.into_iter().map(|s| s.metadata.name.unwrap()).collect::<Vec<_>>()
        }
    };
    assert_eq!(names(ListParams::default().fields("spec.nodeName=n1")).await, ["a", "c"]);
    assert_eq!(names(ListParams::default().fields("spec.nodeName=n1,spec.driver=gpu.example.com")).await, ["a"]);
    assert_eq!(names(ListParams::default().fields("spec.pool.name=n2")).await, ["b"]);
    assert_eq!(names(ListParams::default().fields("metadata.name!=a")).await, ["b", "c"]);
    assert_eq!(names(ListParams::default().labels("node=n1")).await, ["a", "c"]);
    assert_eq!(names(ListParams::default().labels("node!=n1")).await, ["b"]);
    assert_eq!(names(ListParams::default().labels("node,!missing,node==n2")).await, ["b"]);
    assert_eq!(names(ListParams::default().labels("missing")).await, Vec::<String>::new());

    let page = slices.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(page.items.len(), 2);
    let token = page.metadata.continue_.expect("a continue token");
    let rest = slices.list(&ListParams::default().limit(2).continue_token(&token)).await.unwrap();
    assert_eq!(rest.items[0].metadata.name.as_deref(), Some("c"));

    let err = status(slices.list(&ListParams::default().fields("spec.devices=x")).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));

    let gone = slices
        .delete_collection(&DeleteParams::default(), &ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(gone.left().unwrap().items.len(), 2);
    assert_eq!(names(ListParams::default()).await, ["b"]);
}

#[tokio::test]
async fn watch_streams_added_modified_deleted_and_resumes() {
    let server = ApiServer::start().await;
    let slices: Api<ResourceSlice> = Api::all(server.client());
    let pp = PostParams::default();
    slices.create(&pp, &slice("s0", "n1", "gpu.example.com", counter_sets())).await.unwrap();

    let mut events = Box::pin(slices.watch(&WatchParams::default().timeout(30), "0").await.unwrap());
    assert_eq!(name_of(&next(&mut events).await), ("ADDED", "s0".into()));
    let s1 = slices.create(&pp, &slice("s1", "n1", "gpu.example.com", mig_devices())).await.unwrap();
    assert_eq!(name_of(&next(&mut events).await), ("ADDED", "s1".into()));
    let relabel = Patch::Merge(json!({"metadata": {"labels": {"node": "moved"}}}));
    slices.patch("s1", &PatchParams::default(), &relabel).await.unwrap();
    assert_eq!(name_of(&next(&mut events).await), ("MODIFIED", "s1".into()));
    slices.delete("s1", &DeleteParams::default()).await.unwrap();
    assert_eq!(name_of(&next(&mut events).await), ("DELETED", "s1".into()));

    // Resuming from a resourceVersion replays what came after it, nothing before.
    let rv = s1.metadata.resource_version.unwrap();
    let mut resumed = Box::pin(slices.watch(&WatchParams::default(), &rv).await.unwrap());
    assert_eq!(name_of(&next(&mut resumed).await), ("MODIFIED", "s1".into()));
    assert_eq!(name_of(&next(&mut resumed).await), ("DELETED", "s1".into()));

    // kube-runtime's default watcher: list from the cache with a page limit, then watch from the list.
    let listed = slices.list(&ListParams::default().match_any().limit(500)).await.unwrap();
    let mut from_list =
        Box::pin(slices.watch(&WatchParams::default(), &listed.metadata.resource_version.unwrap()).await.unwrap());
    slices.create(&pp, &slice("s3", "n2", "gpu.example.com", mig_devices())).await.unwrap();
    assert_eq!(name_of(&next(&mut from_list).await), ("ADDED", "s3".into()));

    // Selectors: an object leaving the selection is DELETED for that watch.
    slices.create(&pp, &slice("s2", "n1", "gpu.example.com", mig_devices())).await.unwrap();
    let mut mine = Box::pin(slices.watch(&WatchParams::default().labels("node=n1"), "0").await.unwrap());
    let mut initial = vec![name_of(&next(&mut mine).await), name_of(&next(&mut mine).await)];
    initial.sort();
    assert_eq!(initial, [("ADDED", "s0".to_string()), ("ADDED", "s2".to_string())]);
    slices.patch("s2", &PatchParams::default(), &relabel).await.unwrap();
    assert_eq!(name_of(&next(&mut mine).await), ("DELETED", "s2".into()));

    // Streaming list, as kube-runtime's watcher asks for it: initial objects, then the bookmark.
    let wp = WatchParams::default().initial_events().fields("spec.nodeName=n1");
    let mut streamed = Box::pin(slices.watch(&wp, "0").await.unwrap());
    assert_eq!(name_of(&next(&mut streamed).await).0, "ADDED");
    assert_eq!(name_of(&next(&mut streamed).await).0, "ADDED");
    match next(&mut streamed).await {
        WatchEvent::Bookmark(b) => assert!(b.metadata.annotations.contains_key("k8s.io/initial-events-end")),
        other => panic!("expected the initial-events-end bookmark, got {other:?}"),
    }

    // An apiserver restart ends open watches cleanly.
    server.close_watches();
    let ended = tokio::time::timeout(Duration::from_secs(5), streamed.next()).await.expect("the watch ends");
    assert!(ended.is_none());

    // timeoutSeconds ends the stream.
    let mut short = Box::pin(slices.watch(&WatchParams::default().timeout(1), "0").await.unwrap());
    let drained = tokio::time::timeout(Duration::from_secs(5), async { while short.next().await.is_some() {} }).await;
    assert!(drained.is_ok(), "the watch closes after timeoutSeconds");
}

#[tokio::test]
async fn injected_faults_surface_as_kube_errors() {
    let server = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    nodes.create(&PostParams::default(), &node("n1")).await.unwrap();
    let fault = |method: Option<Method>, kind: FaultKind, times: Option<u32>| Fault {
        method,
        path_contains: "/nodes/n1".into(),
        kind,
        times,
    };

    server.fault(fault(Some(Method::GET), FaultKind::Status(500), Some(1)));
    let err = status(nodes.get("n1").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (500, "InternalError"));
    nodes.get("n1").await.expect("the fault hit once");

    server.fault(fault(Some(Method::PUT), FaultKind::Status(409), None));
    nodes.get("n1").await.expect("another method passes");
    let current = nodes.get("n1").await.unwrap();
    assert!(status(nodes.replace("n1", &PostParams::default(), &current).await.unwrap_err()).is_conflict());
    server.clear_faults();
    nodes.replace("n1", &PostParams::default(), &current).await.expect("cleared");

    // kube's client retries 503 by itself.
    server.clear_requests();
    server.fault(fault(None, FaultKind::Status(503), Some(2)));
    nodes.get("n1").await.expect("retried past two 503s");
    let codes: Vec<u16> = server.requests().into_iter().map(|(_, _, code)| code).collect();
    assert_eq!(codes, [503, 503, 200]);

    server.fault(fault(None, FaultKind::Delay(Duration::from_millis(300)), Some(1)));
    let start = Instant::now();
    nodes.get("n1").await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(300));
    let mut config = server.config();
    config.read_timeout = Some(Duration::from_millis(100));
    let impatient: Api<Node> = Api::all(kube::Client::try_from(config).unwrap());
    server.fault(fault(None, FaultKind::Delay(Duration::from_secs(2)), Some(1)));
    let err = impatient.get("n1").await.unwrap_err();
    assert!(!matches!(err, kube::Error::Api(_)), "a client timeout, not an answer: {err:?}");

    server.clear_requests();
    server.fault(fault(None, FaultKind::Drop, Some(1)));
    let err = nodes.get("n1").await.unwrap_err();
    assert!(matches!(err, kube::Error::HyperError(_) | kube::Error::Service(_)), "{err:?}");
    assert_eq!(server.requests()[0].2, 0, "logged as dropped");
    nodes.get("n1").await.expect("the next connection works");
}

#[tokio::test]
async fn outage_answers_500_closes_watches_and_recovers() {
    let server = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    nodes.create(&PostParams::default(), &node("n1")).await.unwrap();
    let mut watch = Box::pin(nodes.watch(&WatchParams::default(), "0").await.unwrap());
    assert!(matches!(next(&mut watch).await, WatchEvent::Added(_)));

    server.set_down(true);
    let ended = tokio::time::timeout(Duration::from_secs(5), watch.next()).await.expect("the watch ends");
    assert!(ended.is_none());
    for _ in 0..3 {
        assert_eq!(status(nodes.get("n1").await.unwrap_err()).code, 500);
    }
    assert_eq!(status(nodes.watch(&WatchParams::default(), "0").await.err().expect("refused")).code, 500);

    server.set_down(false);
    assert_eq!(nodes.get("n1").await.unwrap().metadata.name.as_deref(), Some("n1"));
    let mut watch = Box::pin(nodes.watch(&WatchParams::default(), "0").await.unwrap());
    assert!(matches!(next(&mut watch).await, WatchEvent::Added(_)));
}

#[tokio::test]
async fn version_kubeconfig_events_and_deviceclasses() {
    let server = ApiServer::start().await;
    let info = server.client().apiserver_version().await.unwrap();
    assert_eq!((info.major.as_str(), info.minor.as_str(), info.git_version.as_str()), ("1", "35", "v1.35.0"));

    let dir = tempfile::tempdir().unwrap();
    let path = server.kubeconfig(dir.path());
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
    let client = kube::Client::try_from(config).unwrap();
    assert_eq!(client.apiserver_version().await.unwrap().minor, "35");

    let event: Event = typed(json!({
        "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "n1."},
        "involvedObject": {"kind": "Node", "name": "n1"},
        "reason": "CountersDropped", "type": "Warning", "message": "m",
    }));
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events.create(&PostParams::default(), &event).await.unwrap();
    let found =
        events.list(&ListParams::default().fields("involvedObject.name=n1,reason=CountersDropped")).await.unwrap();
    assert_eq!(found.items.len(), 1);
    assert_eq!(server.list("/api/v1/namespaces/default/events").len(), 1);

    let modern: k8s_openapi::api::events::v1::Event = typed(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"},
        "eventTime": "2025-01-01T00:00:00.000000Z", "reportingController": "gpu.example.com", "reportingInstance": "n1",
        "action": "Prepare", "reason": "PrepareFailed", "type": "Warning",
        "regarding": {"kind": "ResourceClaim", "name": "c1"},
    }));
    Api::namespaced(client.clone(), "default").create(&PostParams::default(), &modern).await.unwrap();
    assert!(server.get("/apis/events.k8s.io/v1/namespaces/default/events/e1").is_some());

    let class: DeviceClass = typed(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mig.example.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.example.com\""}}]},
    }));
    let classes: Api<DeviceClass> = Api::all(client);
    classes.create(&PostParams::default(), &class).await.unwrap();
    assert_eq!(classes.get("mig.example.com").await.unwrap().spec, class.spec);
}
