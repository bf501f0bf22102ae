//! Outages: the API server down or slow, the kubelet restarting with its registration directory
//! wiped, a node reboot, and a state directory that is read-only or full. In each the daemon keeps
//! running, fails what it cannot do with a clear error, and recovers by itself.

use crate::common::figure;
use crate::support::claim::{Claim, claim_ref, uid};
use crate::support::eventually::eventually;
use crate::support::fake_apiserver::{ApiServer, Fault, FaultKind};
use crate::support::node::NodeDir;
use crate::support::{DRIVER, NAMESPACE, NODE};
use migdra::kubelet::client::{TestKubelet, Version};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The reason in an error, cut to fit a table cell: the claim's name and UID that lead every
/// per-claim error are dropped and temporary paths shortened.
fn short(e: &str, tmp: &Path) -> String {
    let line = e.lines().next().unwrap_or_default().replace('|', "/").replace(&tmp.display().to_string(), "…");
    let text = match line.strip_prefix("claim ") {
        Some(rest) => rest.split_once("): ").map_or(line.as_str(), |(_, r)| r),
        None => line.as_str(),
    };
    let mut out: String = text.chars().take(240).collect();
    if text.chars().count() > 240 {
        out.push('…');
    }
    out
}

async fn prepare_until_ok(kubelet: &TestKubelet, u: &str, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Ok(r) = kubelet.prepare(Version::V1, &[claim_ref(u)]).await
            && r[u].is_ok()
        {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

fn prepare_error(r: &migdra::kubelet::client::Prepared, u: &str) -> String {
    match &r[u] {
        Ok(d) => panic!("claim {u} prepared: {d:?}"),
        Err(e) => e.clone(),
    }
}

// === API server ===

/// Claim `uid` on the API server, allocated `device` of this node.
fn claim_object(uid: &str, device: &str) -> Value {
    Claim::new(uid).device(NODE, device).object()
}

fn slice_count(api: &ApiServer) -> usize {
    api.list("resourceslices").len()
}

fn status_written(api: &ApiServer, uid: &str) -> bool {
    api.get(&format!("resourceclaims/{NAMESPACE}/claim-{uid}"))
        .and_then(|c| c["status"]["devices"].as_array().map(|d| d.iter().any(|d| d["driver"] == DRIVER)))
        .unwrap_or(false)
}

/// How long `f` took to hold, polling every 50 ms for up to `limit`.
async fn until(what: &str, limit: Duration, f: impl FnMut() -> bool) -> Option<Duration> {
    eventually(what).within(limit).every(Duration::from_millis(50)).measure(f).await
}

/// Down for 5 s (500 on everything), then slow (2 s per request), then status writes alone
/// failing: prepare fails clearly while the claim cannot be read, and slices and status catch up
/// once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_down_or_slow() {
    let api = ApiServer::start().await;
    let node = NodeDir::new().simulate("h100-80gb:2");
    let kubeconfig = api.kubeconfig(node.path());
    let node = node.kubeconfig(kubeconfig);
    api.insert(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let m = node.minors();
    let (mut daemon, kubelet) = node.serve().registered().await;
    until("slices", Duration::from_secs(20), || slice_count(&api) > 0).await.expect("slices published");
    let slices = slice_count(&api);
    let section = "outage: API server";

    // Down.
    let (a, b, c) = (uid(1), uid(2), uid(3));
    api.insert(claim_object(&a, &format!("gpu-{}-mig-3g40gb-9-0", m[0])));
    api.set_down(true);
    let victim = api.list("resourceslices")[0]["metadata"]["name"].as_str().unwrap().to_string();
    api.remove(&format!("resourceslices/{victim}"));
    let r = kubelet.prepare(Version::V1, &[claim_ref(&a)]).await.unwrap();
    let err = prepare_error(&r, &a);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(daemon.running(), "the daemon died in the outage:\n{}", daemon.log());
    assert!(node.placements().is_empty(), "nothing is created for a claim that cannot be read");
    api.set_down(false);
    let took = prepare_until_ok(&kubelet, &a, Duration::from_secs(60)).await.expect("prepare after the outage");
    let republished = until("the deleted slice", Duration::from_secs(60), || slice_count(&api) >= slices)
        .await
        .expect("the deleted slice comes back");
    let status =
        until("the claim status", Duration::from_secs(30), || status_written(&api, &a)).await.expect("status written");
    figure(section, "down 5 s: prepare answers", format!("error `{}`", short(&err, node.path())));
    figure(
        section,
        "down 5 s: after it is back",
        format!(
            "prepare OK in {:.1} s, deleted slice back in {:.1} s, claim status in {:.1} s",
            took.as_secs_f64(),
            republished.as_secs_f64(),
            (took + status).as_secs_f64()
        ),
    );

    // Slow: every request waits 2 s.
    api.insert(claim_object(&b, &format!("gpu-{}-mig-3g40gb-9-4", m[0])));
    api.fault(Fault {
        method: None,
        path_contains: String::new(),
        kind: FaultKind::Delay(Duration::from_secs(2)),
        times: None,
    });
    let took = prepare_until_ok(&kubelet, &b, Duration::from_secs(60)).await.expect("prepare with a slow server");
    let status =
        until("the claim status", Duration::from_secs(60), || status_written(&api, &b)).await.expect("status written");
    api.clear_faults();
    figure(
        section,
        "slow (2 s per request): prepare",
        format!("OK in {:.1} s, claim status {:.1} s later", took.as_secs_f64(), status.as_secs_f64()),
    );

    // Status writes alone fail.
    api.insert(claim_object(&c, &format!("gpu-{}-mig-7g80gb-0-0", m[1])));
    api.fault(Fault { method: None, path_contains: "/status".into(), kind: FaultKind::Status(500), times: None });
    let took = prepare_until_ok(&kubelet, &c, Duration::from_secs(30)).await.expect("prepare while status fails");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = status_written(&api, &c);
    api.clear_faults();
    let status = until("the claim status", Duration::from_secs(60), || status_written(&api, &c))
        .await
        .expect("status written later");
    figure(
        section,
        "status writes fail (500)",
        format!(
            "prepare OK in {:.1} s (status {}), status written {:.1} s after the fault ends",
            took.as_secs_f64(),
            if during { "written anyway" } else { "pending" },
            status.as_secs_f64()
        ),
    );

    let r = kubelet.unprepare(Version::V1, &[claim_ref(&a), claim_ref(&b), claim_ref(&c)]).await.unwrap();
    assert!(r.values().all(String::is_empty), "{r:?}");
    assert!(node.placements().is_empty());
    assert!(daemon.running());
}

// === kubelet ===

/// The kubelet restarts and wipes its registration directory: the daemon re-creates its socket,
/// the new kubelet registers, and claims prepared before are still prepared (idempotent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_wipes_registration_dir() {
    let node = NodeDir::new().simulate("h100-80gb:1");
    let m = node.minors()[0];
    let (a, b) = (uid(1), uid(2));
    node.write_claim(&a, &format!("gpu-{m}-mig-3g40gb-9-0"));
    node.write_claim(&b, &format!("gpu-{m}-mig-3g40gb-9-4"));
    let (mut daemon, kubelet) = node.serve().registered().await;
    let first = kubelet.prepare(Version::V1, &[claim_ref(&a)]).await.unwrap();
    assert!(first[&a].is_ok());
    drop(kubelet);

    std::fs::remove_dir_all(node.registry_dir()).unwrap();
    let back = until("the registration socket", Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&daemon.registration).is_ok()
    })
    .await
    .expect("registration socket re-created");
    let kubelet = daemon.register().await;
    let again = kubelet.prepare(Version::V1, &[claim_ref(&a), claim_ref(&b)]).await.unwrap();
    assert_eq!(again[&a], first[&a], "same devices after the restart");
    assert!(again[&b].is_ok(), "{again:?}");
    assert_eq!(node.placements().len(), 2);
    let r = kubelet.unprepare(Version::V1, &[claim_ref(&a), claim_ref(&b)]).await.unwrap();
    assert!(r.values().all(String::is_empty));
    assert!(node.placements().is_empty() && node.checkpoint().is_empty());
    assert!(daemon.running());
    figure(
        "outage: kubelet",
        "restart, registration dir wiped",
        format!("socket re-created in {} ms; re-registered; prepared claim kept, new one prepared", back.as_millis()),
    );
}

