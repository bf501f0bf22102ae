//! `migdra probe`, the DaemonSet's startup, readiness and liveness check, against a real
//! `migdra serve`: healthy only while the daemon answers the kubelet's calls, not merely while its
//! socket files exist. A stopped (SIGSTOP) daemon and a killed one both leave their sockets
//! behind, and the probe must fail for both, within its timeout. `probe --ready`, the readiness
//! probe, also fails while the daemon does not publish its ResourceSlices (an API server that
//! refuses, does not answer, or errs), naming the server it tried.

#![allow(clippy::print_stdout)] // each case prints what the probe said and how long it took (--show-output)

use crate::support::command::Run;
use crate::support::daemon::Daemon;
use crate::support::eventually::eventually;
use crate::support::fake_apiserver::ApiServer;
use crate::support::node::NodeDir;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const POD_UID: &str = "6f1c2c8e-0b7e-4a57-9d0e-probe0000001";

/// `migdra probe` as the DaemonSet runs it: the pod's UID from the environment, the node's
/// directories, and a short timeout so the hung case fails fast.
fn probe(node: &NodeDir) -> Command {
    let mut cmd = node.probe(Some(POD_UID));
    cmd.args(["--timeout", "1s"]);
    cmd
}

/// Runs the probe; its output, and how long it took.
fn run(node: &NodeDir) -> (Output, Duration) {
    let started = Instant::now();
    let out = probe(node).run();
    (out, started.elapsed())
}

/// `migdra probe --ready`, the readiness probe.
fn ready(node: &NodeDir) -> Output {
    let mut cmd = probe(node);
    cmd.arg("--ready");
    cmd.run()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Fails with a one-line message containing `expect`, within the 1 s timeout plus start-up slack.
fn assert_fails(node: &NodeDir, case: &str, expect: &str) {
    let (out, took) = run(node);
    let err = stderr(&out);
    println!("{case}: exit {:?} in {} ms: {}", out.status.code(), took.as_millis(), err.trim());
    assert_eq!(out.status.code(), Some(1), "{case}: {err}");
    assert!(err.contains(expect), "{case}: {err:?} does not say {expect:?}");
    assert_eq!(err.trim().lines().count(), 1, "{case}: not one line: {err:?}");
    assert!(took < Duration::from_secs(6), "{case}: took {took:?}");
}

fn assert_healthy(node: &NodeDir, case: &str) {
    let (out, took) = run(node);
    println!("{case}: exit {:?} in {} ms: {}", out.status.code(), took.as_millis(), stderr(&out).trim());
    assert!(out.status.success(), "{case}: {}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("ok: ") && stdout.contains(POD_UID), "{case}: {stdout:?}");
}

async fn started(node: &NodeDir) -> Daemon {
    node.serve().pod_uid(POD_UID).ready().await
}

#[tokio::test]
async fn healthy_only_while_registered_and_answering() {
    let node = NodeDir::new().simulate("h100-80gb:1");
    assert_fails(&node, "before serve", "No such file or directory");

    let daemon = started(&node).await;
    assert_fails(&node, "serving, not registered by the kubelet", "has not registered migdra");
    let _kubelet = daemon.register().await;
    assert_healthy(&node, "live and registered");
    // --claims-dir: no API server, nothing to publish, so ready as soon as healthy.
    let out = ready(&node);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no API server"), "{out:?}");

    // The probe prepared nothing and changed nothing on the node.
    assert!(node.instances().is_empty());
    assert_eq!(node.cdi_specs(), 0);
    assert!(node.checkpoint().is_empty(), "{:?}", node.checkpoint());
}

#[tokio::test]
async fn a_hung_daemon_fails_within_the_timeout_and_recovers_when_continued() {
    let node = NodeDir::new().simulate("h100-80gb:1");
    let daemon = started(&node).await;
    let _kubelet = daemon.register().await;
    assert_healthy(&node, "before SIGSTOP");

    daemon.signal("STOP");
    assert!(daemon.registration.exists() && daemon.dra.exists(), "both sockets stay while it is stopped");
    assert_fails(&node, "stopped (SIGSTOP)", "no answer within 1s");
    daemon.signal("CONT");
    assert_healthy(&node, "continued (SIGCONT)");
}

#[tokio::test]
async fn a_dead_daemon_fails_although_its_sockets_remain() {
    let node = NodeDir::new().simulate("h100-80gb:1");
    let mut daemon = started(&node).await;
    let _kubelet = daemon.register().await;
    assert_healthy(&node, "before SIGKILL");

    daemon.kill();
    assert!(daemon.registration.exists() && daemon.dra.exists(), "a killed daemon leaves its sockets");
    assert_fails(&node, "killed (SIGKILL)", "Connection refused");
}

#[test]
fn bad_timeout_is_one_line_naming_it() {
    let node = NodeDir::new().simulate("h100-80gb:1");
    let out = node.command(&["probe", "--timeout", "soon"]).run();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("'soon'") && err.contains("expected a whole number and a unit"), "{err}");
}

/// A kubeconfig in `dir` for the API server at `url`, without auth.
fn kubeconfig(dir: &Path, url: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n\
         current-context: c\nusers:\n- name: u\n  user: {{}}\n"
    );
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

/// A node whose daemon reads claims from (and publishes to) the API server at `url`.
fn node_with_api_server(url: &str) -> NodeDir {
    let node = NodeDir::new().simulate("h100-80gb:1");
    let kc = kubeconfig(node.path(), url);
    node.kubeconfig(kc)
}

/// `probe --ready` fails, in one line containing every one of `expect`, once the publisher's
/// round has ended as the case makes it. Returns the line.
async fn not_ready(node: &NodeDir, daemon: &Daemon, case: &str, expect: &[&str]) -> String {
    let line = eventually(format!("{case}: probe --ready to fail saying {expect:?}"))
        .within(Duration::from_secs(20))
        .every(Duration::from_millis(100))
        .explain(|| daemon.log_tail())
        .until(|| {
            let out = ready(node);
            let err = stderr(&out);
            match out.status.success() {
                true => Err(format!("ready: {}", String::from_utf8_lossy(&out.stdout))),
                false if expect.iter().all(|e| err.contains(e)) => Ok(err),
                false => Err(err),
            }
        })
        .await;
    println!("{case}: {}", line.trim());
    assert_eq!(line.trim().lines().count(), 1, "{case}: not one line: {line:?}");
    line
}

/// An API server that refuses connections: the pod is live (the kubelet's calls work) but not
/// ready, and the line names the address tried and why it failed, where the log once said only
/// `client error (Connect)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_while_the_api_server_refuses_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let node = node_with_api_server(&url);
    let daemon = started(&node).await;
    let _kubelet = daemon.register().await;
    let line = not_ready(&node, &daemon, "API server refuses", &["not publishing ResourceSlices"]).await;
    assert!(line.contains(&format!("publishing ResourceSlices to {url} failed: ")), "{line}");
    assert!(line.contains("Connection refused"), "{line}");
    // Liveness and startup do not depend on the API server.
    assert_healthy(&node, "API server refuses, plain probe");
    let log = daemon.log();
    assert!(log.contains(&format!("publishing ResourceSlices to {url} failed")), "{log}");
}

