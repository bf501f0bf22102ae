//! The Slurm index migdra reports against a real Slurm, on each release the tests run (Debian 12's
//! 22.05, and 26.05 when `MIGDRA_SLURM_BIN` names hack/slurm-2605.sh's chroot): slurmctld and
//! slurmd on localhost (as root, no systemd: proctrack/linuxproc, task/none, select/cons_tres,
//! AutoDetect=off) with fake `/dev/nvidiaN` character devices for twelve simulated H100s.
//!
//! The GPUs' minors do not follow NVML order, slurm.conf names the types in yet another order
//! (string order: t10 before t2), gres.conf lists them in a third, with ranges, an Include, a line
//! for another node, comments, Cores= and per-GPU shard counts. A job for each GPU (a per-GPU Type
//! lets it pick one; two take shards instead) reports its GPU's index (`scontrol show job -d`,
//! IDX); migdra must compute the same index for that device file from `slurmd -G` and from its
//! gres.conf emulation, and publish it with its source and shard count in the slices and the claim
//! status.
//!
//! Needs root and `hack/slurm-deps.sh` or `hack/slurm-2605.sh` (hack/test.sh runs both). Without
//! Slurm the test says so and passes, unless MIGDRA_REQUIRE_SLURM=1 (set by .ci/run): it fails.

#![allow(clippy::print_stdout)] // the test prints what it compared

mod support;

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::command::Run;
use support::slurm::{self, Slurm};

const GPUS: usize = 12;
fn migdra(dir: &Path, args: &[&str]) -> String {
    support::command::migdra()
        .args(["--sim-state", dir.join("sim.json").to_str().unwrap(), "--node-name", "node-a"])
        .args(["--state-dir", dir.join("state").to_str().unwrap(), "--cdi-dir", dir.join("cdi").to_str().unwrap()])
        .args(["--claims-dir", dir.join("claims").to_str().unwrap()])
        .args(args)
        .ok()
}

