//! Storm: thousands of prepare and unprepare calls from many concurrent kubelet connections over
//! the real sockets, on 8 simulated GPUs with random NVML latency and 5% injected NVML failures.
//! Claims compete for overlapping placements; calls repeat claims and arrive in any order. At the
//! end every claim is prepared at its own placement or cleanly failed, and the simulator holds
//! exactly the prepared instances.

use crate::common::{figure, h100_size};
use crate::support::claim::{claim_ref, uid};
use crate::support::node::NodeDir;
use migdra::claims::ClaimRef;
use migdra::kubelet::client::{TestKubelet, Version};
use migdra::mig::naming::DeviceName;
use migdra::packing::allocator::Rng;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const CLIENTS: usize = 16;
const CALLS_PER_CLIENT: usize = 125;
/// 5% failures on every NVML mutation, and random latency: each delay applies on its own.
const FAULTS: &str = "create-gi=timeout@0.05,create-ci=timeout@0.05,destroy-ci=timeout@0.05,\
                      destroy-gi=timeout@0.05,create-gi=delay:4ms@0.5,create-gi=delay:8ms@0.25,\
                      create-ci=delay:2ms@0.5,destroy-ci=delay:2ms@0.5,destroy-gi=delay:4ms@0.5";

#[derive(Default)]
struct Counts {
    calls: AtomicUsize,
    claim_ops: AtomicUsize,
    ok: AtomicUsize,
    failed: AtomicUsize,
    /// Failed claim results that name an injected NVML timeout.
    injected: AtomicUsize,
    call_errors: AtomicUsize,
}

