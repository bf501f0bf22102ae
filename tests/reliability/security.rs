//! Security: modes of what the daemon creates, no TCP listener unless asked, claims of other
//! nodes and drivers refused, claim data that cannot steer a path out of its directory, request
//! size limits, and the DaemonSet's privileges each documented.

use crate::common::figure;
use crate::support::claim::{Claim, claim_ref, uid};
use crate::support::node::NodeDir;
use crate::support::{DRIVER, NAMESPACE, NODE};
use migdra::claims::ClaimRef;
use migdra::kubelet::client::Version;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// `claim` with these allocation results (a JSON array), however wrong.
fn with_results(claim: Claim, results: &Value) -> Claim {
    results.as_array().unwrap().iter().fold(claim, |c, r| c.result(r.clone()))
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o7777
}

/// Every file under `dir`, recursively.
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p.clone());
            }
            out.insert(p);
        }
    }
    out
}

/// Inodes of the TCP sockets in LISTEN state, from /proc/net/tcp and tcp6, with their local
/// address (hex, as the kernel writes it).
fn tcp_listeners() -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(f).unwrap_or_default().lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && cols[3] == "0A" {
                out.push((cols[9].parse().unwrap_or(0), cols[1].to_string()));
            }
        }
    }
    out
}

/// The socket inodes the process holds open.
fn socket_inodes(pid: u32) -> BTreeSet<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        .collect()
}

/// Local addresses of the TCP listeners `pid` holds.
fn listeners_of(pid: u32) -> Vec<String> {
    let mine = socket_inodes(pid);
    tcp_listeners().into_iter().filter(|(ino, _)| mine.contains(ino)).map(|(_, a)| a).collect()
}

/// Sockets 0600 in 0750 directories, the checkpoint 0600 in a 0750 state dir, CDI specs 0644
/// (runtimes read them; documented in src/cdi/writer.rs); and no TCP listener unless
/// `--metrics-addr` asks for one, which then listens on loopback only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modes_and_listeners() {
    let node = NodeDir::new().simulate("h100-80gb:1");
    let m = node.minors()[0];
    let u = uid(1);
    node.write_claim(&u, &format!("gpu-{m}-mig-3g40gb-9-0"));
    let (daemon, kubelet) = node.serve().registered().await;
    assert!(kubelet.prepare(Version::V1, &[claim_ref(&u)]).await.unwrap()[&u].is_ok());
    let spec = std::fs::read_dir(node.cdi_dir()).unwrap().next().unwrap().unwrap().path();
    let expected: Vec<(&str, PathBuf, u32)> = vec![
        ("DRA socket", daemon.dra.clone(), 0o600),
        ("registration socket", daemon.registration.clone(), 0o600),
        ("plugin dir", node.plugin_dir(), 0o750),
        ("registry dir", node.registry_dir(), 0o750),
        ("state dir", node.state_dir(), 0o750),
        ("checkpoint", node.state_dir().join("checkpoint.json"), 0o600),
        ("CDI spec", spec, 0o644),
    ];
    let mut wrong = Vec::new();
    for (what, path, want) in &expected {
        let got = mode(path);
        if got != *want {
            wrong.push(format!("{what} {got:o} (want {want:o})"));
        }
    }
    let listening = listeners_of(daemon.pid());
    drop(daemon);

    // With --metrics-addr on loopback, the one listener is on loopback.
    let (daemon, _kubelet) = node.serve().args(["--metrics-addr", "127.0.0.1:0"]).registered().await;
    let mut metrics = Vec::new();
    for _ in 0..50 {
        metrics = listeners_of(daemon.pid());
        if !metrics.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    drop(daemon);
    // 0100007F:port is 127.0.0.1 as /proc/net/tcp writes it.
    let loopback = metrics.iter().filter(|a| a.starts_with("0100007F:")).count();
    let asked = format!("{loopback} of {} on loopback with --metrics-addr 127.0.0.1:0", metrics.len());
    let section = "security";
    figure(
        section,
        "file and socket modes as documented",
        format!(
            "{}/{} (sockets 0600, dirs 0750, checkpoint 0600, CDI spec 0644)",
            expected.len() - wrong.len(),
            expected.len()
        ),
    );
    figure(section, "TCP listeners of `migdra serve`", format!("{} by default; {asked}", listening.len()));
    assert!(wrong.is_empty(), "{wrong:?}");
    assert!(listening.is_empty(), "{listening:?}");
    assert_eq!((metrics.len(), loopback), (1, 1), "the metrics listener: {metrics:?}");
}

