//! The kubelet's side of a real `migdra serve` process: every test starts the daemon on simulated
//! GPUs (a `--sim-state` file) in a temporary directory, and talks to it as the kubelet does, over
//! the real Unix sockets and the real protocol (registration, DRA v1 and v1beta1, health). What the
//! hardware holds afterwards is read back with `migdra layout -o json`, the checkpoint with
//! `migdra claims -o json`.

#![allow(clippy::print_stdout)] // tests that measure print their figures

use crate::support::claim::{claim_ref, uid};
use crate::support::command::{Run, migdra};
use crate::support::eventually::eventually;
use crate::support::node::NodeDir;
use crate::support::{DRIVER, NAMESPACE, NODE};
use migdra::claims::ClaimRef;
use migdra::kubelet::client::{Device, Prepared, TestKubelet, Version};
use migdra::kubelet::proto::health_v1::{HealthStatus, NodeWatchResourcesResponse};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

const SPEC: &str = "h100-80gb:2,a100-40gb:1:mig-off";
/// Every CI create takes 2 s: long enough to do something to a prepare in flight.
const SLOW_CI: (&str, &str) = ("MIGDRA_SIM_FAULTS", "create-ci=delay:2s");

/// A node of [`SPEC`]'s simulated GPUs.
fn sim_node() -> NodeDir {
    NodeDir::new().simulate(SPEC)
}

fn ok_devices(prepared: &Prepared, uid: &str) -> Vec<Device> {
    match prepared.get(uid) {
        Some(Ok(devices)) => devices.clone(),
        other => panic!("claim {uid}: expected devices, got {other:?} (whole response {prepared:?})"),
    }
}

fn error_of(prepared: &Prepared, uid: &str) -> String {
    match prepared.get(uid) {
        Some(Err(e)) => e.clone(),
        other => panic!("claim {uid:?}: expected an error, got {other:?}"),
    }
}

/// The one device a claim allocated to `device` must come back as.
fn assert_device(devices: &[Device], uid: &str, device: &str) {
    assert_eq!(
        devices,
        [Device {
            request_names: vec!["gpu".into()],
            pool: NODE.into(),
            device: device.into(),
            cdi_ids: vec![format!("{DRIVER}/claim={uid}-{device}")],
        }],
        "claim {uid}"
    );
}

/// Whether a Unix socket is at `path`.
fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Poll `f` every 5 ms for up to `timeout`; how long it took, or `None`.
async fn within(what: &str, timeout: Duration, f: impl FnMut() -> bool) -> Option<Duration> {
    eventually(what).within(timeout).every(Duration::from_millis(5)).measure(f).await
}

/// Waits until the GPU instance at `(minor, profile ID, start)` is the only instance and has no
/// compute instance yet: the window [`SLOW_CI`] opens, which a test acts in.
async fn wait_for_bare_gi(node: &NodeDir, (minor, profile, start): (u64, u64, u64), log: impl Fn() -> String) {
    let want = [(minor, profile, start, 0)];
    let seen = eventually("the GPU instance without its compute instance")
        .within(Duration::from_secs(5))
        .every(Duration::from_millis(20))
        .measure(|| node.placements() == want)
        .await;
    assert!(seen.is_some(), "no GPU instance {want:?} alone: {:?}\n{}", node.placements(), log());
}

/// Device name → health, from one health message.
fn health_map(msg: &NodeWatchResourcesResponse) -> BTreeMap<String, HealthStatus> {
    msg.devices
        .iter()
        .map(|d| {
            let id = d.device.clone().expect("a device identifier");
            assert_eq!(id.pool_name, NODE, "{d:?}");
            (id.device_name, HealthStatus::try_from(d.health).expect("a known health value"))
        })
        .collect()
}

/// Read health messages until one satisfies `want` (10 s at most).
pub(crate) async fn health_until(
    stream: &mut migdra::kubelet::client::HealthStream,
    what: &str,
    want: impl Fn(&BTreeMap<String, HealthStatus>) -> bool,
) -> BTreeMap<String, HealthStatus> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = BTreeMap::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(msg) = tokio::time::timeout(left, stream.message()).await else {
            panic!("no health message with {what} within 10 s; the last said {last:?}");
        };
        let msg = msg.expect("health stream failed").expect("health stream ended");
        last = health_map(&msg);
        if want(&last) {
            return last;
        }
    }
}

/// Every device the node publishes: all partitions of each H100 (from `migdra profiles`), and
/// the whole A100, which has MIG off.
fn published_devices(minors: &[u64]) -> BTreeSet<String> {
    let profiles = migdra().args(["profiles", "--model", "h100-80gb", "-o", "json"]).json();
    let mut names = BTreeSet::new();
    for minor in &minors[..2] {
        for p in profiles["profiles"].as_array().unwrap() {
            let slug = p["name"].as_str().unwrap().replace(['.', '+'], "");
            for start in p["placements"].as_array().unwrap() {
                names.insert(format!("gpu-{minor}-mig-{slug}-{}-{start}", p["id"]));
            }
        }
    }
    names.insert(format!("gpu-{}", minors[2]));
    names
}