fn devices(slices: &Value) -> Vec<Value> {
    slices["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

#[test]
fn migdra_computes_the_index_slurmd_gives_each_gpu() {
    if !slurm::required() {
        return;
    }
    let tmp = tempfile::Builder::new().prefix("migdra-slurm").tempdir_in("/tmp").unwrap();
    let dir = tmp.path();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();

    // Twelve GPUs; their minors, in NVML order, are not 0..11 in order.
    let sim = dir.join("sim.json");
    support::command::migdra()
        .args(["--sim", &format!("h100-80gb:{GPUS}"), "--sim-state", sim.to_str().unwrap(), "layout"])
        .output()
        .unwrap();
    let layout: Value = serde_json::from_str(&migdra(dir, &["layout", "-o", "json"])).unwrap();
    let minors: Vec<u32> =
        layout["gpus"].as_array().unwrap().iter().map(|g| g["minor"].as_u64().unwrap() as u32).collect();
    let uuids: Vec<String> =
        layout["gpus"].as_array().unwrap().iter().map(|g| g["uuid"].as_str().unwrap().into()).collect();
    assert_eq!(minors.len(), GPUS);
    let dev = dir.join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    for m in &minors {
        let path = dev.join(format!("nvidia{m}"));
        slurm::run("mknod", &[path.to_str().unwrap(), "c", "195", &m.to_string()], Path::new("/dev/null"));
    }
    let file = |nvml: usize| format!("{}/nvidia{}", dev.display(), minors[nvml]);

    // Types: a100 = NVML 0, 5, 9 (one range line); big = NVML 3, 7 (two lines); one type per
    // other GPU, t<minor>. Shards per GPU differ so each count is checked.
    let a100 = [0, 5, 9];
    let big = [3, 7];
    let single: Vec<usize> = (0..GPUS).filter(|i| !a100.contains(i) && !big.contains(i)).collect();
    let ty = |i: usize| format!("t{}", minors[i]);
    let shards = |i: usize| -> u32 { if a100.contains(&i) { 8 } else { [4, 6, 8, 10][i % 4] } };
    let mut types: Vec<String> = single.iter().map(|&i| ty(i)).collect();
    types.sort(); // string order: t10 before t2, unlike minors or NVML
    let total: u32 = (0..GPUS).map(shards).sum();
    let gres_items: Vec<String> = types
        .iter()
        .map(|t| format!("gpu:{t}:1"))
        .chain(["gpu:big:2".into(), "gpu:a100:3".into(), format!("shard:{total}")])
        .collect();

    let mut gres = String::from("AutoDetect=off\n# the cluster's GPUs, not in NVML order\n");
    gres += "NodeName=elsewhere[1-4] Name=gpu Type=t99 File=/dev/nvidia99\n";
    let a100_minors: Vec<String> = a100.iter().map(|&i| minors[i].to_string()).collect();
    gres += &format!("Name=gpu Type=a100 File={}/nvidia[{}] Cores=0-7\n", dev.display(), a100_minors.join(","));
    for &i in single.iter().rev().take(3) {
        gres += &format!("NodeName={host} Name=gpu Type={} File={} Count=1\n", ty(i), file(i));
    }
    gres += &format!("Name=gpu Type=big File={}\nInclude {}/gres-more.conf\n", file(big[1]), dir.display());
    let mut more = String::from("# included\n");
    for &i in single.iter().rev().skip(3) {
        more += &format!("Name=gpu Type={} File={}\n", ty(i), file(i));
    }
    more += &format!("Name=gpu Type=big File={} # the other big one\n", file(big[0]));
    std::fs::write(dir.join("gres-more.conf"), more).unwrap();
    gres += &format!("Name=shard Count=24 File={}/nvidia[{}]\n", dev.display(), a100_minors.join(","));
    for i in (0..GPUS).filter(|i| !a100.contains(i)) {
        gres += &format!("Name=shard Count={} File={}\n", shards(i), file(i));
    }
    std::fs::write(dir.join("gres.conf"), &gres).unwrap();
    let cluster = Slurm::start(dir, &gres_items.join(","));

    // One job per GPU; two of the single GPUs take shards, which carry their GPU's index too.
    let shard_jobs = [single[0], single[2]];
    let mut jobs: Vec<(String, Vec<usize>)> = Vec::new();
    for &i in &single {
        let gres = if shard_jobs.contains(&i) { format!("shard:{}:2", ty(i)) } else { format!("gpu:{}:1", ty(i)) };
        jobs.push((cluster.submit(&ty(i), &gres), vec![i]));
    }
    for _ in big {
        jobs.push((cluster.submit("big", "gpu:big:1"), big.to_vec()));
    }
    for _ in a100 {
        jobs.push((cluster.submit("a100", "gpu:a100:1"), a100.to_vec()));
    }
    cluster.wait_for(
        |c| jobs.iter().all(|(id, _)| c.scontrol(&["show", "job", id]).contains("JobState=RUNNING")),
        "every job RUNNING",
    );
    let slurm_idx: Vec<(u32, &Vec<usize>)> = jobs.iter().map(|(id, gpus)| (cluster.job_index(id), gpus)).collect();

    let mut computed = Vec::new();
    let common = ["--slurm-conf", cluster.conf.to_str().unwrap(), "--slurm-node-name", &host];
    for (slurmd, want_source) in
        [(slurm::bin("slurmd").display().to_string(), "slurmd"), ("none".to_string(), "gres.conf")]
    {
        let mut args = vec!["status", "-o", "json", "--slurmd", &slurmd];
        args.extend(common);
        let status: Value = serde_json::from_str(&migdra(dir, &args)).unwrap();
        assert_eq!(status["slurm"]["source"], want_source, "{}", status["slurm"]);
        if want_source == "slurmd" {
            assert_eq!(status["slurm"]["version"], slurm::version(), "slurmd -V, as migdra read it");
        }
        let warnings: Vec<&Value> =
            status["slurm"]["notes"].as_array().unwrap().iter().filter(|n| n["warning"] == true).collect();
        assert!(warnings.is_empty(), "{warnings:?}");
        let gpus = status["gpus"].as_array().unwrap();
        let ours: Vec<u32> = gpus.iter().map(|g| g["slurmGpuIndex"].as_u64().unwrap() as u32).collect();
        for (idx, on) in &slurm_idx {
            if let [i] = on.as_slice() {
                assert_eq!(ours[*i], *idx, "{want_source}: GPU {} ({}) has Slurm IDX {idx}", minors[*i], ty(*i));
            }
        }
        for group in [&a100[..], &big[..]] {
            let theirs: BTreeSet<u32> =
                slurm_idx.iter().filter(|(_, on)| on.as_slice() == group).map(|(i, _)| *i).collect();
            let mine: BTreeSet<u32> = group.iter().map(|&i| ours[i]).collect();
            assert_eq!(mine, theirs, "{want_source}: indexes of the GPUs sharing a type");
        }
        for (i, g) in gpus.iter().enumerate() {
            assert_eq!(g["slurmShards"], shards(i), "{want_source}: shards of GPU {}", minors[i]);
            assert_eq!(g["slurmGpuIndexSource"], want_source);
        }
        // The test means something only if Slurm's order is neither NVML's nor the minors'.
        let nvml: Vec<u32> = (0..GPUS as u32).collect();
        let mut by_minor: Vec<usize> = (0..GPUS).collect();
        by_minor.sort_by_key(|&i| minors[i]);
        let minor_rank: Vec<u32> = (0..GPUS).map(|i| by_minor.iter().position(|&j| j == i).unwrap() as u32).collect();
        assert_ne!(ours, nvml);
        assert_ne!(ours, minor_rank);
        println!("{want_source}: Slurm indexes by NVML index {ours:?} (minors {minors:?})");
        computed = ours;
    }

    // The slices and the claim status carry the index, its source and the shards.
    let mut args = vec!["slices", "-o", "json", "--slurmd", "none"];
    args.extend(common);
    let slices: Value = serde_json::from_str(&migdra(dir, &args)).unwrap();
    let status: Value = serde_json::from_str(&migdra(
        dir,
        &[
            "status",
            "-o",
            "json",
            "--slurmd",
            "none",
            "--slurm-conf",
            cluster.conf.to_str().unwrap(),
            "--slurm-node-name",
            &host,
        ],
    ))
    .unwrap();
    let index_of: BTreeMap<u32, u64> = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["minor"].as_u64().unwrap() as u32, g["slurmGpuIndex"].as_u64().unwrap()))
        .collect();
    let driver = "mig.slinky.slurm.net";
    let mut seen = 0;
    for d in devices(&slices) {
        let a = &d["attributes"];
        let attr = |k: &str| a[k].clone(); // unqualified names are the driver's own
        let minor = attr("minor")["int"].as_u64().unwrap() as u32;
        let i = minors.iter().position(|m| *m == minor).unwrap();
        assert_eq!(attr("slurmGpuIndex")["int"].as_u64(), Some(index_of[&minor]), "{}", d["name"]);
        assert_eq!(attr("slurmGpuIndexSource")["string"], "gres.conf", "{}", d["name"]);
        let size = attr("memorySlices")["int"].as_u64().unwrap() as u32;
        assert_eq!(
            attr("slurmShards")["int"].as_u64(),
            Some(u64::from((size * shards(i)).div_ceil(8))),
            "{}",
            d["name"]
        );
        seen += 1;
    }
    assert!(seen >= GPUS * 19, "every partition of every GPU: {seen}");

    // A GPU whose Slurm index is neither its minor nor its NVML index.
    let gpu = *single.iter().find(|&&i| computed[i] != minors[i] && computed[i] != i as u32).unwrap();
    let device = format!("gpu-{}-mig-3g40gb-9-4", minors[gpu]);
    let uid = "5b0c1f8e-4c1a-4d2b-9e3f-7a6b5c4d3e2f";
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "notebook", "namespace": "team-a", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": driver, "pool": "node-a", "device": device}
        ]}}}
    });
    std::fs::create_dir_all(dir.join("claims")).unwrap();
    std::fs::write(dir.join("claims").join(format!("{uid}.json")), claim.to_string()).unwrap();
    let mut args =
        vec!["claims", "prepare", uid, "-o", "json", "--slurmd", &slurm::bin("slurmd").display().to_string()]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
    args.extend(common.iter().map(|s| s.to_string()));
    let prepared: Value =
        serde_json::from_str(&migdra(dir, &args.iter().map(String::as_str).collect::<Vec<_>>())).unwrap();
    let data = &prepared[0]["data"];
    let job = slurm_idx.iter().find(|(_, on)| on.as_slice() == [gpu]).unwrap().0;
    assert_eq!(data["slurmGpuIndex"], job, "{data}");
    assert_eq!(data["slurmGpuIndexSource"], "slurmd", "{data}");
    assert_eq!(data["slurmShards"], (4 * shards(gpu)).div_ceil(8), "{data}");
    assert_eq!(data["parentUUID"], uuids[gpu].as_str());
    println!("claim on GPU minor {}: Slurm IDX {job}, status {data}", minors[gpu]);
}

