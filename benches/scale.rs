//! What a MIG pod costs the real kube-scheduler at cluster scale, against a whole-GPU pod and
//! against NVIDIA's slice layout, measured in one run.
//!
//! For each control plane (one per Kubernetes version), node count and layout: a fresh control
//! plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager; no kubelets), N Node
//! objects, each publishing 8 H100-80GB as
//! - `migdra`: exactly what `migdra slices --sim h100-80gb:8` prints (dynamic MIG, split layout);
//! - `whole`: `migdra slices --sim h100-80gb:8:mig-off` (8 whole GPUs, no counters);
//! - `nvidia`: NVIDIA's DynamicMIG layout rebuilt from its documented rules
//!   (docs/facts/anchor-nvidia-dra.md §1): the whole GPU beside its partitions, 7 capacities and
//!   their counters plus the memory slices, every GPU's counter set in one slice;
//! - `migdra-wide`: migdra's devices with every resource counted (7 capacities and all 8 memory
//!   slices, as migdra published before its counter sets were made minimal);
//! - `migdra-allowlist`: `migdra slices … --profiles` with the pod mix's four profiles;
//! - `migdra-lean`: migdra without 8 attributes every partition of a GPU repeats;
//! - `migdra-classes`, `migdra-allowlist-classes`: the claims name the per-profile DeviceClass
//!   (`mig-1g.10gb`) instead of the `mig` class with a profile selector;
//! - `migdra-fitting`: `migdra-allowlist-classes`, each node re-publishing after each allocation
//!   only what can still be allocated beside what its claims hold (the bench plays every node's
//!   publisher, with migdra's own `keep_fitting`; it prints the slice writes per pod bound);
//! - `migdra-best-fit`: `migdra-fitting`, each publication also ranked by best fit (migdra's own
//!   `rank_best_fit`, as `--device-order best-fit` does);
//!
//! then a seeded pod mix whose claims come from templates (60 % 1g.10gb, 20 % 2g.20gb, 10 %
//! 3g.40gb, 10 % 7g.80gb; whole GPUs: one GPU each), all created at once. It prints pods/s,
//! scheduler CPU per pod (from /proc), p50/p99 time from creation to bound, slice bytes per node,
//! and each layout's CPU per pod as a ratio to the whole-GPU run. In migdra's default layout it
//! then times `kubectl migdra usage` and `why` against the full cluster (goal: under 1 s at 200
//! nodes).
//!
//! Run (by hand; not in CI):
//!   cargo bench --bench scale -- --controlplanes DIR[,DIR] [--nodes 50,100,200] [--pods 300]
//!       [--layouts migdra,migdra-wide,migdra-allowlist,migdra-lean,migdra-classes,
//!       migdra-allowlist-classes,migdra-fitting,migdra-best-fit,whole,nvidia] [--seed N] [--stall 30s]
//!       [--profile 20s]
//! DIR is a `hack/build-controlplane.sh` bin directory (it prints it), e.g.
//! ~/.cache/migdra/controlplane-v1.36.3-etcd-v3.6.8-<hash>/bin; default: MIGDRA_CONTROLPLANE_BIN.
//! `--profile 20s` takes a CPU profile of the scheduler for 20 s of each run from its secure port
//! and prints `go tool pprof -top` of it.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a bench prints its figures

#[path = "../tests/support/mod.rs"]
mod support;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DynamicObject, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use migdra::kube::allocations::held_devices;
use migdra::packing::allocator::Rng;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::DRIVER;
use support::cluster::{apply, create_node, repo};
use support::command::{Run, migdra};
use support::controlplane::ControlPlane;

const NV_DRIVER: &str = "gpu.nvidia.com";
/// The pod mix: (profile, weight in percent).
const MIX: [(&str, usize); 4] = [("1g.10gb", 60), ("2g.20gb", 20), ("3g.40gb", 10), ("7g.80gb", 10)];
const NAMESPACE: &str = "default";
/// Pods and slices created at once.
const IN_FLIGHT: usize = 16;
/// The scheduler's and claim controller's client limit (requests/s), far above what they use.
const CLIENT_QPS: u32 = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// What migdra publishes by default.
    Migdra,
    /// migdra's devices with every resource counted, as it published before its counter sets
    /// were made minimal.
    MigdraWide,
    /// migdra with `--profiles` set to the pod mix's profiles.
    MigdraAllowlist,
    /// migdra without the attributes every partition of a GPU repeats ([`LEAN_DROPS`]).
    MigdraLean,
    /// migdra, the claims naming the per-profile DeviceClass (`mig-1g.10gb`) instead of the `mig`
    /// class plus a profile selector: one CEL program per device instead of two.
    MigdraClasses,
    /// Both: `--profiles` and per-profile classes.
    MigdraAllowlistClasses,
    /// [`Layout::MigdraAllowlistClasses`], each node publishing only what can still be allocated:
    /// after each allocation its slices are built again and what its held devices block left
    /// out ([`migdra::kube::slices::keep_fitting`]), changed slices replaced in place.
    MigdraFitting,
    /// [`Layout::MigdraFitting`], each republication also ranked by best fit
    /// ([`migdra::kube::slices::rank_best_fit`], `--device-order best-fit`).
    MigdraBestFit,
    Whole,
    Nvidia,
}