/// What a kubelet checks at registration: GetInfo says DRAPlugin, our driver name, an endpoint
/// that is our DRA socket (0600, in a 0750 directory), and exactly the services we serve, v1
/// first; `--health false` drops the health service from the list (and from the socket). The
/// DRA socket is there before the registration socket, because the kubelet connects to it as
/// soon as it registers us.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_handshake() {
    let node = sim_node();
    let mut daemon = node.serve().spawn();
    let appeared = within("the registration socket", Duration::from_secs(15), || {
        let reg = is_socket(&daemon.registration);
        if reg {
            assert!(is_socket(&daemon.dra), "the registration socket appeared before the DRA socket");
        }
        reg
    })
    .await;
    assert!(appeared.is_some(), "no registration socket:\n{}", daemon.log());
    daemon.wait_ready().await;

    let kubelet = daemon.register().await;
    let info = &kubelet.info;
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(Path::new(&info.endpoint), daemon.dra);
    assert!(Path::new(&info.endpoint).is_absolute());
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
    );
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&daemon.dra), 0o600, "DRA socket mode");
    assert_eq!(mode(&daemon.registration), 0o600, "registration socket mode");
    assert_eq!(mode(&node.plugin_dir()), 0o750, "plugin directory mode");
    // A 1.37 kubelet picks v1; a 1.36 one calls v1alpha1 whatever the list says. Both streams
    // carry the same devices and health.
    let mut v1 = kubelet.watch_health().await.expect("health is served");
    assert_eq!(v1.version(), "v1.DRAResourceHealth");
    let mut older = kubelet.clone();
    older.info.supported_versions.retain(|v| v != "v1.DRAResourceHealth");
    let mut v1alpha1 = older.watch_health().await.expect("v1alpha1 is served too");
    assert_eq!(v1alpha1.version(), "v1alpha1.DRAResourceHealth");
    let first = |m: Option<NodeWatchResourcesResponse>| health_map(&m.expect("a first message"));
    let (a, b) = (first(v1.message().await.unwrap()), first(v1alpha1.message().await.unwrap()));
    assert!(!a.is_empty());
    assert_eq!(a, b, "both versions stream the same health");
    let log = daemon.log();
    for version in ["v1", "v1alpha1"] {
        assert!(
            log.contains(&format!("health stream opened version=\"{version}\""))
                || log.contains(&format!("\"version\":\"{version}\"")),
            "{log}"
        );
    }
    drop(daemon);

    let node = sim_node();
    let daemon = node.serve().args(["--health", "false"]).ready().await;
    let kubelet = daemon.register().await;
    assert_eq!(kubelet.info.supported_versions, ["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
    let err = kubelet.watch_health().await.expect_err("health is not served with --health false");
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err}");
}

/// A 1.34+ kubelet speaks v1, a 1.33 kubelet v1beta1, and across a kubelet upgrade a claim
/// prepared through one is unprepared through the other. Each prepare creates exactly the
/// allocated placement; repeating it returns the same devices and creates nothing; unprepare
/// leaves the hardware and the checkpoint empty, and an unknown claim unprepares without error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_and_v1beta1_prepare_and_unprepare() {
    let node = sim_node();
    let m = node.minors();
    let (a, b) = (uid(1), uid(2));
    let (dev_a, dev_b) = (format!("gpu-{}-mig-3g40gb-9-4", m[0]), format!("gpu-{}-mig-1g10gb-19-6", m[1]));
    node.write_claim(&a, &dev_a);
    node.write_claim(&b, &dev_b);
    let daemon = node.serve().ready().await;
    let kubelet = daemon.register().await;

    let first_a = kubelet.prepare(Version::V1, &[claim_ref(&a)]).await.unwrap();
    let first_b = kubelet.prepare(Version::V1beta1, &[claim_ref(&b)]).await.unwrap();
    assert_device(&ok_devices(&first_a, &a), &a, &dev_a);
    assert_device(&ok_devices(&first_b, &b), &b, &dev_b);
    assert_eq!(node.placements(), {
        let mut want = vec![(m[0], 9, 4, 1), (m[1], 19, 6, 1)];
        want.sort_unstable();
        want
    });
    assert_eq!(node.cdi_specs(), 2);
    let before = node.instances();

    for version in [Version::V1, Version::V1beta1] {
        assert_eq!(kubelet.prepare(version, &[claim_ref(&a)]).await.unwrap(), first_a, "{version:?} repeat");
        assert_eq!(kubelet.prepare(version, &[claim_ref(&b)]).await.unwrap(), first_b, "{version:?} repeat");
    }
    assert_eq!(node.instances(), before, "a repeated prepare changed the hardware");

    let gone = kubelet.unprepare(Version::V1beta1, &[claim_ref(&a)]).await.unwrap();
    assert_eq!(gone, BTreeMap::from([(a.clone(), String::new())]));
    let gone = kubelet.unprepare(Version::V1, &[claim_ref(&b)]).await.unwrap();
    assert_eq!(gone, BTreeMap::from([(b.clone(), String::new())]));
    assert_eq!(node.instances(), []);
    assert_eq!(node.checkpoint(), Vec::<Value>::new());
    assert_eq!(node.cdi_specs(), 0);

    let unknown = uid(99);
    for version in [Version::V1, Version::V1beta1] {
        let r = kubelet.unprepare(version, &[claim_ref(&unknown), claim_ref(&a)]).await.unwrap();
        assert_eq!(r, BTreeMap::from([(unknown.clone(), String::new()), (a.clone(), String::new())]), "{version:?}");
    }
}

