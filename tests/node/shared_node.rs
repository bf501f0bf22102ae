//! Slurm and Kubernetes share one MIG node through slurm-bridge: a seeded mix of
//! bridge pods of several MIG profiles and native Slurm jobs (shards, whole GPUs) arriving and
//! leaving, with the bridge's scheduler, its controllers, migdra and slurmctld each restarted once.
//! At every quiet point the two schedulers' books are compared:
//!
//! - each running bridge pod's MIG device is on the GPU its job holds in Slurm;
//! - Slurm's shards in use on each GPU are the native shard jobs' plus the `slurmShards` of
//!   migdra's prepared devices there;
//! - no GPU is held by a native whole-GPU job and a pod's MIG device at once;
//!
//! and at the end nothing is left. The same run with the unchanged bridge is the negative control.
//! `MIGDRA_SHARED_STEPS` (default 8) and `MIGDRA_SHARED_SEED` (default 1) set the run.

use super::*;
use migdra::packing::allocator::Rng;

/// The profiles the bridge pods ask, with the shards each stands for on an H100 (8 per GPU).
const PROFILES: [(&str, u64); 3] = [("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)];
/// Native jobs: shards, or a whole GPU.
const NATIVE: [&str; 3] = ["shard:1", "shard:2", "gpu:1"];

/// What one run counted.
#[derive(Debug, Default)]
pub(super) struct Report {
    pub pods: usize,
    pub jobs: usize,
    pub checks: usize,
    pub disagreements: Vec<String>,
    /// Creation to Running and Ready of each bridge pod that ran (sampled every 100 ms).
    pub to_running: Vec<Duration>,
    pub restarts: Vec<&'static str>,
    /// Creation to Running and Ready of one `nvidia.com/mig-1g.10gb` pod at a time on the idle
    /// node, through the bridge and through kube-scheduler (the same pod in an unmanaged namespace).
    pub via_bridge: Vec<Duration>,
    pub via_kube_scheduler: Vec<Duration>,
}

/// A namespace the bridge does not manage: kube-scheduler places its pods.
const DIRECT: &str = "direct";

struct Pod {
    name: String,
    created: Instant,
    running: bool,
}

/// `MIGDRA_SHARED_*` from the environment.
pub(super) fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")))
}

/// Per-GPU counts in a Slurm GRES text's shard entry: `shard:h100:3(1/8,2/8)` → [1, 2],
/// `(-/8,4/8)` → [0, 4]; none → [].
fn shard_counts(text: &str, key: &str) -> Vec<u64> {
    let Some(value) = text.split_whitespace().find_map(|w| w.strip_prefix(key)) else { return vec![] };
    let Some(at) = value.find("shard") else { return vec![] };
    let rest = &value[at..];
    let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else { return vec![] };
    // `-/8`: the GPU is allocated whole, none of its shards are.
    rest[open + 1..close].split(',').map(|c| c.split('/').next().and_then(|u| u.parse().ok()).unwrap_or(0)).collect()
}

/// The run: `None` when the bridge or Slurm cannot run here.
/// The negative control (`until_disagreement`) stops at the first step that shows one.
pub(super) async fn run(
    steps: &Steps,
    variant: Variant,
    n: usize,
    seed: u64,
    until_disagreement: bool,
) -> Option<Report> {
    let mut h = hybrid(steps, variant, "h100-80gb:2", None, &[]).await?;
    let mut rng = Rng::new(seed);
    let mut report = Report::default();
    let mut pods: Vec<Pod> = Vec::new();
    let mut natives: Vec<(String, &str)> = Vec::new();
    // Jobs of deleted pods, until the bridge has ended them.
    let mut ending: Vec<String> = Vec::new();
    let restarts = [n / 5, 2 * n / 5, 3 * n / 5, 4 * n / 5];
    // How long a step may take to settle: the negative control stops at its first disagreement.
    let within = Duration::from_secs(if until_disagreement { 30 } else { 90 });
    for step in 0..n {
        let action = rng.below(4);
        if (action == 0 && pods.len() < 3) || (action == 1 && pods.is_empty()) {
            let (profile, _) = PROFILES[rng.below(PROFILES.len())];
            let name = format!("p{step}-{}", profile.replace('.', ""));
            h.cluster.ops.apply(MANAGED, &bridged_pod(&name, &format!("{{nvidia.com/mig-{profile}: 1}}"), &[]));
            pods.push(Pod { name, created: Instant::now(), running: false });
            report.pods += 1;
        } else if action <= 1 {
            let pod = pods.remove(rng.below(pods.len()));
            ending.extend(delete(&h, &pod.name));
        } else if (action == 2 && natives.len() < 2) || natives.is_empty() {
            let gres = NATIVE[rng.below(NATIVE.len())];
            natives.push((h.slurm.submit(&format!("native-{step}"), gres), gres));
            report.jobs += 1;
        } else {
            let (id, _) = natives.remove(rng.below(natives.len()));
            h.slurm.cancel(&id);
        }
        if let Some(i) = restarts.iter().position(|&s| s == step) {
            let what = ["the bridge's scheduler", "the bridge's controllers", "migdra", "slurmctld"][i];
            match i {
                0 => h.bridge.restart_scheduler(Profile::Chart),
                1 => h.bridge.restart_controllers(),
                2 => assert!(kill_migdra(&h.cluster.node), "no migdra container to kill"),
                _ => h.slurm.restart_slurmctld(),
            }
            report.restarts.push(what);
        }
        settle(&h, &mut pods, &mut ending, &mut report, within).await;
        check(&h, &natives, &mut report, &format!("step {step}"));
        if until_disagreement && !report.disagreements.is_empty() {
            steps.say(&format!("{variant:?}: {report:?}"));
            return Some(report);
        }
    }
    // The end: everything leaves, and nothing is held on either side.
    for pod in pods.drain(..) {
        ending.extend(delete(&h, &pod.name));
    }
    for (id, _) in natives.drain(..) {
        h.slurm.cancel(&id);
    }
    settle(&h, &mut pods, &mut ending, &mut report, within).await;
    let left = prepared(&h.cluster.node);
    report.checks += 1;
    if left != (vec![], vec![], vec![]) {
        report.disagreements.push(format!("end: migdra still holds {left:?}"));
    }
    let used = shard_counts(&h.slurm.scontrol(&["show", "node", "-d", &slurm::host()]), "GresUsed=");
    report.checks += 1;
    if used.iter().any(|&u| u > 0) {
        report.disagreements.push(format!("end: Slurm still counts shards in use {used:?}"));
    }
    if !until_disagreement {
        time_one_pod_each(&h, &mut report).await;
    }
    steps.say(&format!("{variant:?}: {report:?}"));
    Some(report)
}

/// The same `nvidia.com/mig-1g.10gb` pod, creation to Running and Ready, through the bridge and
/// through kube-scheduler (a namespace the bridge does not manage), one at a time, alternating.
async fn time_one_pod_each(h: &Hybrid, report: &mut Report) {
    let limits = "{nvidia.com/mig-1g.10gb: 1}";
    h.cluster.ops.kubectl(&["create", "namespace", DIRECT]);
    for i in 0..3 {
        let name = format!("timed-bridge-{i}");
        let t = Instant::now();
        h.cluster.ops.apply(MANAGED, &bridged_pod(&name, limits, &[]));
        report.via_bridge.push(h.cluster.ops.wait_running(MANAGED, &name).await.max(t.elapsed()));
        let job = h.job_of(&name).await;
        h.end(&name, &job).await;
        let name = format!("timed-direct-{i}");
        // The bridge's controllers taint the node; kube-scheduler's pods tolerate it.
        let toleration =
            format!("spec:\n  tolerations:\n  - key: {}\n    operator: Exists\n", bridge::MANAGED_NODE_TAINT);
        let pod = bridged_pod(&name, limits, &[]).replace("spec:\n", &toleration);
        let t = Instant::now();
        h.cluster.ops.apply(DIRECT, &pod);
        report.via_kube_scheduler.push(h.cluster.ops.wait_running(DIRECT, &name).await.max(t.elapsed()));
        h.cluster.ops.kubectl(&["delete", "pod", "-n", DIRECT, &name, "--wait=true", "--timeout=120s"]);
    }
}

/// Wait (up to `within`) until every live bridge pod runs or waits for its job, and every deleted
/// one is gone with its job; record first-Running times.
async fn settle(h: &Hybrid, pods: &mut [Pod], ending: &mut Vec<String>, report: &mut Report, within: Duration) {
    let start = Instant::now();
    // A job may sit pending for a moment before slurmctld starts it: a step with waiting jobs is
    // quiet only once it has stayed so for 3 s.
    let mut quiet_since: Option<Instant> = None;
    loop {
        let list = h.cluster.ops.json(&["get", "pods", "-n", MANAGED]);
        let items = list["items"].as_array().cloned().unwrap_or_default();
        // Claims whose device migdra reports prepared: a pod runs before that status is written.
        let claims = h.cluster.ops.json(&["get", "resourceclaims", "-n", MANAGED]);
        let reported: Vec<&str> = claims["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"]["devices"].as_array().into_iter().flatten().any(|d| ready(&d["conditions"])))
            .filter_map(|c| c["metadata"]["name"].as_str())
            .collect();
        let mut quiet = true;
        let mut waiting = false;
        for item in &items {
            let name = item["metadata"]["name"].as_str().unwrap_or_default();
            let job = item["metadata"]["labels"][bridge::JOB_LABEL].as_str().unwrap_or_default();
            let running = item["status"]["phase"] == "Running" && ready(&item["status"]["conditions"]);
            let claim = item["status"]["extendedResourceClaimStatus"]["resourceClaimName"].as_str();
            let deleting = item["metadata"]["deletionTimestamp"].is_string();
            // Pending for a reason (resources, priority): a job just submitted is pending too, with
            // Reason=None, until slurmctld's next pass starts it.
            let waits = !job.is_empty() && {
                let detail = h.slurm.scontrol(&["show", "job", job]);
                slurm::field(&detail, "JobState") == "PENDING"
                    && !matches!(slurm::field(&detail, "Reason"), "None" | "")
            };
            if let Some(p) = pods.iter_mut().find(|p| p.name == name && running && !p.running) {
                p.running = true;
                report.to_running.push(p.created.elapsed());
            }
            quiet &= !deleting && ((running && claim.is_none_or(|c| reported.contains(&c))) || waits);
            waiting |= waits;
        }
        ending.retain(|job| matches!(h.slurm.job_state(job).as_str(), "RUNNING" | "PENDING" | "COMPLETING"));
        quiet &= ending.is_empty();
        quiet_since = if quiet { quiet_since.or(Some(Instant::now())) } else { None };
        let settled = quiet_since.is_some_and(|t| !waiting || t.elapsed() >= Duration::from_secs(3));
        if settled || start.elapsed() > within {
            if !settled {
                report
                    .disagreements
                    .push(format!("not quiet after {within:?}: {} pods, jobs of deleted pods {ending:?}", items.len()));
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a list of conditions holds `Ready=True` (a pod's, or a claim device's).
fn ready(conditions: &Value) -> bool {
    conditions.as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Delete a bridge pod without waiting; its Slurm job, if it has one.
fn delete(h: &Hybrid, pod: &str) -> Option<String> {
    let job = h.cluster.ops.kubectl(&[
        "get",
        "pod",
        "-n",
        MANAGED,
        pod,
        "-o",
        &format!("jsonpath={{.metadata.labels.{}}}", bridge::JOB_LABEL.replace('.', "\\.")),
    ]);
    h.cluster.ops.kubectl(&["delete", "pod", "-n", MANAGED, pod, "--wait=false"]);
    Some(job.trim().to_string()).filter(|j| !j.is_empty())
}

/// Compare the two schedulers' books once.
fn check(h: &Hybrid, natives: &[(String, &str)], report: &mut Report, at: &str) {
    let ops = &h.cluster.ops;
    // migdra's prepared devices, by the pod whose claim holds them: (GPU, shards).
    let claims = ops.json(&["get", "resourceclaims", "-n", MANAGED]);
    let mut devices: Vec<(String, u64, u64)> = Vec::new();
    for c in claims["items"].as_array().into_iter().flatten() {
        let owner = c["metadata"]["ownerReferences"][0]["name"].as_str().unwrap_or_default().to_string();
        for d in c["status"]["devices"].as_array().into_iter().flatten() {
            if d["driver"] == support::DRIVER && ready(&d["conditions"]) {
                let k = d["data"]["slurmGpuIndex"].as_u64().unwrap_or(u64::MAX);
                devices.push((owner.clone(), k, d["data"]["slurmShards"].as_u64().unwrap_or(0)));
            }
        }
    }
    // Each running bridge pod: its device on the GPU its job holds.
    let pods = ops.json(&["get", "pods", "-n", MANAGED]);
    for p in pods["items"].as_array().into_iter().flatten() {
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        let job = p["metadata"]["labels"][bridge::JOB_LABEL].as_str().unwrap_or_default();
        if p["status"]["phase"] != "Running" || job.is_empty() {
            continue;
        }
        report.checks += 1;
        let slurm_gpus = h.slurm.rest_index(job).unwrap_or_default();
        let mine: Vec<u64> = devices.iter().filter(|(o, _, _)| o == name).map(|(_, k, _)| *k).collect();
        if mine.len() != 1 || slurm_gpus.iter().map(|&g| u64::from(g)).collect::<Vec<_>>() != mine {
            report
                .disagreements
                .push(format!("{at}: pod {name} has MIG devices on GPUs {mine:?}, its job {job} holds {slurm_gpus:?}"));
        }
    }
    // Shards per GPU: Slurm's count against native jobs' plus migdra's devices'.
    let node = h.slurm.scontrol(&["show", "node", "-d", &slurm::host()]);
    let used = shard_counts(&node, "GresUsed=");
    let mut expected = vec![0; used.len()];
    for (id, _) in natives.iter().filter(|(_, g)| g.starts_with("shard")) {
        let detail = h.slurm.scontrol(&["show", "job", "-d", id]);
        if slurm::field(&detail, "JobState") == "RUNNING" {
            for (k, c) in shard_counts(&detail, "GRES=").into_iter().enumerate() {
                if let Some(e) = expected.get_mut(k) {
                    *e += c;
                }
            }
        }
    }
    for (_, k, shards) in &devices {
        if let Some(e) = usize::try_from(*k).ok().and_then(|k| expected.get_mut(k)) {
            *e += shards;
        }
    }
    report.checks += 1;
    if used != expected {
        let gres = node.split_whitespace().filter(|w| w.starts_with("Gres")).collect::<Vec<_>>().join(" ");
        let jobs = h.slurm.scontrol(&["show", "job", "-d"]);
        let jobs: Vec<&str> = jobs
            .split_whitespace()
            .filter(|w| {
                w.starts_with("JobId=")
                    || w.starts_with("JobState=")
                    || w.starts_with("GRES=")
                    || w.starts_with("JobName=")
            })
            .collect();
        let pods: Vec<String> = ops.json(&["get", "pods", "-n", MANAGED])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "{} {} job {} claim {} deleting {}",
                    p["metadata"]["name"],
                    p["status"]["phase"],
                    p["metadata"]["labels"][bridge::JOB_LABEL],
                    p["status"]["extendedResourceClaimStatus"]["resourceClaimName"],
                    p["metadata"]["deletionTimestamp"]
                )
            })
            .collect();
        let gres = format!("{gres}; jobs {jobs:?}; natives {natives:?}; pods {pods:?}");
        report.disagreements.push(format!(
            "{at}: Slurm's shards in use per GPU {used:?} ({gres}), native jobs' and migdra's \
             devices' {expected:?} ({devices:?})"
        ));
    }
    // A native whole-GPU job's GPU holds no pod's MIG device.
    for (id, _) in natives.iter().filter(|(_, g)| *g == "gpu:1") {
        if h.slurm.job_state(id) != "RUNNING" {
            continue;
        }
        report.checks += 1;
        let k = u64::from(h.slurm.job_index(id));
        if let Some((owner, _, _)) = devices.iter().find(|(_, g, _)| *g == k) {
            report
                .disagreements
                .push(format!("{at}: native job {id} holds GPU {k} whole and pod {owner} has a MIG device there"));
        }
    }
}