const LAYOUTS: [(&str, Layout); 10] = [
    ("migdra", Layout::Migdra),
    ("migdra-wide", Layout::MigdraWide),
    ("migdra-allowlist", Layout::MigdraAllowlist),
    ("migdra-lean", Layout::MigdraLean),
    ("migdra-classes", Layout::MigdraClasses),
    ("migdra-allowlist-classes", Layout::MigdraAllowlistClasses),
    ("migdra-fitting", Layout::MigdraFitting),
    ("migdra-best-fit", Layout::MigdraBestFit),
    ("whole", Layout::Whole),
    ("nvidia", Layout::Nvidia),
];

impl Layout {
    fn parse(s: &str) -> Self {
        LAYOUTS.iter().find(|(n, _)| *n == s).map(|(_, l)| *l).unwrap_or_else(|| {
            let names: Vec<&str> = LAYOUTS.iter().map(|(n, _)| *n).collect();
            panic!("--layouts: {s:?} is not a layout; expected one of {}", names.join(", "))
        })
    }

    fn name(self) -> &'static str {
        LAYOUTS.iter().find(|(_, l)| *l == self).map(|(n, _)| *n).unwrap()
    }

    fn is_migdra_mig(self) -> bool {
        !matches!(self, Self::Whole | Self::Nvidia)
    }

    fn allowlist(self) -> bool {
        matches!(self, Self::MigdraAllowlist | Self::MigdraAllowlistClasses) || self.republishes()
    }

    fn class_per_profile(self) -> bool {
        matches!(self, Self::MigdraClasses | Self::MigdraAllowlistClasses) || self.republishes()
    }

    /// Whether each node publishes again after its claims change.
    fn republishes(self) -> bool {
        matches!(self, Self::MigdraFitting | Self::MigdraBestFit)
    }
}

struct Opts {
    controlplanes: Vec<PathBuf>,
    nodes: Vec<usize>,
    pods: usize,
    layouts: Vec<Layout>,
    seed: u64,
    stall: Duration,
    profile: Option<Duration>,
}

fn opts() -> Opts {
    let mut o = Opts {
        controlplanes: std::env::var_os("MIGDRA_CONTROLPLANE_BIN").map(PathBuf::from).into_iter().collect(),
        nodes: vec![50],
        pods: 300,
        layouts: vec![Layout::Migdra, Layout::MigdraWide, Layout::MigdraAllowlist, Layout::Whole, Layout::Nvidia],
        seed: 1,
        stall: Duration::from_secs(30),
        profile: None,
    };
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let mut it = args.iter();
    let list = |v: &str| v.split(',').map(str::to_string).collect::<Vec<_>>();
    let duration = |v: &str| migdra::duration::parse(v).unwrap_or_else(|e| panic!("{e}"));
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{a} needs a value")).clone();
        match a.as_str() {
            "--controlplanes" => o.controlplanes = list(&value()).into_iter().map(PathBuf::from).collect(),
            "--nodes" => o.nodes = list(&value()).iter().map(|n| n.parse().expect("--nodes: numbers")).collect(),
            "--pods" => o.pods = value().parse().expect("--pods: a number"),
            "--layouts" => o.layouts = list(&value()).iter().map(|l| Layout::parse(l)).collect(),
            "--seed" => o.seed = value().parse().expect("--seed: a number"),
            "--stall" => o.stall = duration(&value()),
            "--profile" => o.profile = Some(duration(&value())),
            other => panic!("unknown flag {other}; see the comment at the top of benches/scale.rs"),
        }
    }
    assert!(!o.controlplanes.is_empty(), "name a control plane: --controlplanes DIR or MIGDRA_CONTROLPLANE_BIN");
    o
}

/// One run's figures.
struct Figures {
    version: String,
    nodes: usize,
    layout: Layout,
    pods: usize,
    bound: usize,
    took: Duration,
    cpu: Duration,
    p50: Duration,
    p99: Duration,
    slice_bytes: usize,
    fill: f64,
    /// `kubectl migdra usage` and `why`, each the best of three runs (migdra's default layout).
    cli: Option<(Duration, Duration)>,
    /// Slice writes after the first publication ([`Layout::MigdraFitting`]), and devices left
    /// out at the end, over all nodes.
    rewrites: Option<(u64, usize)>,
}

impl Figures {
    fn cpu_per_pod(&self) -> f64 {
        self.cpu.as_secs_f64() * 1000.0 / self.bound.max(1) as f64
    }
}