/// `--host-root`: a prepare whose spec names a host device node that is missing fails in one
/// line naming it (the kubelet's answer, where `kubectl describe pod` shows it), not at
/// container creation as containerd's `failed to stat CDI host device`; it leaves nothing on the
/// node. Once the nodes exist the kubelet's retry prepares it. Making them needs mknod (root).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_host_device_node_fails_the_prepare_in_one_line() {
    let host = tempfile::tempdir().unwrap();
    let node = sim_node().host_root(host.path());
    let m = node.minors();
    let a = uid(1);
    let dev = format!("gpu-{}-mig-3g40gb-9-4", m[0]);
    node.write_claim(&a, &dev);
    let daemon = node.serve().ready().await;
    let kubelet = daemon.register().await;

    let err = error_of(&kubelet.prepare(Version::V1, &[claim_ref(&a)]).await.unwrap(), &a);
    println!("prepare: {err}");
    let ctl = host.path().join("dev/nvidiactl");
    assert!(
        err.ends_with(&format!("{} does not exist: is the NVIDIA driver loaded on this node?", ctl.display())),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert_eq!(node.instances(), []);
    assert_eq!(node.checkpoint(), Vec::<Value>::new());
    assert_eq!(node.cdi_specs(), 0);

    if !crate::support::node::make_device_nodes(host.path(), &m) {
        crate::support::skip::skip(crate::support::skip::ROOT, "the present-nodes half: mknod refused (not root)");
        return;
    }
    assert_device(&ok_devices(&kubelet.prepare(Version::V1, &[claim_ref(&a)]).await.unwrap(), &a), &a, &dev);
    assert_eq!(node.placements(), [(m[0], 9, 4, 1)]);
}

/// The kubelet ignores a whole response that lacks a claim it asked for, so each distinct UID
/// gets exactly one entry: a good claim succeeds next to a claim the source does not know, bad
/// device names, an empty UID and a missing name, each of which fails alone and leaves nothing
/// on the GPUs. A call with far too many claims is refused as a whole (InvalidArgument) and the
/// daemon keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_entry_per_claim_and_bad_claims_fail_alone() {
    let node = sim_node();
    let m = node.minors();
    let good = uid(1);
    let good_dev = format!("gpu-{}-mig-3g40gb-9-0", m[0]);
    node.write_claim(&good, &good_dev);
    let absent = uid(2);
    let malformed = uid(3);
    node.write_claim(&malformed, &format!("gpu-{}-mig-bogus", m[0]));
    let bad_placement = uid(4);
    node.write_claim(&bad_placement, &format!("gpu-{}-mig-3g40gb-9-2", m[1]));
    let no_name = uid(5);
    node.write_claim(&no_name, &format!("gpu-{}-mig-1g10gb-19-0", m[1]));
    let other_node = uid(6);
    node.write_claim(&other_node, "gpu-99-mig-3g40gb-9-0");

    let daemon = node.serve().ready().await;
    let kubelet = daemon.register().await;
    let request = [
        claim_ref(&good),
        claim_ref(&absent),
        claim_ref(&malformed),
        claim_ref(&bad_placement),
        ClaimRef { uid: String::new(), namespace: NAMESPACE.into(), name: "no-uid".into() },
        ClaimRef { name: String::new(), ..claim_ref(&no_name) },
        claim_ref(&other_node),
        claim_ref(&good),
    ];
    for version in [Version::V1, Version::V1beta1] {
        let r = kubelet.prepare(version, &request).await.unwrap();
        let keys: BTreeSet<&str> = r.keys().map(String::as_str).collect();
        let want: BTreeSet<&str> =
            [good.as_str(), &absent, &malformed, &bad_placement, "", &no_name, &other_node].into();
        assert_eq!(keys, want, "{version:?}: one entry per distinct UID");
        assert_device(&ok_devices(&r, &good), &good, &good_dev);
        for (uid, needle) in [
            (&absent, absent.as_str()),
            (&malformed, "bogus"),
            (&bad_placement, "placement"),
            (&String::new(), "UID"),
            (&no_name, "name"),
            (&other_node, "gpu-99"),
        ] {
            let e = error_of(&r, uid);
            assert!(!e.is_empty() && e.contains(needle), "{version:?} claim {uid:?}: error {e:?} lacks {needle:?}");
            println!("{version:?} {uid:?}: {e}");
        }
        assert_eq!(node.placements(), [(m[0], 9, 0, 1)], "{version:?}: only the good claim holds an instance");
        assert_eq!(node.cdi_specs(), 1);
    }

    let many: Vec<ClaimRef> = (0..10_000).map(|n| claim_ref(&uid(1000 + n))).collect();
    for version in [Version::V1, Version::V1beta1] {
        let err = kubelet.prepare(version, &many).await.expect_err("10,000 claims in one call");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        let err = kubelet.unprepare(version, &many).await.expect_err("10,000 claims in one call");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    }
    let again = kubelet.prepare(Version::V1, &[claim_ref(&good)]).await.unwrap();
    assert_device(&ok_devices(&again, &good), &good, &good_dev);
    let r = kubelet.unprepare(Version::V1, &[claim_ref(&good)]).await.unwrap();
    assert_eq!(r, BTreeMap::from([(good.clone(), String::new())]));
    assert_eq!(node.instances(), []);
}