/// Claims allocated to another node's pool, another driver, nothing, or a device that does not
/// exist are refused one by one, and nothing is created for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_not_ours_are_refused() {
    let node = NodeDir::new().simulate("h100-80gb:1");
    let m = node.minors()[0];
    let dev = format!("gpu-{m}-mig-3g40gb-9-0");
    let cases = [
        ("other node", json!([{"request": "gpu", "driver": DRIVER, "pool": "node-b", "device": dev}])),
        ("other driver", json!([{"request": "gpu", "driver": "gpu.example.com", "pool": NODE, "device": dev}])),
        ("not allocated", json!([])),
        (
            "no such device",
            json!([{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-99-mig-3g40gb-9-0"}]),
        ),
        ("bad device name", json!([{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "../../../etc"}])),
    ];
    let mut refs = Vec::new();
    for (i, (_, results)) in cases.iter().enumerate() {
        let u = uid(i as u32 + 1);
        node.write(&with_results(Claim::new(&u), results));
        refs.push(claim_ref(&u));
    }
    // A claim that is ours, but the kubelet names it in another namespace.
    let u = uid(100);
    node.write_claim(&u, &dev);
    refs.push(ClaimRef { uid: u.clone(), namespace: "team-b".into(), name: format!("claim-{u}") });

    let (_daemon, kubelet) = node.serve().registered().await;
    let r = kubelet.prepare(Version::V1, &refs).await.unwrap();
    let refused = refs.iter().filter(|c| r[&c.uid].is_err()).count();
    // Each refusal reaches the kubelet as one line that names the claim.
    for c in &refs {
        if let Err(e) = &r[&c.uid] {
            assert!(!e.contains('\n') && e.contains(&c.uid), "one line naming claim {}: {e:?}", c.uid);
        }
    }
    let created = node.placements().len() + node.checkpoint().len() + node.cdi_specs();
    figure(
        "security",
        "claims not allocated to this node and driver refused",
        format!(
            "{refused}/{} (other node, other driver, unallocated, unknown or bad device, wrong namespace)",
            refs.len()
        ),
    );
    assert_eq!((refused, created), (refs.len(), 0), "{r:?}");
}

/// Claim UIDs, names and namespaces that would make a path (`..`, `/`, NUL, very long) are
/// refused, and no file appears anywhere but where the daemon keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_data_cannot_escape_directories() {
    let node = NodeDir::new().simulate("h100-80gb:1");
    let m = node.minors()[0];
    let dev = format!("gpu-{m}-mig-1g10gb-19-0");
    let long = "a".repeat(300);
    let hostile = ["../escaped", "../../../../tmp/escaped", "a/b", "..", ".", "x\0y", "/abs", long.as_str(), "UPPER"];
    let mut refs = Vec::new();
    for (i, h) in hostile.iter().enumerate() {
        // The claim object really carries the hostile UID, so a lookup by UID finds it.
        node.write_as(&format!("hostile-{i}"), &Claim::new(*h).named(format!("claim-{i}")).device(NODE, &dev));
        refs.push(ClaimRef { uid: (*h).to_string(), namespace: NAMESPACE.into(), name: format!("claim-{i}") });
    }
    // Good UIDs with hostile names: names are not used in paths, so these may be prepared.
    for (i, h) in ["../../escaped-name", "a/../../b"].iter().enumerate() {
        let u = uid(i as u32 + 1);
        node.write(&Claim::new(&u).named(*h).device(NODE, &format!("gpu-{m}-mig-1g10gb-19-{}", i + 1)));
        refs.push(ClaimRef { uid: u, namespace: NAMESPACE.into(), name: (*h).to_string() });
    }
    let (daemon, kubelet) = node.serve().registered().await;
    let outside = ["/tmp/escaped", "/escaped", "/abs"].map(Path::new);
    let outside_before = outside.iter().filter(|p| p.exists()).count();
    let before = tree(node.path());
    let r = kubelet.prepare(Version::V1, &refs).await.unwrap();
    let names_refused = refs[hostile.len()..].iter().filter(|c| r[&c.uid].is_err()).count();
    let u = kubelet.unprepare(Version::V1, &refs).await.unwrap();
    let after = tree(node.path());
    // The daemon writes only its state, its CDI specs, and (the simulator) the GPU state file.
    let own = |p: &Path| {
        let rel = p.strip_prefix(node.path()).unwrap().to_string_lossy().to_string();
        ["state", "cdi", "plugins", "registry", "gpus.json", ".gpus.json"].iter().any(|o| rel.starts_with(o))
    };
    let escaped: Vec<&PathBuf> = after.difference(&before).filter(|p| !own(p)).collect();
    let outside_after: Vec<&&Path> = outside.iter().filter(|p| p.exists()).collect();
    let escaped_count = escaped.len() + outside_after.len().saturating_sub(outside_before);
    let refused = refs[..hostile.len()].iter().filter(|c| r.get(&c.uid).is_none_or(Result::is_err)).count();
    let instances = node.placements().len() + node.cdi_specs();
    assert!(u.values().all(String::is_empty) || refused > 0, "{u:?}");
    drop(daemon);
    figure(
        "security",
        "hostile claim UIDs refused (`..`, `/`, NUL, 300 chars, …)",
        format!(
            "{refused}/{}; `../` in claim names: {names_refused}/2 refused; files outside the daemon's directories: {}",
            hostile.len(),
            escaped_count
        ),
    );
    assert_eq!(escaped_count, 0, "{escaped:?} {outside_after:?}");
    assert_eq!(instances, 0, "everything unprepared");
    assert_eq!(refused, hostile.len(), "{r:?}");
}

/// More claims than one call may carry, and a message over the gRPC limit, are refused whole;
/// the daemon keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_sizes_are_limited() {
    let node = NodeDir::new().simulate("h100-80gb:1");
    let m = node.minors()[0];
    let u = uid(1);
    node.write_claim(&u, &format!("gpu-{m}-mig-7g80gb-0-0"));
    let (mut daemon, kubelet) = node.serve().registered().await;
    let max = migdra::kubelet::MAX_CLAIMS_PER_CALL;
    let many: Vec<ClaimRef> = (0..=max as u32).map(|i| claim_ref(&uid(10_000 + i))).collect();
    let too_many = kubelet.prepare(Version::V1, &many).await.expect_err("too many claims");
    let huge = vec![ClaimRef { uid: "a".repeat(5 << 20), namespace: NAMESPACE.into(), name: "big".into() }];
    let too_big = kubelet.prepare(Version::V1, &huge).await.expect_err("a 5 MiB request");
    assert_eq!(too_many.code(), tonic::Code::InvalidArgument, "{too_many:?}");
    assert_eq!(too_big.code(), tonic::Code::OutOfRange, "{too_big:?}");
    assert_eq!(too_many.message().lines().count(), 1, "one line: {:?}", too_many.message());
    assert!(daemon.running(), "{}", daemon.log());
    let kubelet = daemon.register().await;
    let r = kubelet.prepare(Version::V1, &[claim_ref(&u)]).await.unwrap();
    assert!(r[&u].is_ok(), "{r:?}");
    assert!(kubelet.unprepare(Version::V1, &[claim_ref(&u)]).await.unwrap()[&u].is_empty());
    figure(
        "security",
        "request size limits",
        format!("{} claims: {:?}; 5 MiB message: {:?}; daemon still serves", max + 1, too_many.code(), too_big.code()),
    );
}