// === node reboot ===

/// The node reboots with two claims prepared: every instance is gone and the boot ID changes. The
/// new daemon sees the old checkpoint is from another boot; the kubelet prepares the claims again
/// and gets new instances at the same placements, with nothing stale left after unprepare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_reboot() {
    let node = NodeDir::new().simulate("h100-80gb:2");
    let m = node.minors();
    let (a, b) = (uid(1), uid(2));
    node.write_claim(&a, &format!("gpu-{}-mig-4g40gb-5-0", m[0]));
    node.write_claim(&b, &format!("gpu-{}-mig-1g10gb-19-3", m[1]));
    let (mut daemon, kubelet) = node.serve().registered().await;
    let r = kubelet.prepare(Version::V1, &[claim_ref(&a), claim_ref(&b)]).await.unwrap();
    assert!(r.values().all(Result::is_ok), "{r:?}");
    let before = node.placements();
    drop(kubelet);
    daemon.kill();

    let boot = node.boot_id();
    node.cli(&["sim", "reboot"]);
    assert_ne!(node.boot_id(), boot);
    assert!(node.placements().is_empty());

    let (mut daemon, kubelet) = node.serve().registered().await;
    let stale = node.checkpoint().len();
    let r = kubelet.prepare(Version::V1, &[claim_ref(&a), claim_ref(&b)]).await.unwrap();
    assert!(r.values().all(Result::is_ok), "{r:?}\n{}", daemon.log());
    let after = node.placements();
    assert_eq!(
        after.iter().map(|i| (i.0, i.1, i.2)).collect::<Vec<_>>(),
        before.iter().map(|i| (i.0, i.1, i.2)).collect::<Vec<_>>()
    );
    let r = kubelet.unprepare(Version::V1, &[claim_ref(&a), claim_ref(&b)]).await.unwrap();
    assert!(r.values().all(String::is_empty), "{r:?}");
    let leaked = node.placements().len();
    let stuck = node.checkpoint().len() + node.cdi_specs();
    assert!(daemon.running());
    figure(
        "outage: node reboot",
        "boot ID changed, 2 claims prepared before",
        format!("{stale} claims kept in the checkpoint after restart; re-prepared 2/2 at the same placements"),
    );
    figure("outage: node reboot", "leaked instances / stuck claims", format!("{leaked} / {stuck}"));
    assert_eq!((leaked, stuck), (0, 0));
}