/// The real kubelet adds a plugin to its DRA manager before it confirms the registration
/// (NotifyRegistrationStatus), so a prepare can arrive first: it is served. An empty call, which
/// the kubelet never sends and the readiness probe does, says Unavailable until the confirmation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_before_the_registration_is_confirmed_are_served() {
    let node = sim_node();
    let m = node.minors();
    let c = uid(1);
    let dev = format!("gpu-{}-mig-2g20gb-14-2", m[1]);
    node.write_claim(&c, &dev);
    let daemon = node.serve().ready().await;

    let early = TestKubelet::unregistered(&daemon.dra).await.unwrap();
    for version in [Version::V1, Version::V1beta1] {
        let err = early.prepare(version, &[]).await.expect_err("an empty call before registration");
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    }
    let r = early.prepare(Version::V1beta1, &[claim_ref(&c)]).await.unwrap();
    assert_device(&ok_devices(&r, &c), &c, &dev);
    assert_eq!(node.placements(), [(m[1], 14, 2, 1)]);
    let r = early.unprepare(Version::V1, &[claim_ref(&c)]).await.unwrap();
    assert_eq!(r, BTreeMap::from([(c.clone(), String::new())]));
    assert_eq!(node.instances(), []);

    let _kubelet = daemon.register().await;
    early.prepare(Version::V1, &[]).await.expect("an empty call once registered");
    let r = early.prepare(Version::V1, &[claim_ref(&c)]).await.unwrap();
    assert_device(&ok_devices(&r, &c), &c, &dev);
}

/// The health stream: the first message lists every device the node publishes as healthy; a
/// GPU gone bad turns all of its partitions unhealthy (they inherit the parent's health) and
/// nothing else; a bad GPU instance turns just its own partition unhealthy.
/// With `--device-names slurm` the health stream names every device exactly as `slices` publishes
/// it: the whole A100 as `0002-gpu-<minor>`, the dynamic partitions by their plain names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_names_devices_as_the_slices_do_under_slurm_names() {
    let node = sim_node();
    let m = node.minors();
    let daemon = node.serve().args(["--device-names", "slurm"]).ready().await;
    let kubelet = daemon.register().await;
    let slices = node.command(&["slices", "-o", "json", "--device-names", "slurm"]).json();
    let published: BTreeSet<String> = slices["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    let mut want = published_devices(&m);
    want.remove(&format!("gpu-{}", m[2]));
    want.insert(format!("0002-gpu-{}", m[2]));
    assert_eq!(published, want);
    let mut stream = kubelet.watch_health().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(health_map(&first).keys().cloned().collect::<BTreeSet<_>>(), published);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_stream_follows_gpus_and_instances() {
    let node = sim_node();
    let m = node.minors();
    let c = uid(1);
    let dev = format!("gpu-{}-mig-3g40gb-9-4", m[1]);
    node.write_claim(&c, &dev);
    let daemon = node.serve().ready().await;
    let kubelet = daemon.register().await;
    let all = published_devices(&m);
    assert_eq!(all.len(), 2 * 25 + 1);

    let mut stream = kubelet.watch_health().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
    let first = health_map(&first);
    assert_eq!(first.keys().cloned().collect::<BTreeSet<_>>(), all, "the first message lists every device");
    assert!(first.values().all(|h| *h == HealthStatus::Healthy), "{first:?}");

    let gpu0 = format!("gpu-{}-", m[0]);
    node.cli(&["sim", "health", "--gpu", "0", "--unhealthy"]);
    let started = Instant::now();
    let h = health_until(&mut stream, "GPU 0 unhealthy", |h| {
        h.iter().any(|(d, s)| d.starts_with(&gpu0) && *s == HealthStatus::Unhealthy)
    })
    .await;
    println!("GPU 0 unhealthy reported after {:?}", started.elapsed());
    assert_eq!(h.keys().cloned().collect::<BTreeSet<_>>(), all, "every message lists every device");
    for (d, s) in &h {
        let want = if d.starts_with(&gpu0) { HealthStatus::Unhealthy } else { HealthStatus::Healthy };
        assert_eq!(*s, want, "{d}");
    }

    let r = kubelet.prepare(Version::V1, &[claim_ref(&c)]).await.unwrap();
    assert_device(&ok_devices(&r, &c), &c, &dev);
    let gi = node.instances().into_iter().find(|i| i.0 == m[1]).expect("the claim's instance").4;
    node.cli(&["sim", "health", "--gpu", "1", "--gi", &gi.to_string(), "--unhealthy"]);
    let h = health_until(&mut stream, "the instance unhealthy", |h| h[&dev] == HealthStatus::Unhealthy).await;
    for (d, s) in &h {
        let want = if d.starts_with(&gpu0) || *d == dev { HealthStatus::Unhealthy } else { HealthStatus::Healthy };
        assert_eq!(*s, want, "{d}");
    }

    node.cli(&["sim", "health", "--gpu", "0"]);
    let h = health_until(&mut stream, "GPU 0 healthy again", |h| {
        h.iter().all(|(d, s)| !d.starts_with(&gpu0) || *s == HealthStatus::Healthy)
    })
    .await;
    assert_eq!(h[&dev], HealthStatus::Unhealthy);
}

/// A kubelet that restarts may wipe its registration directory; the plugin notices within its
/// check interval, puts a new socket there (the kubelet's watcher needs a Create event) and can
/// be registered through it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_registration_socket_is_recreated() {
    let node = sim_node();
    let m = node.minors();
    let c = uid(1);
    let dev = format!("gpu-{}", m[2]);
    node.write_claim(&c, &dev);
    let daemon = node.serve().ready().await;
    let _first = daemon.register().await;

    // The inode alone could be reused by the file system; with the change time it cannot.
    let identity = |p: &Path| std::fs::symlink_metadata(p).ok().map(|m| (m.ino(), m.ctime(), m.ctime_nsec()));
    let old = identity(&daemon.registration).unwrap();
    std::fs::remove_file(&daemon.registration).unwrap();
    let took = within("a new registration socket", Duration::from_secs(1), || is_socket(&daemon.registration)).await;
    let Some(took) = took else { panic!("the registration socket was not re-created within 1 s:\n{}", daemon.log()) };
    println!("registration socket re-created after {took:?}");
    assert_ne!(identity(&daemon.registration).unwrap(), old, "a new socket");

    let mut daemon = daemon;
    daemon.wait_ready().await;
    let kubelet = daemon.register().await;
    let r = kubelet.prepare(Version::V1, &[claim_ref(&c)]).await.unwrap();
    assert_device(&ok_devices(&r, &c), &c, &dev);
    assert!(daemon.log().contains("re-creating"), "the daemon says why:\n{}", daemon.log());
}