impl Counts {
    /// One claim's result: `None` when it succeeded, else its error.
    fn result(&self, error: Option<&str>) {
        match error {
            None => _ = self.ok.fetch_add(1, Ordering::Relaxed),
            Some(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if e.contains("timeout") {
                    self.injected.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_on_eight_gpus_with_faults() {
    let node = NodeDir::new().simulate("h100-80gb:8");
    let minors = node.minors();
    // Per GPU: seven 1g, two 3g and one 7g claim, overlapping on purpose.
    let mut claims: Vec<(String, String)> = Vec::new();
    for &m in &minors {
        let mut devices: Vec<String> = (0..7).map(|s| format!("gpu-{m}-mig-1g10gb-19-{s}")).collect();
        devices.extend([0, 4].map(|s| format!("gpu-{m}-mig-3g40gb-9-{s}")));
        devices.push(format!("gpu-{m}-mig-7g80gb-0-0"));
        for d in devices {
            let u = uid(claims.len() as u32 + 1);
            node.write_claim(&u, &d);
            claims.push((u, d));
        }
    }
    let claims = Arc::new(claims);

    let (daemon, kubelet) = node.serve().env("MIGDRA_SIM_FAULTS", FAULTS).registered().await;
    let counts = Arc::new(Counts::default());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        // Each client has its own connection, as after a kubelet restart.
        let k = TestKubelet::unregistered(&daemon.dra).await.unwrap();
        let (claims, counts) = (claims.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(client as u64 + 1);
            for _ in 0..CALLS_PER_CLIENT {
                // 1 to 4 claims; the same claim may come twice in one call.
                let n = 1 + rng.below(4);
                let batch: Vec<ClaimRef> = (0..n).map(|_| claim_ref(&claims[rng.below(claims.len())].0)).collect();
                let version = if rng.below(2) == 0 { Version::V1 } else { Version::V1beta1 };
                counts.calls.fetch_add(1, Ordering::Relaxed);
                counts.claim_ops.fetch_add(n, Ordering::Relaxed);
                if rng.below(10) < 6 {
                    match k.prepare(version, &batch).await {
                        Ok(r) => r.values().for_each(|v| counts.result(v.as_ref().err().map(String::as_str))),
                        Err(_) => _ = counts.call_errors.fetch_add(1, Ordering::Relaxed),
                    }
                } else {
                    match k.unprepare(version, &batch).await {
                        Ok(r) => r.values().for_each(|e| counts.result((!e.is_empty()).then_some(e.as_str()))),
                        Err(_) => _ = counts.call_errors.fetch_add(1, Ordering::Relaxed),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let storm_took = started.elapsed();
    drop(kubelet);
    drop(daemon);

    // The kubelet's last word on each claim, from a daemon without faults (restarted over the
    // storm's leftovers): prepare each claim once, in a shuffled order.
    let (daemon, kubelet) = node.serve().registered().await;
    let mut order: Vec<usize> = (0..claims.len()).collect();
    Rng::new(42).shuffle(&mut order);
    let mut prepared: BTreeMap<String, String> = BTreeMap::new();
    let mut cleanly_failed = 0;
    let mut unclean = 0;
    for i in order {
        let (u, d) = &claims[i];
        let r = kubelet.prepare(Version::V1, &[claim_ref(u)]).await.unwrap();
        match &r[u] {
            Ok(devices) => {
                assert_eq!(devices.len(), 1);
                assert_eq!(&devices[0].device, d, "claim {u} got another device");
                prepared.insert(u.clone(), d.clone());
            }
            Err(e) => {
                cleanly_failed += 1;
                // Cleanly: nothing of it in the checkpoint, no CDI spec.
                let leftover = node.checkpoint().iter().any(|c| c.to_string().contains(u.as_str()));
                let spec = node
                    .cdi_dir()
                    .read_dir()
                    .is_ok_and(|mut d| d.any(|f| f.unwrap().file_name().to_string_lossy().contains(u.as_str())));
                let metadata = node.metadata_files().iter().any(|f| f.to_string_lossy().contains(u.as_str()));
                if leftover || spec || metadata {
                    unclean += 1;
                    eprintln!("claim {u} failed ({e}) but left checkpoint={leftover} cdi={spec} metadata={metadata}");
                }
            }
        }
    }

    // The simulator holds exactly the prepared instances, and no two overlap.
    let held = node.placements();
    let mut want: Vec<_> = prepared
        .values()
        .map(|d| match DeviceName::parse(d).unwrap() {
            DeviceName::Mig { parent_minor, profile_id, start, .. } => {
                (u64::from(parent_minor), u64::from(profile_id), u64::from(start), 1)
            }
            other => panic!("{other:?}"),
        })
        .collect();
    want.sort_unstable();
    let leaked = held.iter().filter(|i| !want.contains(i)).count();
    let missing = want.iter().filter(|i| !held.contains(i)).count();
    if leaked + missing > 0 {
        let odd: Vec<_> = held.iter().filter(|i| !want.contains(i)).collect();
        let lost: Vec<_> = want.iter().filter(|i| !held.contains(i)).collect();
        eprintln!("held but not prepared: {odd:?}\nprepared but not held: {lost:?}");
        for (minor, ..) in odd.iter().copied().chain(lost.iter().copied()) {
            let prefix = format!("\"gpu-{minor}-");
            for c in node.checkpoint() {
                if c.to_string().contains(&prefix) {
                    eprintln!("checkpoint: {c}");
                }
            }
        }
        let log = std::fs::read_to_string(node.log_of(1)).unwrap_or_default();
        let keep = node.path().join("..").join("storm-daemon-1.log");
        let _ = std::fs::write(&keep, &log);
        eprintln!("storm daemon log kept at {}", keep.display());
    }
    let mut double = 0;
    for (i, a) in want.iter().enumerate() {
        for b in &want[i + 1..] {
            let overlap = a.0 == b.0 && a.2 < b.2 + h100_size(b.1) && b.2 < a.2 + h100_size(a.1);
            double += usize::from(overlap);
        }
    }

    // Then everything goes: nothing may stay behind.
    let uids: Vec<ClaimRef> = claims.iter().map(|(u, _)| claim_ref(u)).collect();
    let r = kubelet.unprepare(Version::V1, &uids).await.unwrap();
    let stuck = r.values().filter(|e| !e.is_empty()).count()
        + node.checkpoint().len()
        + node.cdi_specs()
        + node.metadata_files().len();
    let leaked_after = node.placements().len();
    drop(daemon);

    let section = "storm";
    let calls = counts.calls.load(Ordering::Relaxed);
    figure(section, "GPUs / claims / concurrent clients", format!("8 / {} / {CLIENTS}", claims.len()));
    figure(
        section,
        "calls (claim operations) in",
        format!("{calls} ({}) in {:.1} s", counts.claim_ops.load(Ordering::Relaxed), storm_took.as_secs_f64()),
    );
    figure(
        section,
        "claim results ok / failed / whole-call errors",
        format!(
            "{} / {} / {}",
            counts.ok.load(Ordering::Relaxed),
            counts.failed.load(Ordering::Relaxed),
            counts.call_errors.load(Ordering::Relaxed)
        ),
    );
    let injected = counts.injected.load(Ordering::Relaxed);
    figure(
        section,
        "NVML faults",
        format!("5% of each GI/CI create and destroy, random latency: {injected} claim results failed on one"),
    );
    figure(
        section,
        "claims prepared at a distinct placement / cleanly failed",
        format!("{} / {cleanly_failed}", prepared.len()),
    );
    figure(section, "failed claims that left state behind", unclean);
    figure(section, "leaked instances", leaked + leaked_after);
    figure(section, "prepared claims without their instance", missing);
    figure(section, "double allocations", double);
    figure(section, "stuck claims", stuck);
    assert_eq!((leaked + leaked_after, missing, double, stuck, unclean), (0, 0, 0, 0, 0));
    assert_eq!(counts.call_errors.load(Ordering::Relaxed), 0, "no whole call should fail");
    // The storm did what it says: injected faults failed claims, others succeeded, and at the
    // end every GPU holds a prepared claim.
    assert!(injected > 0 && counts.ok.load(Ordering::Relaxed) > 0, "no injected fault or no success");
    let gpus_used: std::collections::BTreeSet<_> = want.iter().map(|p| p.0).collect();
    assert_eq!(gpus_used.len(), minors.len(), "every GPU holds a prepared claim: {want:?}");
}