fn main() {
    let o = opts();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut all = Vec::new();
    for bin in &o.controlplanes {
        for &n in &o.nodes {
            for &layout in &o.layouts {
                let f = runtime.block_on(run(&o, bin.clone(), n, layout));
                println!(
                    "  {} N={n} {}: {}/{} pods bound ({:.0} % full) in {:.1} s = {:.2} pods/s; \
                     scheduler CPU {:.1} ms/pod; \
                     bound after p50 {} ms, p99 {} ms; {} KB of slices per node",
                    f.version,
                    layout.name(),
                    f.bound,
                    f.pods,
                    f.fill * 100.0,
                    f.took.as_secs_f64(),
                    f.bound as f64 / f.took.as_secs_f64(),
                    f.cpu_per_pod(),
                    f.p50.as_millis(),
                    f.p99.as_millis(),
                    f.slice_bytes / 1000
                );
                if let Some((writes, left)) = f.rewrites {
                    println!(
                        "  {} N={n} {}: {writes} slice writes after the first publication = {:.2} \
                         per pod bound; {left} devices left out at the end",
                        f.version,
                        layout.name(),
                        writes as f64 / f.bound.max(1) as f64
                    );
                }
                if let Some((usage, why)) = f.cli {
                    println!(
                        "  {} N={n}: kubectl migdra usage {} ms, why {} ms",
                        f.version,
                        usage.as_millis(),
                        why.as_millis()
                    );
                }
                all.push(f);
            }
        }
    }
    summary(&all);
    goals(&all);
}

/// The scale goals, each beside its figure from this run (where this run has the case).
fn goals(all: &[Figures]) {
    let verdict = |ok: bool| if ok { "met" } else { "missed" };
    let find = |version: &str, n: usize, layout: Layout| {
        all.iter().find(|f| f.version.starts_with(version) && f.nodes == n && f.layout == layout)
    };
    let migdra = || LAYOUTS.iter().filter(|(_, l)| l.is_migdra_mig());
    println!("\ngoals (scheduler CPU per MIG pod):");
    for (version, target) in [("v1.36", 120.0), ("v1.37", 25.0)] {
        for &(name, layout) in migdra() {
            if let Some(f) = find(version, 50, layout) {
                let cpu = f.cpu_per_pod();
                println!(
                    "  {version} N=50, {} pods, {name}: {cpu:.1} ms, target <= {target} ms: {}",
                    f.pods,
                    verdict(cpu <= target)
                );
            }
        }
    }
    for &(name, layout) in migdra() {
        if let (Some(a), Some(b)) = (find("v1.37", 50, layout), find("v1.37", 200, layout)) {
            let r = b.cpu_per_pod() / a.cpu_per_pod();
            println!("  v1.37 N=200 / N=50, {name}: {r:.2}x, target flat (<= 1.25x): {}", verdict(r <= 1.25));
        }
    }
    for f in all.iter().filter(|f| f.nodes == 200) {
        if let Some((usage, why)) = f.cli {
            for (what, took) in [("usage", usage), ("why", why)] {
                let ms = took.as_secs_f64() * 1000.0;
                println!(
                    "  {} N=200: kubectl migdra {what} {ms:.0} ms, target < 1000 ms: {}",
                    f.version,
                    verdict(ms < 1000.0)
                );
            }
        }
    }
    for nv in all.iter().filter(|f| f.layout == Layout::Nvidia) {
        for &(name, layout) in migdra() {
            if let Some(m) = all.iter().find(|m| m.layout == layout && m.version == nv.version && m.nodes == nv.nodes) {
                let r = nv.cpu_per_pod() / m.cpu_per_pod();
                println!(
                    "  {} N={}: NVIDIA's layout / {name}: {r:.2}x, target >= 3x: {}",
                    nv.version,
                    nv.nodes,
                    verdict(r >= 3.0)
                );
            }
        }
    }
}

/// The table, and CPU per pod as a ratio to the whole-GPU run of the same version and N.
fn summary(all: &[Figures]) {
    println!(
        "\n| version | N | layout | pods bound | pods/s | scheduler CPU per pod | × whole GPU | \
         p50 / p99 to bound | slices per node |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for f in all {
        let whole = all
            .iter()
            .find(|w| w.layout == Layout::Whole && w.version == f.version && w.nodes == f.nodes)
            .map(Figures::cpu_per_pod);
        println!(
            "| {} | {} | {} | {}/{} | {:.2} | {:.1} ms | {} | {} / {} ms | {} KB |",
            f.version,
            f.nodes,
            f.layout.name(),
            f.bound,
            f.pods,
            f.bound as f64 / f.took.as_secs_f64(),
            f.cpu_per_pod(),
            whole.map_or("—".into(), |w| format!("{:.1}", f.cpu_per_pod() / w)),
            f.p50.as_millis(),
            f.p99.as_millis(),
            f.slice_bytes / 1000
        );
    }
}