/// SIGKILL while a prepare is between creating the GPU instance and its compute instance: a new
/// daemon on the same directories recovers, the kubelet's retry completes the claim with exactly
/// one instance, and unprepare leaves neither instances nor checkpoint entries behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_prepare_converges_after_restart() {
    let node = sim_node();
    let m = node.minors();
    let c = uid(1);
    let dev = format!("gpu-{}-mig-4g40gb-5-0", m[0]);
    node.write_claim(&c, &dev);

    let mut slow = node.serve().env(SLOW_CI.0, SLOW_CI.1).ready().await;
    let kubelet = slow.register().await;
    let inflight = tokio::spawn({
        let (kubelet, c) = (kubelet.clone(), claim_ref(&c));
        async move { kubelet.prepare(Version::V1, &[c]).await }
    });
    wait_for_bare_gi(&node, (m[0], 5, 0), || slow.log()).await;
    assert!(!inflight.is_finished(), "the prepare should still be creating the compute instance");
    slow.kill();
    let killed = tokio::time::timeout(Duration::from_secs(5), inflight).await.unwrap().unwrap();
    assert!(killed.is_err(), "a killed daemon answered: {killed:?}");
    assert_eq!(node.placements(), [(m[0], 5, 0, 0)], "killed with the GPU instance and no compute instance");
    drop(slow);

    let daemon = node.serve().ready().await;
    let kubelet = daemon.register().await;
    let r = kubelet.prepare(Version::V1, &[claim_ref(&c)]).await.unwrap();
    assert_device(&ok_devices(&r, &c), &c, &dev);
    assert_eq!(node.placements(), [(m[0], 5, 0, 1)], "exactly the claim's instance");

    let r = kubelet.unprepare(Version::V1, &[claim_ref(&c)]).await.unwrap();
    assert_eq!(r, BTreeMap::from([(c.clone(), String::new())]));
    assert_eq!(node.instances(), []);
    assert_eq!(node.checkpoint(), Vec::<Value>::new());
    assert_eq!(node.cdi_specs(), 0);
}