/// An API server that accepts connections and never answers: not ready, "not published yet".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_before_the_first_publication() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let node = node_with_api_server(&format!("http://{}", silent.local_addr().unwrap()));
    let daemon = started(&node).await;
    let _kubelet = daemon.register().await;
    not_ready(&node, &daemon, "API server silent", &["ResourceSlices not published yet (since "]).await;
    assert_healthy(&node, "API server silent, plain probe");
}

/// Ready once publishing works, not ready while it fails, ready again when it recovers; and a
/// restarted daemon of the same pod is not ready on its predecessor's success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_publication_and_a_restart_starts_unready() {
    let api = ApiServer::start().await;
    api.insert(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": crate::support::NODE}}));
    let node = node_with_api_server(&api.url());
    let mut daemon = started(&node).await;
    let _kubelet = daemon.register().await;
    let is_ready = || {
        let out = ready(&node);
        if out.status.success() { Ok(String::from_utf8_lossy(&out.stdout).into_owned()) } else { Err(stderr(&out)) }
    };
    let ok = eventually("probe --ready to pass").explain(|| daemon.log_tail()).until(is_ready).await;
    println!("publishing: {}", ok.trim());
    assert!(ok.starts_with("ok: ") && ok.contains("ResourceSlices published"), "{ok}");

    // An outage: every request answers 500; the next round (a watch ends) fails.
    api.set_down(true);
    not_ready(&node, &daemon, "API server down", &["not publishing ResourceSlices", &api.url(), "HTTP 500"]).await;
    api.set_down(false);
    eventually("probe --ready to pass after the outage").explain(|| daemon.log_tail()).until(is_ready).await;

    // A new container of the same pod, whose API server never answers, so its publisher writes
    // nothing: it must not be ready on its predecessor's publication.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    kubeconfig(node.path(), &format!("http://{}", silent.local_addr().unwrap()));
    daemon.kill();
    let daemon = started(&node).await;
    let _kubelet = daemon.register().await;
    let out = ready(&node);
    let err = stderr(&out);
    println!("restarted: {}", err.trim());
    assert!(!out.status.success(), "ready on its predecessor's publication: {}", String::from_utf8_lossy(&out.stdout));
    assert!(err.contains("ResourceSlices not published yet"), "{err}");
}