/// A hybrid node configured from `migdra slurm-conf`, as an administrator would: the command's
/// gres.conf in `dir/gres.conf`, its `Gres=` on the node's line of `dir/slurm.conf`, and a fake
/// `/dev/nvidiaN` character device under `dir/dev` for each GPU it lists; then slurmctld and slurmd
/// are started. `dir` holds the simulated GPUs (`sim.json`, see [`migdra`]); `extra` goes to the
/// command (e.g. `--shards-per-gpu 4`, `--slurm-index-map FILE`, `--mig-mode-override 1=static`).
/// Returns the cluster and the command's JSON: `gres`, `records`, and per GPU in NVML order
/// `slurmGpuIndex` (absent when Slurm does not schedule it) and `slurmShards`.
fn hybrid_node(dir: &Path, host: &str, extra: &[&str]) -> (Slurm, Value) {
    let dev = dir.join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    let conf_path = dir.join("slurm.conf");
    let mut args = vec!["slurm-conf", "-o", "json", "--slurm-node-name", host, "--slurmd", "none"];
    args.extend(["--dev-root", dev.to_str().unwrap(), "--slurm-conf", conf_path.to_str().unwrap()]);
    args.extend(extra);
    let conf: Value = serde_json::from_str(&migdra(dir, &args)).unwrap();
    let cluster = slurm::from_slurm_conf(dir, &conf);
    (cluster, conf)
}