async fn run(o: &Opts, bin: PathBuf, n: usize, layout: Layout) -> Figures {
    let cp = ControlPlane::start_in(bin, CLIENT_QPS).await;
    let version = cp.versions.apiserver.clone();
    eprintln!("{version} N={n} {}: control plane up in {:.1?}", layout.name(), cp.startup);
    let client = cp.client().await;
    let nodes: Vec<String> = (0..n).map(|i| format!("node-{i:04}")).collect();
    futures_util::stream::iter(nodes.iter().map(|name| create_node(&client, name)))
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;

    classes_and_templates(&client, layout).await;
    let slice_api = slices_api(&client);
    let mut slice_bytes = 0;
    let mut gpus = 0;
    for node in &nodes {
        let slices = node_slices(node, layout);
        slice_bytes = serde_json::to_vec(&slices).unwrap().len();
        gpus += 8;
        futures_util::stream::iter(slices.into_iter().map(|s| {
            let api = slice_api.clone();
            async move {
                let obj: DynamicObject = serde_json::from_value(s).unwrap();
                api.create(&PostParams::default(), &obj).await.unwrap_or_else(|e| panic!("create a slice: {e}"))
            }
        }))
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    }
    let republisher = layout.republishes().then(|| {
        let stats = Arc::new(Mutex::new((0_u64, 0_usize)));
        let full: HashMap<String, Vec<ResourceSlice>> = nodes
            .iter()
            .map(|node| {
                let typed = node_slices(node, layout).into_iter().map(|s| serde_json::from_value(s).unwrap()).collect();
                (node.clone(), typed)
            })
            .collect();
        let rank = layout == Layout::MigdraBestFit;
        (tokio::spawn(keep_fitting(client.clone(), full, rank, stats.clone())), stats)
    });
    // Let the scheduler's informers take every slice in before the clock starts.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut rng = Rng::new(o.seed);
    let wanted: Vec<&str> = (0..o.pods)
        .map(|_| {
            if layout == Layout::Whole {
                return "gpu";
            }
            let mut r = rng.below(100);
            MIX.iter().find(|(_, w)| r < *w || (r -= *w, false).1).map_or("1g.10gb", |(p, _)| p)
        })
        .collect();
    let slices_wanted: usize = wanted.iter().map(|p| memory_slices(p)).sum();
    let fill = slices_wanted as f64 / (gpus * 8) as f64;

    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let bound_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watcher = tokio::spawn(watch_bound(pods.clone(), bound_at.clone()));
    let scheduler = cp.pid("kube-scheduler");
    let cpu0 = cpu_time(scheduler);
    let profile =
        o.profile.map(|d| tokio::spawn(profile(cp.kubeconfig().to_path_buf(), cp.secure_port("kube-scheduler"), d)));
    let t0 = Instant::now();
    let created: Vec<(String, Instant)> = futures_util::stream::iter(wanted.iter().enumerate().map(|(i, p)| {
        let pods = pods.clone();
        async move {
            let name = format!("p-{i:05}");
            let pod: Pod = serde_json::from_value(pod(&name, &template_name(p))).unwrap();
            pods.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("create {name}: {e}"));
            (name, Instant::now())
        }
    }))
    .buffer_unordered(IN_FLIGHT)
    .collect()
    .await;

    // Until every pod is bound, or none was for --stall.
    let (mut last_count, mut last_change) = (0, Instant::now());
    loop {
        let count = bound_at.lock().unwrap().len();
        if count == o.pods {
            break;
        }
        if count != last_count {
            (last_count, last_change) = (count, Instant::now());
        } else if last_change.elapsed() > o.stall {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cpu = cpu_time(scheduler) - cpu0;
    watcher.abort();
    let rewrites = republisher.map(|(task, stats)| {
        task.abort();
        *stats.lock().unwrap()
    });
    let bound_at = bound_at.lock().unwrap().clone();
    let last = bound_at.values().max().copied().unwrap_or(t0);
    let mut latencies: Vec<Duration> =
        created.iter().filter_map(|(name, at)| bound_at.get(name).map(|b| b.saturating_duration_since(*at))).collect();
    latencies.sort();
    let pct = |q: f64| latencies.get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)));
    let cli = if layout == Layout::Migdra { Some(cli_times(&client, cp.kubeconfig()).await) } else { None };
    if let Some(p) = profile {
        match p.await.unwrap() {
            Ok(top) => println!("  scheduler CPU profile, {version} N={n} {}:\n{top}", layout.name()),
            Err(e) => eprintln!("  no profile: {e}"),
        }
    }
    Figures {
        version,
        nodes: n,
        layout,
        pods: o.pods,
        bound: bound_at.len(),
        took: last.saturating_duration_since(t0).max(Duration::from_millis(1)),
        cpu,
        p50: pct(0.5).copied().unwrap_or_default(),
        p99: pct(0.99).copied().unwrap_or_default(),
        slice_bytes,
        fill,
        cli,
        rewrites,
    }
}