/// A kubelet whose call times out hangs up mid-prepare. The prepare is not cut off half-way:
/// the daemon keeps serving, and the kubelet's retry of the same claim gets the devices, with
/// exactly one instance on the GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_prepare() {
    let node = sim_node();
    let m = node.minors();
    let c = uid(1);
    let dev = format!("gpu-{}-mig-1g20gb-15-6", m[1]);
    node.write_claim(&c, &dev);
    let mut daemon = node.serve().env(SLOW_CI.0, SLOW_CI.1).ready().await;
    let kubelet = daemon.register().await;

    // Its own connection, closed with the call.
    let impatient = TestKubelet::unregistered(&daemon.dra).await.unwrap();
    let call = tokio::spawn({
        let c = claim_ref(&c);
        async move { impatient.prepare(Version::V1, &[c]).await }
    });
    wait_for_bare_gi(&node, (m[1], 15, 6), || daemon.log()).await;
    assert!(!call.is_finished(), "the prepare should still be in flight");
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());

    let started = Instant::now();
    let r = kubelet.prepare(Version::V1, &[claim_ref(&c)]).await.unwrap();
    println!("the retry returned after {:?}", started.elapsed());
    assert_device(&ok_devices(&r, &c), &c, &dev);
    assert_eq!(node.placements(), [(m[1], 15, 6, 1)], "exactly one instance");
    assert!(daemon.running(), "the daemon died:\n{}", daemon.log());
    assert_eq!(kubelet.prepare(Version::V1beta1, &[claim_ref(&c)]).await.unwrap(), r);
    let r = kubelet.unprepare(Version::V1, &[claim_ref(&c)]).await.unwrap();
    assert_eq!(r, BTreeMap::from([(c.clone(), String::new())]));
    assert_eq!(node.instances(), []);
}

/// SIGTERM (a pod deletion or rolling update) while a prepare is in flight: the registration
/// socket goes first, so the kubelet stops sending; the prepare still completes and is answered;
/// the process exits 0 within the grace period (an open health stream and an idle registration
/// connection, which a kubelet holds, do not hold it up) and removes its DRA socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_calls_then_exits() {
    let node = sim_node();
    let m = node.minors();
    let c = uid(1);
    let dev = format!("gpu-{}-mig-2g20gb-14-4", m[0]);
    node.write_claim(&c, &dev);
    let grace = Duration::from_secs(10);
    let mut daemon = node.serve().args(["--grace", "10s"]).env(SLOW_CI.0, SLOW_CI.1).ready().await;
    let kubelet = daemon.register().await;
    let inflight = tokio::spawn({
        let (kubelet, c) = (kubelet.clone(), claim_ref(&c));
        async move { kubelet.prepare(Version::V1, &[c]).await }
    });
    // What a real kubelet holds open besides: the health stream and a registration connection.
    let mut health = kubelet.watch_health().await.unwrap();
    health.message().await.unwrap().expect("a first health message");
    let _registration = migdra::kubelet::client::connect(
        &daemon.registration,
        &migdra::kubelet::client::registration_authority(&daemon.registration),
    )
    .await
    .unwrap();
    wait_for_bare_gi(&node, (m[0], 14, 4), || daemon.log()).await;
    assert!(!inflight.is_finished(), "the prepare should still be in flight");

    let term = Instant::now();
    daemon.sigterm();
    let (reg, dra) = (daemon.registration.clone(), daemon.dra.clone());
    let gone = within("the registration socket to go", Duration::from_secs(2), || {
        let gone = !reg.exists();
        if gone {
            assert!(is_socket(&dra), "the DRA socket went before the registration socket");
        }
        gone
    })
    .await;
    assert!(gone.is_some(), "the registration socket is still there:\n{}", daemon.log());
    assert!(!inflight.is_finished(), "the registration socket should go before the prepare finishes");

    let r = tokio::time::timeout(grace, inflight).await.unwrap().unwrap();
    let r = r.unwrap_or_else(|e| panic!("the in-flight prepare failed: {e}\n{}", daemon.log()));
    assert_device(&ok_devices(&r, &c), &c, &dev);
    let exit = daemon.wait_exit(grace).await;
    println!("registration socket gone after {:?}, exit {exit:?} after {:?}", gone.unwrap(), term.elapsed());
    let exit = exit.unwrap_or_else(|| panic!("still running after the grace period:\n{}", daemon.log()));
    assert!(exit.success(), "exit {exit:?}:\n{}", daemon.log());
    assert!(!daemon.dra.exists(), "the DRA socket was left behind");
    let end = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            match health.message().await {
                Ok(Some(_)) => {}
                end => return end,
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the health stream did not end with the process");
    assert_eq!(node.placements(), [(m[0], 14, 4, 1)], "the prepared claim keeps its instance");
    assert_eq!(node.checkpoint().len(), 1);
}

/// With a pod UID (rolling updates: old and new pod registered at once) both socket names carry
/// it, and the endpoint the kubelet is given is the UID's DRA socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_uid_names_the_sockets() {
    let node = sim_node();
    let daemon = node.serve().pod_uid("abc").ready().await;
    assert!(is_socket(&node.plugin_dir().join("dra-abc.sock")));
    assert!(is_socket(&node.registry_dir().join(format!("{DRIVER}-abc-reg.sock"))));
    assert!(!node.plugin_dir().join("dra.sock").exists());
    assert!(!node.registry_dir().join(format!("{DRIVER}-reg.sock")).exists());
    let kubelet = daemon.register().await;
    assert_eq!(Path::new(&kubelet.info.endpoint), node.plugin_dir().join("dra-abc.sock"));
    let r = kubelet.unprepare(Version::V1, &[claim_ref(&uid(1))]).await.unwrap();
    assert_eq!(r, BTreeMap::from([(uid(1), String::new())]));
}