/// `migdra <command> -o json` against the running cluster, asking `slurmd` (a path, or `none`).
fn against(dir: &Path, command: &str, cluster: &Slurm, host: &str, slurmd: &str) -> Value {
    let conf = cluster.conf.to_str().unwrap();
    let args = [command, "-o", "json", "--slurmd", slurmd, "--slurm-conf", conf, "--slurm-node-name", host];
    serde_json::from_str(&migdra(dir, &args)).unwrap()
}

/// `migdra status -o json` against the running cluster: (source, notes that are warnings, per GPU
/// in NVML order its Slurm index and shards).
type Seen = (String, Vec<Value>, Vec<(Option<u64>, u64)>);

fn slurm_view(dir: &Path, cluster: &Slurm, host: &str, extra: &[&str]) -> Seen {
    let mut args = vec!["status", "-o", "json", "--slurm-conf", cluster.conf.to_str().unwrap()];
    args.extend(["--slurm-node-name", host]);
    args.extend(extra);
    let status: Value = serde_json::from_str(&migdra(dir, &args)).unwrap();
    let warnings =
        status["slurm"]["notes"].as_array().unwrap().iter().filter(|n| n["warning"] == true).cloned().collect();
    let gpus = status["gpus"].as_array().unwrap();
    let per_gpu = gpus.iter().map(|g| (g["slurmGpuIndex"].as_u64(), g["slurmShards"].as_u64().unwrap())).collect();
    (status["slurm"]["source"].as_str().unwrap().to_string(), warnings, per_gpu)
}

