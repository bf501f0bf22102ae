//! `migdra probe`, the DaemonSet's startup, readiness and liveness check, against a real
//! `migdra serve`: healthy only while the daemon answers the kubelet's calls, not merely while its
//! socket files exist. A stopped (SIGSTOP) daemon and a killed one both leave their sockets
//! behind, and the probe must fail for both, within its timeout.

#![allow(clippy::print_stdout)] // each case prints what the probe said and how long it took (--show-output)

mod support;

use std::process::{Command, Output};
use std::time::{Duration, Instant};
use support::command::Run;
use support::daemon::Daemon;
use support::node::NodeDir;

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