// === state directory ===

/// A tmpfs mounted over a directory, unmounted when dropped.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0750"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Self(dir.to_path_buf()))
    }

    fn remount(&self, opt: &str) {
        let ok = Command::new("mount").args(["-o", &format!("remount,{opt}")]).arg(&self.0).status().unwrap();
        assert!(ok.success(), "remount {opt}");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fill the file system under `dir` until a write fails; the filler's path.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = vec![0u8; 4096];
    while f.write_all(&block).and_then(|()| f.sync_all()).is_ok() {}
    path
}

/// The state directory is a 512 KiB tmpfs (a real file system, so EROFS and ENOSPC come from the
/// kernel): remounted read-only, then filled up. Prepare fails with the reason and creates
/// nothing; once the directory is writable again the kubelet's retry succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_dir_read_only_or_full() {
    let section = "outage: state dir";
    let node = NodeDir::new().simulate("h100-80gb:1");
    let mount = match Mount::tmpfs(&node.state_dir(), "512k") {
        Ok(m) => m,
        Err(e) => {
            figure(section, "read-only / full", format!("not run: cannot mount a tmpfs ({e})"));
            crate::support::skip::skip(crate::support::skip::ROOT, &format!("cannot mount a tmpfs ({e})"));
            return;
        }
    };
    let m = node.minors()[0];
    let (a, b, c) = (uid(1), uid(2), uid(3));
    node.write_claim(&a, &format!("gpu-{m}-mig-3g40gb-9-0"));
    node.write_claim(&b, &format!("gpu-{m}-mig-2g20gb-14-4"));
    node.write_claim(&c, &format!("gpu-{m}-mig-1g10gb-19-6"));
    let (mut daemon, kubelet) = node.serve().registered().await;
    let r = kubelet.prepare(Version::V1, &[claim_ref(&a)]).await.unwrap();
    assert!(r[&a].is_ok(), "{r:?}");

    // Read-only.
    mount.remount("ro");
    let r = kubelet.prepare(Version::V1, &[claim_ref(&b)]).await.unwrap();
    let ro_err = prepare_error(&r, &b);
    let ro_unprepare = kubelet.unprepare(Version::V1, &[claim_ref(&a)]).await.unwrap()[&a].clone();
    assert!(daemon.running(), "{}", daemon.log());
    let ro_leaked = node.placements().iter().filter(|i| i.2 != 0).count();
    mount.remount("rw");
    let ro_retry = prepare_until_ok(&kubelet, &b, Duration::from_secs(10)).await.expect("prepare after remount rw");

    // Full.
    let filler = fill(&node.state_dir());
    let r = kubelet.prepare(Version::V1, &[claim_ref(&c)]).await.unwrap();
    let full_err = prepare_error(&r, &c);
    assert!(daemon.running(), "{}", daemon.log());
    let full_leaked = node.placements().iter().filter(|i| i.2 == 6).count();
    std::fs::remove_file(filler).unwrap();
    let full_retry =
        prepare_until_ok(&kubelet, &c, Duration::from_secs(10)).await.expect("prepare after freeing space");

    let r = kubelet.unprepare(Version::V1, &[claim_ref(&a), claim_ref(&b), claim_ref(&c)]).await.unwrap();
    assert!(r.values().all(String::is_empty), "{r:?}");
    let leaked = node.placements().len() + ro_leaked + full_leaked;
    let stuck = node.checkpoint().len() + node.cdi_specs();
    drop(daemon);
    drop(mount);

    figure(
        section,
        "read-only (tmpfs remounted ro)",
        format!(
            "prepare fails `{}`; unprepare {}; retry OK {} ms after remount rw",
            short(&ro_err, node.path()),
            if ro_unprepare.is_empty() {
                "OK".to_string()
            } else {
                format!("fails `{}`", short(&ro_unprepare, node.path()))
            },
            ro_retry.as_millis()
        ),
    );
    figure(
        section,
        "full (512 KiB tmpfs filled)",
        format!(
            "prepare fails `{}`; retry OK {} ms after freeing space",
            short(&full_err, node.path()),
            full_retry.as_millis()
        ),
    );
    figure(section, "leaked instances / stuck claims", format!("{leaked} / {stuck}"));
    assert_eq!((leaked, stuck), (0, 0));
}