/// `migdra slurm-conf`'s lines make the real slurmd number the GPUs and count their shards as
/// migdra does: by default Slurm index = NVML index (the minors follow neither), shards = migdra's
/// slurmShards for the whole GPU; with an administrator's map, the map's order; a static-MIG GPU is
/// left out and Slurm does not schedule it. Checked through `slurmd -G` (migdra's `slurmd` source),
/// the gres.conf emulation, the node's GRES in slurmctld, and jobs: one job of a whole GPU's shards
/// runs on every GPU, each on its own IDX, and nothing more fits.
#[test]
fn slurm_conf_makes_slurm_agree_with_migdra() {
    if !slurm::required() {
        return;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    let slurmd = slurm::bin("slurmd").display().to_string();

    // Twelve GPUs, two of them with MIG off (published whole); minors not in NVML order.
    let tmp = tempfile::Builder::new().prefix("migdra-slurmconf").tempdir_in("/tmp").unwrap();
    let dir = tmp.path();
    support::command::migdra()
        .args(["--sim", "h100-80gb:10,h100-80gb:2:mig-off", "--sim-state", dir.join("sim.json").to_str().unwrap()])
        .arg("layout")
        .ok();
    let layout: Value = serde_json::from_str(&migdra(dir, &["layout", "-o", "json"])).unwrap();
    let minors: Vec<u64> = layout["gpus"].as_array().unwrap().iter().map(|g| g["minor"].as_u64().unwrap()).collect();
    assert_ne!(minors, (0..GPUS as u64).collect::<Vec<_>>());
    let (cluster, conf) = hybrid_node(dir, &host, &[]);
    assert_eq!(conf["gres"], "gpu:h100:12,shard:96");
    let node = cluster.scontrol(&["show", "node", &host]);
    assert!(node.contains("Gres=gpu:h100:12,shard:h100:96"), "{node}");
    let want: Vec<(Option<u64>, u64)> = (0..GPUS as u64).map(|i| (Some(i), 8)).collect();
    let generated: Vec<(Option<u64>, u64)> = conf["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["slurmGpuIndex"].as_u64(), g["slurmShards"].as_u64().unwrap()))
        .collect();
    assert_eq!(generated, want, "slurm-conf: Slurm index = NVML index, 8 shards each");
    for (flag, source) in [(slurmd.as_str(), "slurmd"), ("none", "gres.conf")] {
        let (got, warnings, per_gpu) = slurm_view(dir, &cluster, &host, &["--slurmd", flag]);
        assert_eq!((got.as_str(), warnings, &per_gpu), (source, Vec::new(), &want), "{source}");
        println!("{source}: (Slurm index, shards) by NVML index {per_gpu:?}, minors {minors:?}");
    }
    // What the slices publish: every device carries its GPU's index; the whole GPU its shards.
    let slices = against(dir, "slices", &cluster, &host, &slurmd);
    let mut most = vec![0; GPUS];
    for d in devices(&slices) {
        let a = &d["attributes"];
        let i = minors.iter().position(|m| Some(*m) == a["minor"]["int"].as_u64()).unwrap();
        assert_eq!(a["slurmGpuIndex"]["int"].as_u64(), want[i].0, "{}", d["name"]);
        let shards = a["slurmShards"]["int"].as_u64().unwrap();
        most[i] = most[i].max(shards);
        if d["name"] == format!("gpu-{}", minors[i]) {
            assert_eq!(shards, want[i].1, "{}: the whole GPU", d["name"]);
        }
    }
    assert_eq!(most, vec![8; GPUS], "the largest device of each GPU stands for all its shards");
    // Jobs: a whole GPU's shards fit on every GPU, each on its own IDX, and then nothing fits.
    let jobs: Vec<String> = (0..GPUS).map(|i| cluster.submit(&format!("s{i}"), "shard:8")).collect();
    cluster.wait_for(
        |c| jobs.iter().all(|id| c.scontrol(&["show", "job", id]).contains("JobState=RUNNING")),
        "every shard job RUNNING",
    );
    let idx: BTreeSet<u32> = jobs.iter().map(|id| cluster.job_index(id)).collect();
    assert_eq!(idx, (0..GPUS as u32).collect::<BTreeSet<_>>());
    let more = cluster.submit("more", "shard:1");
    std::thread::sleep(Duration::from_secs(3));
    let text = cluster.scontrol(&["show", "job", &more]);
    assert!(text.contains("JobState=PENDING"), "no GPU has a 9th shard: {text}");
    drop(cluster);

    // Six GPUs: NVML 1 in static MIG mode, 4 shards per GPU, a map in reverse NVML order.
    let tmp = tempfile::Builder::new().prefix("migdra-slurmconf").tempdir_in("/tmp").unwrap();
    let dir = tmp.path();
    support::command::migdra()
        .args(["--sim", "h100-80gb:6", "--sim-state", dir.join("sim.json").to_str().unwrap(), "layout"])
        .ok();
    let layout: Value = serde_json::from_str(&migdra(dir, &["layout", "-o", "json"])).unwrap();
    let uuids: Vec<&str> = layout["gpus"].as_array().unwrap().iter().map(|g| g["uuid"].as_str().unwrap()).collect();
    let listed = [5, 4, 3, 2, 0];
    let map: String = listed.iter().enumerate().map(|(k, &i)| format!("{}: {k}\n", uuids[i])).collect();
    std::fs::write(dir.join("map.yaml"), map).unwrap();
    let m = dir.join("map.yaml");
    let flags = ["--mig-mode-override", "1=static", "--shards-per-gpu", "4", "--slurm-index-map", m.to_str().unwrap()];
    let (cluster, conf) = hybrid_node(dir, &host, &flags);
    assert_eq!(conf["gres"], "gpu:h100:5,shard:20");
    assert!(conf["gpus"][1]["leftOut"].as_str().unwrap().starts_with("in static MIG mode"), "{}", conf["gpus"][1]);
    let node = cluster.scontrol(&["show", "node", &host]);
    assert!(node.contains("Gres=gpu:h100:5,shard:h100:20"), "{node}");
    let mut want: Vec<(Option<u64>, u64)> = vec![(None, 8); 6];
    for (k, &i) in listed.iter().enumerate() {
        want[i] = (Some(k as u64), 4);
    }
    let (map_flag, none) = (["--slurm-index-map", m.to_str().unwrap()], [] as [&str; 0]);
    for (extra, source) in [(&map_flag[..], "admin-map"), (&none[..], "slurmd")] {
        let mut args = vec!["--slurmd", slurmd.as_str(), "--mig-mode-override", "1=static"];
        args.extend(extra);
        let (got, warnings, per_gpu) = slurm_view(dir, &cluster, &host, &args);
        assert_eq!(got, source);
        assert!(warnings.is_empty(), "{source}: slurmd agrees with the map: {warnings:?}");
        let indexes: Vec<Option<u64>> = per_gpu.iter().map(|g| g.0).collect();
        assert_eq!(indexes, want.iter().map(|w| w.0).collect::<Vec<_>>(), "{source}");
        for &i in &listed {
            assert_eq!(per_gpu[i].1, 4, "{source}: shards of NVML {i}");
        }
        println!("{source}, static NVML 1: (Slurm index, shards) by NVML index {per_gpu:?}");
    }
    let jobs: Vec<String> = (0..5).map(|i| cluster.submit(&format!("g{i}"), "gpu:1")).collect();
    cluster.wait_for(
        |c| jobs.iter().all(|id| c.scontrol(&["show", "job", id]).contains("JobState=RUNNING")),
        "five GPU jobs RUNNING",
    );
    let idx: BTreeSet<u32> = jobs.iter().map(|id| cluster.job_index(id)).collect();
    assert_eq!(idx, (0..5).collect::<BTreeSet<_>>(), "Slurm schedules five GPUs, not the static one");
}

/// Bad Slurm files never stop the plugin: it publishes with the next source, and `status` and the
/// slices say which source decided and why the others did not.
#[test]
fn bad_slurm_files_fall_back_and_say_so() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let sim = dir.join("sim.json");
    support::command::migdra()
        .args(["--sim", "h100-80gb:2", "--sim-state", sim.to_str().unwrap(), "layout"])
        .output()
        .unwrap();
    let layout: Value = serde_json::from_str(&migdra(dir, &["layout", "-o", "json"])).unwrap();
    let minors: Vec<u64> = layout["gpus"].as_array().unwrap().iter().map(|g| g["minor"].as_u64().unwrap()).collect();
    let uuid0 = layout["gpus"][0]["uuid"].as_str().unwrap().to_string();
    std::fs::write(dir.join("slurm.conf"), "ClusterName=x\nNodeName=n1 CPUs=4 Gres=gpu:2,shard:6\n").unwrap();
    let conf = dir.join("slurm.conf");
    let base = ["--slurm-conf", conf.to_str().unwrap(), "--slurm-node-name", "n1", "--slurmd", "none"];
    let status = |extra: &[&str]| -> (Value, String) {
        let mut args = vec!["status", "-o", "json"];
        args.extend(base);
        args.extend(extra);
        let json: Value = serde_json::from_str(&migdra(dir, &args)).unwrap();
        let mut args = vec!["status"];
        args.extend(base);
        args.extend(extra);
        (json, migdra(dir, &args))
    };

    // A good gres.conf, GPUs listed in reverse minor order: gres.conf decides, 3 shards each.
    let (a, b) = (minors[0].max(minors[1]), minors[0].min(minors[1]));
    std::fs::write(dir.join("gres.conf"), format!("Name=gpu File=/dev/nvidia{a}\nName=gpu File=/dev/nvidia{b}\n"))
        .unwrap();
    let (json, table) = status(&[]);
    assert_eq!(json["slurm"]["source"], "gres.conf");
    for g in json["gpus"].as_array().unwrap() {
        let want = if g["minor"] == a { 0 } else { 1 };
        assert_eq!((g["slurmGpuIndex"].clone(), g["slurmShards"].clone()), (json!(want), json!(3)), "{g}");
    }
    assert!(table.contains("Slurm index: gres.conf"), "{table}");

    // gres.conf with a range that does not expand: NVML order, and the reason with file and line.
    let gres = dir.join("gres.conf");
    std::fs::write(&gres, format!("# bad\nName=gpu File=/dev/nvidia[{b}-{a}\n")).unwrap();
    let (json, table) = status(&[]);
    assert_eq!(json["slurm"]["source"], "nvml");
    let warning = format!("warning: gres.conf unusable: {}:2: File=/dev/nvidia[{b}-{a}:", gres.display());
    assert!(table.contains(&warning) && table.contains("falling back to nvml"), "{table}");
    // The plugin still publishes, saying where the index came from.
    let mut args = vec!["slices", "-o", "json"];
    args.extend(base);
    let slices = migdra(dir, &args);
    assert!(
        slices.contains("\"slurmGpuIndexSource\": {\n") && slices.contains("\"string\": \"nvml\""),
        "source attribute"
    );

    // A map with a duplicate index is not a bad file but a contradiction: refused (exit 2).
    std::fs::write(&gres, format!("Name=gpu File=/dev/nvidia{a}\nName=gpu File=/dev/nvidia{b}\n")).unwrap();
    let map = dir.join("map.yaml");
    std::fs::write(&map, format!("{uuid0}: 4\n\"{}\": 4\n", layout["gpus"][1]["pci_bus_id"].as_str().unwrap()))
        .unwrap();
    let mut args = vec!["status", "--slurm-index-map", map.to_str().unwrap()];
    args.extend(base);
    let out = support::command::migdra()
        .args(["--sim-state", sim.to_str().unwrap(), "--state-dir", dir.join("state").to_str().unwrap()])
        .args(&args)
        .run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("{}: GPU {uuid0} (line 1) and GPU", map.display()))
            && err.contains("both have Slurm index 4"),
        "{err}"
    );
    // A good map wins, and its disagreement with gres.conf is a loud conflict.
    std::fs::write(&map, format!("{uuid0}: 7\n\"{}\": 6\n", layout["gpus"][1]["pci_bus_id"].as_str().unwrap()))
        .unwrap();
    let (json, table) = status(&["--slurm-index-map", map.to_str().unwrap()]);
    assert_eq!(json["slurm"]["source"], "admin-map");
    assert_eq!(json["gpus"][0]["slurmGpuIndex"], 7);
    assert!(table.contains("warning: CONFLICT: admin-map gives GPU"), "{table}");
}

