//! `migdra demo`: a day on a simulated node, end to end, in a few seconds.
//!
//! It starts the real daemon (`migdra serve`, as a child process) on simulated GPUs in a
//! temporary directory and plays the kubelet over the real sockets: registration first, then
//! notebooks of different sizes arriving and leaving, a 7g job that waits until a GPU empties, a
//! whole-GPU job on a GPU with MIG off, and a placement reused. A tiny scheduler picks, like
//! kube-scheduler, the first published device that fits the shared counters.

use super::{CliError, CliResult, layout};
use crate::claims::ClaimRef;
use crate::gpu::GpuBackend;
use crate::gpu::sim::{SimBackend, SimSpec};
use crate::kubelet::client::{TestKubelet, Version};
use crate::mig::counters::{self, Counters};
use crate::mig::devices::{Device, GpuIdentity, GpuMode, gpu_devices};
use crate::prepare::status_data;
use crate::slurm::{GpuSlurm, Source};
use crate::state::CheckpointStore;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DRIVER: &str = "mig.slinky.slurm.net";
const NODE: &str = "demo-node";
/// Two H100s with MIG on, one A100 with MIG off.
const NODE_SPEC: &str = "h100-80gb:2,a100-40gb:1:mig-off";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// No pauses between steps
    #[arg(long)]
    pub fast: bool,
    /// Keep the temporary directory (daemon log, checkpoint, CDI specs) and print its path
    #[arg(long)]
    pub keep: bool,
    /// Run the daemon on the NVML backend, loading this fake libnvidia-ml (hack/fake-nvml) that
    /// serves the simulated GPUs: the code path of a real GPU node, end to end
    #[arg(long, value_name = "LIB", hide = true)]
    pub fake_nvml: Option<PathBuf>,
}

