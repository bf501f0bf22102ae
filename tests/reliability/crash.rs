//! Crash points: `migdra serve` is SIGKILLed at every step of prepare and unprepare (after each
//! checkpoint write and each NVML mutation, through the `MIGDRA_CRASH_AT` hook), restarted, and
//! the kubelet retries until the claim converges.

use crate::common::figure;
use crate::support::claim::{claim_ref, uid};
use crate::support::daemon::Daemon;
use crate::support::node::NodeDir;
use migdra::kubelet::client::{TestKubelet, Version};
use migdra::prepare::Step;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

/// (sim spec, device suffix after `gpu-<minor>-`, expected (profile ID, start), or `None` for a
/// whole GPU).
type Profile = (&'static str, &'static str, Option<(u64, u64)>);

const PROFILES: [Profile; 5] = [
    ("h100-80gb:1", "mig-1g10gb-19-6", Some((19, 6))),
    ("h100-80gb:1", "mig-3g40gb-9-4", Some((9, 4))),
    ("h100-80gb:1", "mig-7g80gb-0-0", Some((0, 0))),
    ("a30-24gb:1", "mig-1g6gb-14-3", Some((14, 3))),
    ("a100-40gb:1:mig-off", "", None),
];

/// What one kill left behind once the kubelet's retries converged.
#[derive(Default)]
struct Tally {
    tried: usize,
    killed: usize,
    not_reached: usize,
    leaked: usize,
    double: usize,
    stuck: usize,
    retries: usize,
}

fn is_prepare(step: Step) -> bool {
    Step::ALL.iter().position(|s| *s == step).unwrap()
        < Step::ALL.iter().position(|s| *s == Step::UnprepareStarted).unwrap()
}

/// Prepare until the daemon answers with devices; how many calls it took.
async fn prepare_until_ok(kubelet: &TestKubelet, c: &str, daemon: &Daemon) -> usize {
    for n in 1..=20 {
        if let Ok(r) = kubelet.prepare(Version::V1, &[claim_ref(c)]).await
            && r.get(c).is_some_and(Result::is_ok)
        {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("claim {c} never prepared:\n{}", daemon.log());
}

async fn unprepare_until_ok(kubelet: &TestKubelet, c: &str, daemon: &Daemon) -> usize {
    for n in 1..=20 {
        if let Ok(r) = kubelet.unprepare(Version::V1, &[claim_ref(c)]).await
            && r.get(c).is_some_and(String::is_empty)
        {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("claim {c} never unprepared:\n{}", daemon.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_every_step_converges() {
    let mut t = Tally::default();
    for (spec, suffix, expect) in PROFILES {
        for step in Step::ALL {
            t.tried += 1;
            let node = NodeDir::new().simulate(spec);
            let minor = node.minors()[0];
            let device = if suffix.is_empty() { format!("gpu-{minor}") } else { format!("gpu-{minor}-{suffix}") };
            let c = uid(1);
            node.write_claim(&c, &device);

            let (mut doomed, kubelet) = node.serve().env("MIGDRA_CRASH_AT", step.name()).registered().await;
            let answer = if is_prepare(step) {
                kubelet.prepare(Version::V1, &[claim_ref(&c)]).await.map(|r| r[&c].is_ok())
            } else {
                let r = kubelet.prepare(Version::V1, &[claim_ref(&c)]).await.unwrap();
                assert!(r[&c].is_ok(), "{r:?}");
                kubelet.unprepare(Version::V1, &[claim_ref(&c)]).await.map(|r| r[&c].is_empty())
            };
            match doomed.wait_exit(Duration::from_secs(5)).await {
                Some(status) => {
                    assert_eq!(status.signal(), Some(9), "{spec} {step:?}: not SIGKILLed: {status:?}");
                    assert!(answer.is_err(), "{spec} {step:?}: a killed daemon answered");
                    t.killed += 1;
                }
                None => {
                    // A whole GPU has no GPU or compute instance steps.
                    assert!(expect.is_none(), "{spec} {step:?}: the step was never reached\n{}", doomed.log());
                    t.not_reached += 1;
                }
            }
            drop(doomed);

            let (daemon, kubelet) = node.serve().registered().await;
            if is_prepare(step) {
                t.retries += prepare_until_ok(&kubelet, &c, &daemon).await;
                let held = node.placements();
                let want: Vec<_> = expect.map(|(p, s)| (minor, p, s, 1)).into_iter().collect();
                if held != want {
                    t.double += held.len().saturating_sub(1);
                    t.leaked += held.iter().filter(|i| !want.contains(i)).count();
                }
            }
            t.retries += unprepare_until_ok(&kubelet, &c, &daemon).await;
            t.leaked += node.placements().len();
            t.stuck += node.checkpoint().len() + node.cdi_specs() + node.metadata_files().len();
        }
    }
    let steps = Step::ALL.len();
    let section = "crash points";
    figure(section, "steps × profiles tried", format!("{steps} × {} = {}", PROFILES.len(), t.tried));
    figure(section, "daemons SIGKILLed at the step", t.killed);
    figure(section, "points a whole GPU never reaches (no GI/CI)", t.not_reached);
    figure(section, "kubelet calls until converged", t.retries);
    figure(section, "leaked instances", t.leaked);
    figure(section, "double allocations", t.double);
    figure(section, "stuck claims (checkpoint, CDI spec or metadata left)", t.stuck);
    assert_eq!((t.leaked, t.double, t.stuck), (0, 0, 0));
}