/// A registration socket that cannot be created must stop the daemon with an error the pod's
/// restart makes visible, not leave it running unregistered; and without `--state-dir`, the
/// plugin directory (which then also holds the checkpoint) is still 0750.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_socket_that_cannot_be_made_stops_the_daemon() {
    let node = sim_node();
    std::fs::create_dir_all(node.registry_dir()).unwrap();
    std::fs::write(node.registry_dir().join(format!("{DRIVER}-reg.sock")), b"not a socket").unwrap();
    let mut daemon = node.serve().spawn();
    let status = daemon.wait_exit(Duration::from_secs(10)).await.expect("the daemon stops");
    assert_eq!(status.code(), Some(1), "{}", daemon.log());
    assert!(daemon.log().contains("not a socket"), "{}", daemon.log());

    let plain = NodeDir::new().without_state_dir().simulate(SPEC);
    let _daemon = plain.serve().default_intervals().ready().await;
    let mode = std::fs::metadata(plain.plugin_dir()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o750);
    let lock = std::fs::read_dir(plain.plugin_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "lock"));
    if let Some(lock) = lock {
        assert_eq!(std::fs::metadata(lock).unwrap().permissions().mode() & 0o777, 0o600);
    }
}

/// One gRPC call written by hand, frame by frame, the way a foreign client puts it on the wire, so
/// that neither tonic's client nor migdra's own re-framing shapes the request.
mod wire {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::path::Path;
    use std::time::Duration;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    /// What came back on stream 1.
    #[derive(Debug, Default)]
    pub struct Answer {
        pub headers: Vec<(String, String)>,
        pub data: Vec<u8>,
        /// RST_STREAM's error code, or GOAWAY's.
        pub reset: Option<u32>,
    }

    impl Answer {
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
        }
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// POST `message` (a protobuf) to `path` with `authority`; read until the call ends, or, with
    /// `streaming`, until its first message arrives.
    pub fn call(socket: &Path, authority: &[u8], path: &str, message: &[u8], streaming: bool) -> Answer {
        let mut s = UnixStream::connect(socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let block = loona_hpack::Encoder::new().encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]);
        let mut body = vec![0];
        body.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        body.extend_from_slice(message);
        let mut out = PREFACE.to_vec();
        out.extend(frame(0x4, 0, 0, &[]));
        out.extend(frame(0x1, 0x4, 1, &block));
        out.extend(frame(0x0, 0x1, 1, &body));
        s.write_all(&out).unwrap();