/// What each node's migdra does when it publishes only what can still be allocated, for every
/// node at once: one task follows the claims; each node's own task, woken by a change of what
/// its claims hold (several changes coalesce), builds the node's slices again from `full` less
/// what its held devices block and replaces the changed ones in place (the pool's generation
/// stays: one slice changes per allocation); with `rank`, what is left is ranked by best fit.
/// `stats`: writes so far, devices left out now.
async fn keep_fitting(
    client: kube::Client,
    full: HashMap<String, Vec<ResourceSlice>>,
    rank: bool,
    stats: Arc<Mutex<(u64, usize)>>,
) {
    type Held = std::collections::BTreeSet<String>;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let claims: Api<ResourceClaim> = Api::all(client);
    let mut written: HashMap<String, ResourceSlice> = HashMap::new();
    for s in slices.list(&Default::default()).await.unwrap().items {
        written.insert(s.metadata.name.clone().unwrap(), s);
    }
    let mut senders = HashMap::new();
    let mut workers = Vec::new();
    for (node, mine) in full {
        let (tx, mut rx) = tokio::sync::watch::channel(Held::new());
        senders.insert(node.clone(), tx);
        let mut written: HashMap<String, ResourceSlice> = written.extract_if(|_, s| s.spec.pool.name == node).collect();
        let (slices, stats) = (slices.clone(), stats.clone());
        workers.push(tokio::spawn(async move {
            let total = mine.iter().flat_map(|s| s.spec.devices.iter().flatten()).count();
            let h100 = migdra::mig::catalog::model("h100-80gb").expect("the catalog has the H100 80GB");
            let models: BTreeMap<u32, &migdra::mig::catalog::GpuModel> = mine
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .filter_map(|d| match migdra::mig::naming::DeviceName::parse(&d.name) {
                    Ok(migdra::mig::naming::DeviceName::Mig { parent_minor, .. }) => Some((parent_minor, h100)),
                    _ => None,
                })
                .collect();
            let mut left_before = 0;
            while rx.changed().await.is_ok() {
                let keep = rx.borrow_and_update().clone();
                let mut want = mine.clone();
                let left = migdra::kube::slices::keep_fitting(&mut want, &keep);
                if rank {
                    migdra::kube::slices::rank_best_fit(&mut want, &models, &keep);
                }
                for mut s in want {
                    let name = s.metadata.name.clone().unwrap();
                    let have = &written[&name];
                    if have.spec == s.spec {
                        continue;
                    }
                    s.metadata.resource_version = have.metadata.resource_version.clone();
                    let now = slices.replace(&name, &PostParams::default(), &s).await.unwrap();
                    written.insert(name, now);
                    stats.lock().unwrap().0 += 1;
                }
                let mut st = stats.lock().unwrap();
                st.1 = st.1 + left - left_before;
                left_before = left;
                debug_assert!(left <= total);
            }
        }));
    }
    let _workers = AbortOnDrop(workers);
    let mut held: HashMap<String, BTreeMap<String, Vec<String>>> = HashMap::new();
    // As migdra's follower does: a watch that ends or fails is followed by a fresh list, so the
    // nodes never stop publishing in the middle of a run.
    for round in 0.. {
        let listed = claims.list(&Default::default()).await.unwrap();
        if round > 0 {
            eprintln!("  the bench's watch of claims ended; listed again ({} claims)", listed.items.len());
        }
        for (node, tx) in &senders {
            let now: BTreeMap<String, Vec<String>> = listed
                .items
                .iter()
                .map(|c| (c.metadata.uid.clone().unwrap_or_default(), held_devices(c, DRIVER, node)))
                .filter(|(_, d)| !d.is_empty())
                .collect();
            if held.get(node).is_none_or(|h| *h != now) {
                tx.send_replace(now.values().flatten().cloned().collect());
                held.insert(node.clone(), now);
            }
        }
        let from = listed.metadata.resource_version.unwrap();
        let mut events = claims.watch(&WatchParams::default(), &from).await.unwrap().boxed();
        while let Some(event) = events.next().await {
            let c = match event {
                Ok(WatchEvent::Added(c) | WatchEvent::Modified(c)) => c,
                Ok(WatchEvent::Error(e)) => {
                    eprintln!("  the bench's watch of claims: {e}");
                    break;
                }
                Err(e) => {
                    eprintln!("  the bench's watch of claims: {e}");
                    break;
                }
                Ok(_) => continue,
            };
            let uid = c.metadata.uid.clone().unwrap_or_default();
            for (node, tx) in &senders {
                let devices = held_devices(&c, DRIVER, node);
                let of_node = held.entry(node.clone()).or_default();
                if of_node.get(&uid).map_or(devices.is_empty(), |d| *d == devices) {
                    continue;
                }
                of_node.insert(uid.clone(), devices);
                tx.send_replace(of_node.values().flatten().cloned().collect());
            }
        }
    }
}

/// Tasks aborted when the bench stops following.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

/// How long `kubectl migdra usage -o json` and `why` take against this cluster, each the best of
/// three runs of the release binary. `why` explains a claim no node can take (100 1g.10gb
/// devices on one node): every GPU of every node matches and is explained, its worst case.
async fn cli_times(client: &kube::Client, kubeconfig: &std::path::Path) -> (Duration, Duration) {
    let claim: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "why-bench", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "mig-1g.10gb", "allocationMode": "ExactCount", "count": 100}}]}}
    }))
    .unwrap();
    Api::namespaced(client.clone(), NAMESPACE).create(&PostParams::default(), &claim).await.unwrap();
    let kubeconfig = kubeconfig.to_path_buf();
    let (usage, why) = tokio::task::spawn_blocking(move || {
        let best = |args: &[&str]| {
            (0..3)
                .map(|_| {
                    let t0 = Instant::now();
                    let out = migdra().args(args).env("KUBECONFIG", &kubeconfig).ok();
                    // usage's JSON lists every GPU; why's text groups the nodes, so it names them.
                    assert!(
                        out.len() > 1000 || out.contains("matching devices on"),
                        "{args:?} printed too little:\n{out}"
                    );
                    t0.elapsed()
                })
                .min()
                .unwrap_or_default()
        };
        let usage = best(&["usage", "-o", "json"]);
        let why = best(&["why", "claim/why-bench", "-n", NAMESPACE]);
        (usage, why)
    })
    .await
    .unwrap();
    // The API server's side of it, both encodings in the same run: what reading in protobuf saves.
    for (name, media) in [("JSON", "application/json"), ("protobuf", migdra::cluster::wire::protobuf::MEDIA_TYPE)] {
        let mut runs = Vec::new();
        for _ in 0..3 {
            runs.push(read_slices(client, media).await);
        }
        let (took, bytes) = runs.into_iter().min().unwrap_or_default();
        println!(
            "    every slice read in pages of 100 in {name}: {} ms, {:.1} MB (best of 3, not parsed)",
            took.as_millis(),
            bytes as f64 / 1e6
        );
    }
    (usage, why)
}