/// The DaemonSet asks for no host namespaces, no added capabilities and no Bidirectional mounts;
/// its one privilege (privileged, for /dev/nvidia*) and each hostPath it mounts carry a comment
/// that says why; host paths it only reads are mounted read-only.
#[test]
fn daemonset_privileges_are_few_and_documented() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("daemonset/base/daemonset.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let ds: serde_json::Value = serde_norway::from_str(&text).unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    let mut findings = Vec::new();
    for ns in ["hostNetwork", "hostPID", "hostIPC"] {
        if pod[ns].as_bool() == Some(true) {
            findings.push(format!("{ns} is on"));
        }
    }
    let lines: Vec<&str> = text.lines().collect();
    // A key is documented when a comment sits right above it (or above the list item it is in).
    let documented = |needle: &str| {
        lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.trim_start().starts_with(needle))
            .any(|(i, _)| lines[..i].iter().rev().take(3).any(|l| l.trim_start().starts_with('#')))
    };
    let mut privileges = Vec::new();
    let host_paths: Vec<String> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v.get("hostPath").is_some())
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    for c in pod["containers"].as_array().unwrap().iter().chain(pod["initContainers"].as_array().into_iter().flatten())
    {
        let sc = &c["securityContext"];
        if sc["privileged"].as_bool() == Some(true) {
            privileges.push("privileged".to_string());
            if !documented("privileged:") {
                findings.push("privileged: true without a comment".into());
            }
        }
        if sc["capabilities"]["add"].as_array().is_some_and(|a| !a.is_empty()) {
            findings.push(format!("capabilities added: {}", sc["capabilities"]["add"]));
        }
        if sc["readOnlyRootFilesystem"].as_bool() != Some(true) {
            findings.push("root file system is writable".into());
        }
        for mount in c["volumeMounts"].as_array().into_iter().flatten() {
            let name = mount["name"].as_str().unwrap();
            if mount["mountPropagation"] == "Bidirectional" {
                findings.push(format!("{name}: Bidirectional mount propagation"));
            }
            if host_paths.iter().any(|h| h == name) {
                privileges.push(format!("hostPath {name}{}", if mount["readOnly"] == true { " (ro)" } else { "" }));
                if !documented(&format!("- name: {name}")) {
                    findings.push(format!("hostPath mount {name} without a comment"));
                }
            }
        }
    }
    figure(
        "security",
        "DaemonSet privileges (each with a comment saying why)",
        format!("{}; host namespaces, added capabilities, Bidirectional mounts: none", privileges.join(", ")),
    );
    assert!(findings.is_empty(), "{findings:?}");
}