        let mut answer = Answer::default();
        let mut decoder = loona_hpack::Decoder::new();
        loop {
            let mut head = [0u8; 9];
            if s.read_exact(&mut head).is_err() {
                return answer;
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let (kind, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
            let mut payload = vec![0; len];
            s.read_exact(&mut payload).unwrap();
            match (kind, stream) {
                (0x4, 0) if flags & 0x1 == 0 => s.write_all(&frame(0x4, 0x1, 0, &[])).unwrap(),
                (0x1, 1) => {
                    for (n, v) in decoder.decode(&payload).expect("the server's headers decode") {
                        answer.headers.push((String::from_utf8(n).unwrap(), String::from_utf8_lossy(&v).into()));
                    }
                    if flags & 0x1 != 0 {
                        return answer;
                    }
                }
                (0x0, 1) => {
                    answer.data.extend_from_slice(&payload);
                    if streaming || flags & 0x1 != 0 {
                        return answer;
                    }
                }
                (0x3, 1) | (0x7, 0) => {
                    let at = if kind == 0x7 { 4 } else { 0 };
                    answer.reset = Some(u32::from_be_bytes(payload[at..at + 4].try_into().unwrap()));
                    return answer;
                }
                _ => {}
            }
        }
    }
}

/// The kubelet's plugin manager dials the registration socket by its path and grpc-go sends that
/// path percent-encoded as `:authority`; gRPC C-core clients send it raw. h2 refuses both, and the
/// real kubelet never registered migdra. Every socket must answer every form, on the wire as a
/// foreign client writes it, and the daemon says at debug level what it replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_socket_answers_the_authority_grpc_clients_send_over_unix_sockets() {
    let node = sim_node();
    let daemon = node.serve().args(["--log-level", "debug"]).ready().await;
    let _kubelet = daemon.register().await;
    let calls: [(&Path, &str, bool); 4] = [
        (&daemon.registration, "/pluginregistration.Registration/GetInfo", false),
        (&daemon.dra, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", false),
        (&daemon.dra, "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources", false),
        (&daemon.dra, "/v1alpha1.DRAResourceHealth/NodeWatchResources", true),
    ];
    for (socket, path, streaming) in calls {
        let socket_path = socket.to_string_lossy().into_owned();
        let encoded = migdra::kubelet::authority::grpc_go_authority(&socket_path);
        for authority in [encoded.as_str(), socket_path.as_str(), "localhost", ""] {
            let answer = wire::call(socket, authority.as_bytes(), path, &[], streaming);
            assert_eq!(answer.reset, None, "{path} with :authority {authority:?} was reset: {answer:?}");
            assert_eq!(answer.header(":status"), Some("200"), "{path} with {authority:?}: {answer:?}");
            if streaming {
                assert!(!answer.data.is_empty(), "{path} with {authority:?}: no message: {answer:?}");
            } else {
                assert_eq!(answer.header("grpc-status"), Some("0"), "{path} with {authority:?}: {answer:?}");
            }
            println!("{path} with :authority {authority:?}: answered");
        }
    }
    let log = daemon.log();
    assert!(
        log.contains("serving it as localhost") && log.contains("%2F"),
        "the replaced authority is not logged at debug level:\n{log}"
    );
    // A header block that cannot be decoded is refused, logged, and the daemon goes on serving.
    let mut s = std::os::unix::net::UnixStream::connect(&daemon.registration).unwrap();
    std::io::Write::write_all(&mut s, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\x02\x01\x04\0\0\0\x01\xff\xff").unwrap();
    let mut rest = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = std::io::Read::read_to_end(&mut s, &mut rest);
    assert!(
        within("the refusal logged", Duration::from_secs(5), || daemon.log().contains("refusing an HTTP/2 connection"))
            .await
            .is_some(),
        "a refused connection is not logged:\n{}",
        daemon.log()
    );
    let again = wire::call(&daemon.registration, b"localhost", "/pluginregistration.Registration/GetInfo", &[], false);
    assert_eq!(again.header("grpc-status"), Some("0"), "{again:?}");
}

/// A repeated prepare of a completed claim hands the kubelet CDI IDs again; if the spec behind
/// them was deleted (by hand, a tmpfs wipe, an external cleanup) or changed, the container could
/// not start. The repeat writes it again; `cleanup` reports and repairs it; a restart repairs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_changed_spec_is_written_again() {
    let node = sim_node();
    let m = node.minors();
    let a = uid(1);
    let device = format!("gpu-{}-mig-3g40gb-9-4", m[0]);
    node.write_claim(&a, &device);
    let spec_path = node.cdi_dir().join(format!("{DRIVER}-claim_{a}.json"));
    let mut daemon = node.serve().ready().await;
    let kubelet = daemon.register().await;
    let first = kubelet.prepare(Version::V1, &[claim_ref(&a)]).await.unwrap();
    let written = std::fs::read(&spec_path).unwrap();
    let instances = node.instances();

    std::fs::remove_file(&spec_path).unwrap();
    assert_eq!(kubelet.prepare(Version::V1, &[claim_ref(&a)]).await.unwrap(), first);
    assert_eq!(std::fs::read(&spec_path).unwrap(), written, "a deleted spec is written again, the same");
    std::fs::write(&spec_path, b"{\"cdiVersion\":\"0.6.0\",\"kind\":\"x/y\",\"devices\":[]}").unwrap();
    assert_eq!(kubelet.prepare(Version::V1beta1, &[claim_ref(&a)]).await.unwrap(), first);
    assert_eq!(std::fs::read(&spec_path).unwrap(), written, "a changed spec is written again");
    assert_eq!(node.instances(), instances, "repairing a spec touches no instance");
    let spec: Value = serde_json::from_slice(&written).unwrap();
    let cdi_id = &ok_devices(&first, &a)[0].cdi_ids[0];
    let (kind, name) = cdi_id.split_once('=').unwrap();
    assert_eq!(spec["kind"], kind);
    assert!(spec["devices"].as_array().unwrap().iter().any(|d| d["name"] == name), "{cdi_id} resolves");
    assert!(daemon.log().contains("CDI spec was missing on disk"), "{}", daemon.log());
    println!("prepare again after the spec was deleted / changed: rewritten, {cdi_id} resolves");

    std::fs::remove_file(&spec_path).unwrap();
    let dry: Value = serde_json::from_str(&node.cli(&["cleanup", "--dry-run", "-o", "json"])).unwrap();
    assert_eq!(dry["brokenCdiSpecs"][0]["uid"], a.as_str(), "{dry}");
    assert_eq!(dry["brokenCdiSpecs"][0]["problem"], "missing", "{dry}");
    assert_eq!(dry["brokenCdiSpecs"][0]["action"], "would write it again", "{dry}");
    assert!(!spec_path.exists(), "a dry run changed nothing");
    let table = node.cli(&["cleanup", "--dry-run"]);
    assert!(table.contains("broken CDI spec") && table.contains("is missing"), "{table}");
    let done: Value = serde_json::from_str(&node.cli(&["cleanup", "-o", "json"])).unwrap();
    assert_eq!(done["brokenCdiSpecs"][0]["action"], "written again", "{done}");
    assert_eq!(std::fs::read(&spec_path).unwrap(), written);
    assert_eq!(node.cli(&["cleanup", "--dry-run"]).trim(), "nothing to clean up");

    std::fs::remove_file(&spec_path).unwrap();
    drop(kubelet);
    daemon.kill();
    let daemon = node.serve().ready().await;
    assert_eq!(std::fs::read(&spec_path).unwrap(), written, "startup recovery writes the spec again");
    assert_eq!(node.instances(), instances);
    assert!(daemon.log().contains("CDI spec was missing on disk"), "{}", daemon.log());
}