/// Every ResourceSlice in pages of 100, as `usage` and `why` ask for them, in this media type:
/// how long and how many bytes.
async fn read_slices(client: &kube::Client, media: &str) -> (Duration, usize) {
    use migdra::cluster::wire;
    let t0 = Instant::now();
    let (mut bytes, mut token) = (0, None::<String>);
    loop {
        let mut uri = "/apis/resource.k8s.io/v1/resourceslices?limit=100".to_string();
        if let Some(t) = token.take() {
            uri.push_str(&format!("&continue={t}"));
        }
        let request = http::Request::get(uri).header("Accept", media).body(kube::client::Body::empty()).unwrap();
        let body = client.send(request).await.unwrap().into_body().collect_bytes().await.unwrap();
        bytes += body.len();
        token = if media == wire::protobuf::MEDIA_TYPE {
            wire::protobuf::continue_token(&body).unwrap()
        } else {
            serde_json::from_slice::<wire::List<serde::de::IgnoredAny>>(&body).unwrap().metadata.continue_
        };
        if token.as_deref().unwrap_or_default().is_empty() {
            return (t0.elapsed(), bytes);
        }
    }
}

/// A pod's share of an H100's 8 memory slices, from the catalog: a whole GPU takes all of them.
fn memory_slices(profile: &str) -> usize {
    let h100 = migdra::mig::catalog::model("h100-80gb").expect("the catalog has the H100 80GB");
    h100.profile_by_name(profile).map_or(8, |p| p.memory_slices as usize)
}

fn template_name(profile: &str) -> String {
    format!("t-{}", profile.replace('.', "-"))
}

fn pod(name: &str, template: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "containers": [{
                "name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}
            }],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        }
    })
}

/// Record when each pod first has a node.
async fn watch_bound(pods: Api<Pod>, bound_at: Arc<Mutex<HashMap<String, Instant>>>) {
    let mut version = "0".to_string();
    loop {
        let Ok(stream) = pods.watch(&WatchParams::default().timeout(290), &version).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = stream.boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            let pod = match event {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => p,
                WatchEvent::Bookmark(b) => {
                    version = b.metadata.resource_version;
                    continue;
                }
                _ => continue,
            };
            if let Some(v) = &pod.metadata.resource_version {
                version.clone_from(v);
            }
            if pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                let name = pod.metadata.name.unwrap_or_default();
                bound_at.lock().unwrap().entry(name).or_insert_with(Instant::now);
            }
        }
    }
}

/// utime + stime of a process.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let hz: u64 = std::process::Command::new("getconf").arg("CLK_TCK").ok().trim().parse().unwrap_or(100);
    Duration::from_millis(ticks * 1000 / hz)
}

fn slices_api(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

async fn classes_and_templates(client: &kube::Client, layout: Layout) {
    let ns = NAMESPACE;
    let mut docs = Vec::new();
    let class = match layout {
        Layout::Nvidia => {
            docs.push(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "nv-mig"},
                "spec": {"selectors": [{"cel": {"expression": format!(
                    "device.driver == '{NV_DRIVER}' && device.attributes['{NV_DRIVER}'].type == 'mig'")}}]}
            }));
            "nv-mig"
        }
        _ => {
            apply(client, &repo().join("daemonset/base/deviceclasses.yaml"), ns).await;
            "mig"
        }
    };
    let selector = |p: &str| match layout {
        Layout::Nvidia => format!("device.attributes['{NV_DRIVER}'].profile == '{p}'"),
        _ => format!("device.attributes[\"{}\"].profile == \"{p}\"", support::DRIVER),
    };
    for (p, _) in MIX {
        if layout.class_per_profile() {
            docs.push(template(&template_name(p), &format!("mig-{p}"), None));
        } else {
            docs.push(template(&template_name(p), class, Some(&selector(p))));
        }
    }
    docs.push(template(&template_name("gpu"), "gpu", None));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("objects.yaml");
    let text: Vec<String> = docs.iter().map(|d| serde_json::to_string(d).unwrap()).collect();
    std::fs::write(&file, text.join("\n---\n")).unwrap();
    apply(client, &file, ns).await;
}

fn template(name: &str, class: &str, selector: Option<&str>) -> Value {
    let mut exactly = json!({"deviceClassName": class, "allocationMode": "ExactCount", "count": 1});
    if let Some(cel) = selector {
        exactly["selectors"] = json!([{"cel": {"expression": cel}}]);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
    })
}