/// What a job holds, as each release prints it: lines of `scontrol show job -d` and answers of
/// slurmrestd's `GET /slurm/v0.0.44/resources/{job_id}`, copied from real runs of Debian's 22.05.8
/// and 26.05.5 on two GPUs of 8 shards each.
#[test]
fn job_gres_of_both_releases_parse() {
    let scontrol = [
        // 22.05.8
        ("Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:8(IDX:0)", vec![0]),
        ("Nodes=vm CPU_IDs=1 Mem=0 GRES=shard:5(IDX:1)", vec![1]),
        ("Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:h100:2(IDX:0-1)", vec![0, 1]),
        // 26.05.5: gpu as before; shard as this job's shards of each GPU, in index order
        ("Nodes=vm CPU_IDs=3 Mem=0 GRES=gpu:h100:1(IDX:1)", vec![1]),
        ("Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:3(3/8,0/8)", vec![0]),
        ("Nodes=vm CPU_IDs=1 Mem=0 GRES=shard:5(0/8,5/8)", vec![1]),
        ("Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:h100:2(IDX:0-1)", vec![0, 1]),
    ];
    for (line, want) in scontrol {
        let text = format!("JobId=7 JobName=x\n   JOB_GRES=shard:3\n     {line}\n");
        assert_eq!(slurm::job_gpus(&text), Ok(want), "{line}");
    }
    let err = slurm::job_gpus("   JOB_GRES=shard:3\n     Nodes=vm GRES=shard:3(3/x)\n").unwrap_err();
    assert!(err.contains("3/x is neither IDX:k nor used/total"), "{err}");
    assert!(slurm::job_gpus("JobState=PENDING Reason=Resources").is_err());

    let rest = |gres: Value| json!({"nodes": [{"node": "vm", "sockets_per_node": 32, "gres": gres}], "errors": []});
    let shard_on_1 = rest(json!([{"name": "shard", "type": "", "count": 5, "index": "1"}]));
    assert_eq!(slurm::rest_gpus(&shard_on_1), Ok(vec![1]));
    let two = rest(json!([{"name": "gpu", "type": "h100", "count": 2, "index": "0-1"}]));
    assert_eq!(slurm::rest_gpus(&two), Ok(vec![0, 1]));
    // A count-only GRES (no File=) has no index: the bridge cannot pin a claim to a GPU.
    let count_only = rest(json!([{"name": "gpu", "type": "", "count": 1}]));
    let err = slurm::rest_gpus(&count_only).unwrap_err();
    assert!(err.contains("has no index"), "{err}");
}