/// What happens during the day: (who, profile or "gpu" for a whole GPU, arrives or leaves).
enum Event {
    Arrive { who: &'static str, what: &'static str, why: &'static str },
    Leave { who: &'static str },
}

const DAY: &[Event] = &[
    Event::Arrive { who: "alice", what: "1g.10gb", why: "opens a notebook" },
    Event::Arrive { who: "bob", what: "2g.20gb", why: "starts a small inference server" },
    Event::Arrive { who: "carol", what: "3g.40gb", why: "fine-tunes a model" },
    Event::Arrive { who: "dave", what: "1g.20gb", why: "opens a notebook with more memory" },
    Event::Arrive { who: "erin", what: "7g.80gb", why: "needs a whole H100 worth of MIG" },
    Event::Arrive { who: "frank", what: "gpu", why: "trains on a whole GPU" },
    Event::Leave { who: "dave" },
    Event::Leave { who: "alice" },
    Event::Arrive { who: "greg", what: "1g.10gb", why: "opens a notebook where alice was" },
    Event::Leave { who: "bob" },
    Event::Leave { who: "carol" },
    Event::Leave { who: "erin" },
    Event::Leave { who: "frank" },
    Event::Leave { who: "greg" },
];

/// The daemon child; killed if the demo fails half-way.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Demo<'a> {
    out: &'a mut dyn Write,
    dir: PathBuf,
    sim: SimBackend,
    kubelet: TestKubelet,
    runtime: tokio::runtime::Runtime,
    /// who → (claim UID, device)
    running: BTreeMap<&'static str, (String, String)>,
    waiting: Vec<(&'static str, &'static str)>,
    pause: Duration,
    clock: u32,
}

pub fn run(args: &Args, out: &mut dyn Write) -> CliResult {
    let tmp = std::env::temp_dir().join(format!("migdra-demo-{}", std::process::id()));
    std::fs::create_dir_all(tmp.join("claims"))
        .map_err(|e| CliError::Failed(format!("demo: {}: {e}", tmp.display())))?;
    let started = Instant::now();
    let result = day(args, &tmp, out);
    if args.keep {
        writeln!(out, "\nkept {} (daemon.log, state/, cdi/, claims/, gpus.json)", tmp.display())?;
    } else {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result?;
    writeln!(out, "\ndemo finished in {:.1} s", started.elapsed().as_secs_f64())?;
    Ok(())
}

fn day(args: &Args, dir: &Path, out: &mut dyn Write) -> CliResult {
    let fail = |e: String| CliError::Failed(format!("demo: {e}"));
    let spec = SimSpec::parse(NODE_SPEC)?;
    let state = dir.join("gpus.json");
    let sim = SimBackend::open(&state, Some(&spec))?;
    match &args.fake_nvml {
        Some(lib) => writeln!(
            out,
            "migdra demo: a day on node {NODE} with simulated GPUs ({NODE_SPEC}) behind the NVML backend and {}\n",
            lib.display()
        )?,
        None => writeln!(out, "migdra demo: a day on node {NODE} with simulated GPUs ({NODE_SPEC})\n")?,
    }

    let exe = std::env::current_exe().map_err(|e| fail(e.to_string()))?;
    let log = std::fs::File::create(dir.join("daemon.log")).map_err(|e| fail(e.to_string()))?;
    let started = Instant::now();
    let mut serve = Command::new(exe);
    serve.arg("serve");
    match &args.fake_nvml {
        // The fake library finds the hardware and keeps the driver's procfs tree where it is told.
        Some(lib) => {
            let procfs = dir.join("proc");
            serve
                .arg("--nvml-lib")
                .arg(lib)
                .arg("--procfs-root")
                .arg(&procfs)
                .env("FAKE_NVML_STATE", &state)
                .env("FAKE_NVML_PROCFS", &procfs)
                .env_remove("MIGDRA_SIM")
                .env_remove("MIGDRA_SIM_STATE");
        }
        None => {
            serve.arg("--sim-state").arg(&state);
        }
    }
    let child = serve
        .arg("--plugin-dir")
        .arg(dir.join("plugins").join(DRIVER))
        .arg("--registry-dir")
        .arg(dir.join("registry"))
        .arg("--cdi-dir")
        .arg(dir.join("cdi"))
        .arg("--claims-dir")
        .arg(dir.join("claims"))
        .args(["--node-name", NODE, "--grace", "5s"])
        // Simulated GPUs, also behind the fake NVML, have no device nodes to check.
        .args(["--host-root", "none"])
        .env_remove("POD_UID")
        .env_remove("MIGDRA_SIM_FAULTS")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| fail(format!("failed to start migdra serve: {e}")))?;
    let mut daemon = Daemon(child);
    let registration = dir.join("registry").join(format!("{DRIVER}-reg.sock"));
    while !registration.exists() {
        if started.elapsed() > Duration::from_secs(10) {
            return Err(fail(format!("the daemon did not create {} (see daemon.log)", registration.display())));
        }
        if let Ok(Some(status)) = daemon.0.try_wait() {
            let log = std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
            return Err(fail(format!("the daemon exited with {status}: {}", log.lines().last().unwrap_or(""))));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| fail(e.to_string()))?;
    // The socket file appears at bind(), a moment before the daemon listens; the kubelet's plugin
    // watcher retries a registration that fails, and so does the demo, until the same deadline.
    let kubelet = loop {
        match runtime.block_on(TestKubelet::register(&registration)) {
            Ok(k) => break k,
            Err(e) if started.elapsed() > Duration::from_secs(10) => return Err(fail(e)),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    writeln!(
        out,
        "kubelet: registered {} ({}) at {} after {} ms; it speaks {}",
        kubelet.info.name,
        kubelet.info.r#type,
        kubelet.info.endpoint,
        started.elapsed().as_millis(),
        kubelet.info.supported_versions.join(", ")
    )?;
    let mut demo = Demo {
        out,
        dir: dir.to_path_buf(),
        sim,
        kubelet,
        runtime,
        running: BTreeMap::new(),
        waiting: Vec::new(),
        pause: if args.fast { Duration::ZERO } else { Duration::from_millis(250) },
        clock: 9 * 60,
    };
    demo.picture()?;
    for event in DAY {
        demo.clock += 45;
        match event {
            Event::Arrive { who, what, why } => demo.arrive(who, what, why)?,
            Event::Leave { who } => demo.leave(who)?,
        }
    }
    writeln!(demo.out, "\nnode is empty again: {} MIG instances left", demo.instances()?)?;
    // SIGTERM, as the kubelet's pod shutdown would send.
    let pid = daemon.0.id();
    rustix::process::Pid::from_raw(pid as i32)
        .ok_or_else(|| fail(format!("the daemon has no valid pid ({pid})")))
        .and_then(|p| {
            rustix::process::kill_process(p, rustix::process::Signal::TERM)
                .map_err(|e| fail(format!("SIGTERM to the daemon (pid {pid}): {e}")))
        })?;
    let status = daemon.0.wait().map_err(|e| fail(e.to_string()))?;
    writeln!(demo.out, "daemon: SIGTERM → registration socket removed, exited with {status}")?;
    if !status.success() {
        return Err(fail(format!("the daemon exited with {status}")));
    }
    Ok(())
}

impl Demo<'_> {
    fn header(&mut self, text: &str) -> CliResult {
        std::thread::sleep(self.pause);
        writeln!(self.out, "\n── {:02}:{:02}  {text}", self.clock / 60, self.clock % 60)?;
        Ok(())
    }

    fn arrive(&mut self, who: &'static str, what: &'static str, why: &str) -> CliResult {
        self.header(&format!("{who} {why} ({what})"))?;
        if !self.try_start(who, what)? {
            writeln!(self.out, "   scheduler: no {what} fits anywhere now; {who} waits")?;
            self.waiting.push((who, what));
        }
        Ok(())
    }

    fn leave(&mut self, who: &'static str) -> CliResult {
        let Some((uid, device)) = self.running.remove(who) else { return Ok(()) };
        self.header(&format!("{who} is done"))?;
        let claim = claim_ref(&uid, who);
        let errors = self
            .runtime
            .block_on(self.kubelet.unprepare(Version::V1, &[claim]))
            .map_err(|e| CliError::Failed(e.to_string()))?;
        if let Some(e) = errors.values().find(|e| !e.is_empty()) {
            return Err(CliError::Failed(format!("demo: unprepare {who}: {e}")));
        }
        let _ = std::fs::remove_file(self.dir.join("claims").join(format!("{uid}.json")));
        writeln!(self.out, "   kubelet → NodeUnprepareResources: {device} released, instance destroyed")?;
        let waiting = std::mem::take(&mut self.waiting);
        let mut started_any = false;
        for (w, what) in waiting {
            if self.try_start(w, what)? {
                started_any = true;
            } else {
                self.waiting.push((w, what));
            }
        }
        if !started_any {
            self.picture()?;
        }
        Ok(())
    }

    /// Schedule, write the claim, prepare it through the kubelet API, and show what it got.
    fn try_start(&mut self, who: &'static str, what: &str) -> Result<bool, CliError> {
        let Some(device) = self.schedule(what)? else { return Ok(false) };
        let uid = format!("{:08x}-0000-4000-8000-{:012x}", self.clock, self.running.len() + self.waiting.len() + 1);
        write_claim(&self.dir.join("claims"), &uid, who, &device)?;
        writeln!(self.out, "   scheduler: first published device that fits: {device}")?;
        let claim = claim_ref(&uid, who);
        let prepared = self
            .runtime
            .block_on(self.kubelet.prepare(Version::V1, &[claim]))
            .map_err(|e| CliError::Failed(e.to_string()))?;
        let devices = prepared.get(&uid).cloned().unwrap_or_else(|| Err("no response".into()));
        let devices = devices.map_err(|e| CliError::Failed(format!("demo: prepare for {who}: {e}")))?;
        self.report(&uid, &devices.iter().flat_map(|d| d.cdi_ids.clone()).collect::<Vec<_>>())?;
        self.running.insert(who, (uid, device));
        self.picture()?;
        Ok(true)
    }

    /// What the claim got: from the checkpoint, as the claim status will carry it.
    fn report(&mut self, uid: &str, cdi_ids: &[String]) -> CliResult {
        let cp = CheckpointStore::new(&self.dir.join("plugins").join(DRIVER))
            .read()
            .map_err(|e| CliError::Failed(e.to_string()))?;
        let Some(rec) = cp.claims.get(uid) else { return Ok(()) };
        for d in &rec.devices {
            let model = self.sim.model(&d.gpu_uuid)?;
            // The demo's node has no Slurm configuration: NVML order, as the daemon decides too.
            let slurm = GpuSlurm {
                index: Some(d.gpu_index),
                source: Source::Nvml,
                shards: model.memory_slices,
                memory_slices: model.memory_slices,
                migs: Vec::new(),
            };
            let data = status_data(d, &slurm);
            let what = match (&data.mig_uuid, &data.profile) {
                (Some(u), Some(p)) => format!(
                    "{p} {u} (GI {}, CI {})",
                    data.gpu_instance_id.unwrap_or(0),
                    data.compute_instance_id.unwrap_or(0)
                ),
                _ => format!("whole GPU {}", data.parent_uuid),
            };
            writeln!(self.out, "   kubelet → NodePrepareResources: {what}")?;
            writeln!(
                self.out,
                "   for slurm-bridge: parent GPU {} (minor {}), Slurm GPU index {} (from {}), {} shard(s)",
                data.parent_pci_bus_id,
                data.parent_minor,
                data.slurm_gpu_index.unwrap_or(d.gpu_index),
                data.slurm_gpu_index_source,
                data.slurm_shards
            )?;
        }
        for id in cdi_ids {
            writeln!(self.out, "   CDI: {id}")?;
        }
        Ok(())
    }

    /// First fit over the published devices of every GPU, in published order, against the
    /// shared counters of what is allocated: what kube-scheduler's allocator does.
    fn schedule(&self, what: &str) -> Result<Option<String>, CliError> {
        let allocated: Vec<&String> = self.running.values().map(|(_, d)| d).collect();
        for gpu in self.sim.gpus()? {
            let model = self.sim.model(&gpu.uuid)?;
            let mode = if gpu.mig_enabled { GpuMode::Dynamic } else { GpuMode::Full };
            let identity = GpuIdentity {
                index: gpu.index,
                minor: gpu.minor,
                uuid: gpu.uuid.clone(),
                pci_bus_id: gpu.pci_bus_id.clone(),
                product_name: gpu.product_name.clone(),
                memory_mib: gpu.memory_mib,
                driver_version: gpu.driver_version.clone(),
                cuda_compute_capability: gpu.cuda_compute_capability,
                slurm_index: Some(gpu.index),
                slurm_index_source: Source::Nvml.as_str().into(),
                shards_per_gpu: model.memory_slices,
                topology: gpu.topology.clone(),
            };
            let devices: Vec<Device> = gpu_devices(
                &model,
                &identity,
                mode,
                false,
                &[],
                crate::mig::naming::NameStyle::Minor,
                &crate::mig::allowlist::Allowlist::all(),
            );
            let taken: Vec<&Device> = devices.iter().filter(|d| allocated.contains(&&d.name)).collect();
            if mode == GpuMode::Full {
                if what == "gpu" && taken.is_empty() {
                    return Ok(Some(devices[0].name.clone()));
                }
                continue;
            }
            let capacity = counters::CounterSet::for_model(&model).capacity().clone();
            let used: Vec<&Counters> = taken.iter().filter_map(|d| d.consumes.as_ref().map(|c| &c.1)).collect();
            for d in &devices {
                let profile = d.attributes.get("profile");
                if profile != Some(&crate::mig::devices::AttributeValue::String(what.to_string())) {
                    continue;
                }
                let Some((_, mine)) = &d.consumes else { continue };
                if !allocated.contains(&&d.name) && counters::fits(&capacity, used.iter().copied().chain([mine])) {
                    return Ok(Some(d.name.clone()));
                }
            }
        }
        Ok(None)
    }

    /// One line per GPU: its memory slices, a letter per instance, and who holds each.
    fn picture(&mut self) -> CliResult {
        let view = layout::read(&self.sim)?;
        let owner = |device: &str| self.running.iter().find(|(_, (_, d))| d == device).map(|(who, _)| *who);
        let mut lines = Vec::new();
        for g in &view.gpus {
            let model = g.gpu.product_name.replace("NVIDIA ", "");
            let head = format!("GPU {} (minor {}) {model:<18}", g.gpu.index, g.gpu.minor);
            if !g.gpu.mig_enabled {
                let whole = format!("gpu-{}", g.gpu.minor);
                let holder = owner(&whole).map_or("free".to_string(), |w| format!("whole GPU: {w}"));
                lines.push(format!("{head} MIG off, {holder}"));
                continue;
            }
            let mut cells = vec!['.'; g.memory_slices as usize];
            let mut legend = Vec::new();
            for inst in &g.instances {
                // Each person keeps one letter all day: their initial.
                let who = owner(&inst.device).unwrap_or("?");
                let letter = who.chars().next().map_or('?', |c| c.to_ascii_uppercase());
                for s in inst.placement.start..inst.placement.start + inst.placement.size {
                    if let Some(c) = cells.get_mut(s as usize) {
                        *c = letter;
                    }
                }
                legend.push(format!("{letter}={who} {}", inst.profile));
            }
            let cells: Vec<String> = cells.iter().map(char::to_string).collect();
            lines.push(format!("{head} [{}]  {}", cells.join(" "), legend.join("  ")));
        }
        for line in lines {
            writeln!(self.out, "   {}", line.trim_end())?;
        }
        Ok(())
    }

    fn instances(&self) -> Result<usize, CliError> {
        let mut n = 0;
        for g in self.sim.gpus()?.into_iter().filter(|g| g.mig_enabled) {
            n += self.sim.gpu_instances(&g.uuid)?.len();
        }
        Ok(n)
    }
}

fn claim_ref(uid: &str, who: &str) -> ClaimRef {
    ClaimRef { uid: uid.to_string(), namespace: "notebooks".into(), name: format!("{who}-gpu") }
}

/// The ResourceClaim the scheduler would have allocated, as the API server returns it.
fn write_claim(dir: &Path, uid: &str, who: &str, device: &str) -> CliResult {
    let claim = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": format!("{who}-gpu"), "namespace": "notebooks", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
        ]}}}
    });
    std::fs::write(dir.join(format!("{uid}.json")), claim.to_string())
        .map_err(|e| CliError::Failed(format!("demo: {e}")))
}