/// The slices one node publishes in this layout.
fn node_slices(node: &str, layout: Layout) -> Vec<Value> {
    let sim = if layout == Layout::Whole { "h100-80gb:8:mig-off" } else { "h100-80gb:8" };
    let mut args = vec!["slices", "--sim", sim, "--node-name", node, "-o", "json"];
    let allowlist: Vec<&str> = MIX.iter().map(|(p, _)| *p).collect();
    let allowlist = allowlist.join(",");
    if layout.allowlist() {
        args.extend(["--profiles", &allowlist]);
    }
    let out = migdra().args(&args).ok();
    let items = serde_json::from_str::<Value>(&out).unwrap()["items"].as_array().unwrap().clone();
    match layout {
        Layout::Migdra
        | Layout::MigdraAllowlist
        | Layout::MigdraClasses
        | Layout::MigdraAllowlistClasses
        | Layout::MigdraFitting
        | Layout::MigdraBestFit
        | Layout::Whole => items,
        Layout::MigdraWide => wide_slices(&items),
        Layout::MigdraLean => {
            let mut items = items;
            for d in items.iter_mut().flat_map(|i| i["spec"]["devices"].as_array_mut().into_iter().flatten()) {
                let attributes = d["attributes"].as_object_mut().unwrap();
                attributes.retain(|k, _| !LEAN_DROPS.contains(&k.as_str()));
            }
            items
        }
        Layout::Nvidia => nvidia_slices(node, &items),
    }
}

/// The attributes [`Layout::MigdraLean`] leaves out: the same on every partition of a GPU (or,
/// for `memorySlices`, equal to `placementSize`); 11 of a partition's 19 remain.
const LEAN_DROPS: [&str; 8] = [
    "productName",
    "minor",
    "slurmGpuIndexSource",
    "migMode",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "memorySlices",
];

/// Every resource of a GPU as counters, from its partitions' capacities: for each capacity the
/// largest value (the 7g's), and every memory slice.
fn wide_set(partitions: &[&Value]) -> serde_json::Map<String, Value> {
    let mut set = serde_json::Map::new();
    for d in partitions {
        for (k, v) in d["capacity"].as_object().unwrap() {
            if set.get(&dns_name(k)).is_none_or(|c: &Value| quantity(v) > quantity(c)) {
                set.insert(dns_name(k), v.clone());
            }
        }
        for k in memory_slices_of(d) {
            set.insert(format!("memory-slice-{k}"), json!({"value": "1"}));
        }
    }
    set
}

/// What a partition consumes of [`wide_set`]: its capacities (zeros left out, as migdra did)
/// and its memory slices.
fn wide_consumption(d: &Value, zeros: bool) -> serde_json::Map<String, Value> {
    let mut counters: serde_json::Map<String, Value> = d["capacity"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, v)| zeros || quantity(v) > 0)
        .map(|(k, v)| (dns_name(k), v.clone()))
        .collect();
    for k in memory_slices_of(d) {
        counters.insert(format!("memory-slice-{k}"), json!({"value": "1"}));
    }
    counters
}

fn memory_slices_of(d: &Value) -> std::ops::Range<u64> {
    let int = |k: &str| d["attributes"][k]["int"].as_u64().unwrap();
    let start = int("placementStart");
    start..start + int("placementSize")
}

/// migdra's slices with every resource counted ([`Layout::MigdraWide`]).
fn wide_slices(items: &[Value]) -> Vec<Value> {
    let mut by_set: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for d in items.iter().flat_map(|i| i["spec"]["devices"].as_array().into_iter().flatten()) {
        let set = d["consumesCounters"][0]["counterSet"].as_str().unwrap().to_string();
        by_set.entry(set).or_default().push(d.clone());
    }
    let mut out = items.to_vec();
    for item in &mut out {
        for d in item["spec"]["devices"].as_array_mut().into_iter().flatten() {
            d["consumesCounters"][0]["counters"] = Value::Object(wide_consumption(d, false));
        }
        for set in item["spec"]["sharedCounters"].as_array_mut().into_iter().flatten() {
            let devices: Vec<&Value> = by_set[set["name"].as_str().unwrap()].iter().collect();
            set["counters"] = Value::Object(wide_set(&devices));
        }
    }
    out
}