/// GRES without `File=` (count-only, slurm-bridge issue 33) on the real 26.05. slurm-bridge's way
/// to add a Kubernetes node without slurmd, an External dynamic node (`POST new/node/`), is
/// refused without a file per GPU; with the fake files the bridge writes, the GPUs its external
/// jobs get are numbered in `GET resources/{job_id}`, one after the other. On a node with slurmd,
/// count-only gres.conf records are dropped (`slurmd -G` lists no GPU; the node would register
/// with none), so migdra falls back with a warning; migdra's docs ask for File-backed records.
#[test]
fn count_only_gres_and_the_bridges_external_node() {
    if !slurm::required() {
        return;
    }
    if !slurm::has_bridge_api() {
        println!("Slurm {}: no External dynamic nodes or slurmrestd v0.0.44 to check", slurm::version());
        return;
    }
    let tmp = tempfile::Builder::new().prefix("migdra-slurm-count").tempdir_in("/tmp").unwrap();
    let dir = tmp.path();
    support::command::migdra()
        .args(["--sim", "h100-80gb:2", "--sim-state", dir.join("sim.json").to_str().unwrap(), "layout"])
        .ok();
    let host = slurm::host();
    let dev = dir.join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    let mut files = String::from("AutoDetect=off\n");
    for m in 0..2 {
        let path = dev.join(format!("nvidia{m}"));
        slurm::run("mknod", &[path.to_str().unwrap(), "c", "195", &m.to_string()], Path::new("/dev/null"));
        files += &format!("NodeName={host} Name=gpu Type=h100 File={}\n", path.display());
    }
    std::fs::write(dir.join("gres.conf"), files).unwrap();
    let cluster = Slurm::start(dir, "gpu:h100:2");

    // The bridge's External node: refused without a file per GPU; with the fake files the bridge
    // writes (`file=gpu-0`...), its jobs get GPU indexes, 0 then 1.
    let bare = "NodeName=k8s-bare CPUs=4 RealMemory=1000 State=External Gres=gpu:2";
    let err = cluster.rest_call("POST", "new/node/", Some(&json!({"node_conf": bare}))).unwrap_err();
    assert!(err.contains("Failure to create node"), "{err}");
    // slurmctld resolves the node's name when a job starts there, retrying for 10 s when nothing
    // resolves it (a slow resolver makes that minutes, past slurmrestd's and curl's timeouts: a
    // flaky test). So this node gets an address that answers at once, a closed loopback port:
    // what is tested here is the numbering, not name resolution.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let node_conf = format!(
        "NodeName=k8s-only NodeAddr=127.0.0.1 Port={closed} CPUs=4 RealMemory=1000 State=External Gres=gpu:2 \
         GresConf=\"count=2,name=gpu,file=gpu-0,file=gpu-1\""
    );
    cluster.rest_call("POST", "new/node/", Some(&json!({"node_conf": node_conf}))).unwrap();
    let shown = cluster.scontrol(&["show", "node", "k8s-only"]);
    assert!(shown.contains("EXTERNAL") && shown.contains("Gres=gpu:2"), "{shown}");
    let jobs: Vec<String> = (0..2).map(|i| cluster.reserve_on("k8s-only", &format!("team-a/p{i}"), "gpu:1")).collect();
    let mut got = Vec::new();
    for job in &jobs {
        cluster.wait_for(|c| c.job_state(job) == "RUNNING", "the placeholder RUNNING");
        let rest = cluster.rest_index(job).unwrap();
        assert_eq!(rest, [cluster.job_index(job)], "slurmrestd and scontrol on job {job}");
        got.extend(rest);
    }
    assert_eq!(got, [0, 1], "External node: GPU indexes of its jobs");
    println!("External node {node_conf:?}: external jobs {jobs:?} got GPU indexes {got:?}");
    for job in &jobs {
        cluster.release(job);
    }

    // Count-only: slurmd ignores the records; migdra says so and does not use it.
    std::fs::write(dir.join("gres.conf"), "AutoDetect=off\nName=gpu Type=h100 Count=2\n").unwrap();
    let out = Command::new(slurm::bin("slurmd"))
        .args(["-G", "-f", cluster.conf.to_str().unwrap(), "-N", &host])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("Ignoring file-less GPU gpu:h100") && !text.contains("Gres Name=gpu"), "{text}");
    let slurmd = slurm::bin("slurmd").display().to_string();
    let status = against(dir, "status", &cluster, &host, &slurmd);
    let notes = status["slurm"]["notes"].to_string();
    assert_ne!(status["slurm"]["source"], "slurmd", "{notes}");
    assert!(notes.contains("slurmd unusable") && notes.contains("lists no gpu GRES"), "{notes}");
    println!("count-only gres.conf: slurmd -G lists no GPU; migdra: source {}, {notes}", status["slurm"]["source"]);
}