/// NVIDIA's DynamicMIG layout of the same GPUs (docs/facts/anchor-nvidia-dra.md §1.2–§1.6): per
/// GPU a counter set `gpu-<minor>-counter-set` with the 7 capacity maxima and the memory slices,
/// the whole GPU consuming all of it beside every partition consuming its profile's 7 values and
/// its memory slices; NVIDIA's attribute set; split layout, every counter set in the first slice,
/// then one slice per GPU with its devices sorted by name.
fn nvidia_slices(node: &str, migdra_items: &[Value]) -> Vec<Value> {
    let attr = |d: &Value, k: &str| d["attributes"][k].clone();
    let mut sets = Vec::new();
    let mut per_gpu: BTreeMap<u64, Vec<Value>> = BTreeMap::new();
    let wide = wide_slices(migdra_items);
    for item in &wide {
        for set in item["spec"]["sharedCounters"].as_array().into_iter().flatten() {
            let minor = minor_of(set["name"].as_str().unwrap());
            sets.push(json!({"name": format!("gpu-{minor}-counter-set"), "counters": set["counters"]}));
        }
    }
    for item in migdra_items {
        for d in item["spec"]["devices"].as_array().into_iter().flatten() {
            let minor = attr(d, "minor")["int"].as_u64().unwrap();
            let common = [
                ("productName", attr(d, "productName")),
                ("brand", json!({"string": "Nvidia"})),
                ("architecture", attr(d, "architecture")),
                ("cudaComputeCapability", attr(d, "cudaComputeCapability")),
                ("driverVersion", attr(d, "driverVersion")),
                ("cudaDriverVersion", json!({"version": "13.0.0"})),
                ("addressingMode", json!({"string": "None"})),
                ("resource.kubernetes.io/pciBusID", attr(d, "resource.kubernetes.io/pciBusID")),
                ("resource.kubernetes.io/pcieRoot", json!({"string": "pci0000:00"})),
            ];
            let mut attributes: serde_json::Map<String, Value> =
                common.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            attributes.insert("type".into(), json!({"string": "mig"}));
            attributes.insert("parentUUID".into(), attr(d, "parentUUID"));
            attributes.insert("profile".into(), attr(d, "profile"));
            let capacity = d["capacity"].clone();
            let counters = wide_consumption(d, true);
            per_gpu.entry(minor).or_default().push(json!({
                "name": d["name"],
                "attributes": attributes,
                "capacity": capacity,
                "consumesCounters": [{"counterSet": format!("gpu-{minor}-counter-set"), "counters": counters}],
            }));
        }
    }
    // The whole GPU beside its partitions: the largest value of each capacity, consuming all.
    for set in &sets {
        let name = set["name"].as_str().unwrap();
        let minor = minor_of(name);
        let devices = per_gpu.get_mut(&minor).unwrap();
        let first = devices[0].clone();
        let mut capacity = serde_json::Map::new();
        for d in devices.iter() {
            for (k, v) in d["capacity"].as_object().unwrap() {
                let bigger = capacity.get(k).is_none_or(|c: &Value| quantity(v) > quantity(c));
                if bigger {
                    capacity.insert(k.clone(), v.clone());
                }
            }
        }
        let mut attributes = first["attributes"].as_object().unwrap().clone();
        attributes.remove("profile");
        let uuid = attributes.remove("parentUUID").unwrap();
        attributes.insert("uuid".into(), uuid);
        attributes.insert("type".into(), json!({"string": "gpu"}));
        devices.push(json!({
            "name": format!("gpu-{minor}"),
            "attributes": attributes,
            "capacity": capacity,
            "consumesCounters": [{"counterSet": name, "counters": set["counters"]}],
        }));
    }
    let count = per_gpu.len() + 1;
    let slice = |i: usize, spec: Value| {
        let mut spec = spec;
        spec["driver"] = json!(NV_DRIVER);
        spec["nodeName"] = json!(node);
        spec["pool"] = json!({"name": node, "generation": 1, "resourceSliceCount": count});
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": format!("{node}-gpu.nvidia.com-{i}")}, "spec": spec})
    };
    let mut out = vec![slice(0, json!({"sharedCounters": sets}))];
    for (i, (_, mut devices)) in per_gpu.into_iter().enumerate() {
        devices.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        out.push(slice(i + 1, json!({"devices": devices})));
    }
    out
}

fn minor_of(counter_set: &str) -> u64 {
    counter_set.trim_start_matches("gpu-").split('-').next().unwrap().parse().unwrap()
}

/// camelCase capacity name → NVIDIA's counter name (`copyEngines` → `copy-engines`).
fn dns_name(capacity: &str) -> String {
    let mut out = String::new();
    for c in capacity.chars() {
        if c.is_ascii_uppercase() {
            out.push('-');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// A capacity's `value` (`9856Mi`, `40Gi` or `16`) as a number, to take maxima.
fn quantity(v: &Value) -> u128 {
    let s = v["value"].as_str().unwrap();
    s.parse::<migdra::mig::devices::Quantity>().unwrap_or_else(|e| panic!("{e}")).base()
}

/// `go tool pprof -top` of a CPU profile of the scheduler taken from its secure port.
async fn profile(kubeconfig: PathBuf, port: u16, seconds: Duration) -> Result<String, String> {
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).map_err(|e| e.to_string())?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    config.cluster_url = format!("https://127.0.0.1:{port}").parse().unwrap();
    config.accept_invalid_certs = true;
    config.root_cert = None;
    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
    let request =
        http::Request::get(format!("/debug/pprof/profile?seconds={}", seconds.as_secs())).body(Vec::new()).unwrap();
    let response = client.send(request.map(kube::client::Body::from)).await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("GET /debug/pprof/profile on port {port}: {}", response.status()));
    }
    let bytes = http_body_util::BodyExt::collect(response.into_body()).await.map_err(|e| e.to_string())?.to_bytes();
    let file = std::env::temp_dir().join(format!("migdra-scheduler-{port}.pprof"));
    std::fs::write(&file, &bytes).map_err(|e| e.to_string())?;
    let top = |extra: &[&str]| {
        std::process::Command::new("go")
            .args(["tool", "pprof", "-top", "-nodecount=25"])
            .args(extra)
            .arg(&file)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .map_err(|e| e.to_string())
    };
    Ok(format!("profile: {}\n-- flat --\n{}\n-- cumulative --\n{}", file.display(), top(&[])?, top(&["-cum"])?))
}
