//! A real Slurm on this machine: Debian's slurmctld and slurmd for one node on localhost (as root,
//! no systemd: proctrack/linuxproc, task/none, select/cons_tres), with fake `/dev/nvidiaN`
//! character devices for the simulated GPUs. `hack/slurm-deps.sh` installs it and starts munged.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const SBIN: &str = "/usr/sbin";

/// Whether Slurm can run here; `Err` says what is missing.
pub fn ready() -> Result<(), String> {
    for bin in ["slurmctld", "slurmd", "munged"] {
        if !Path::new(SBIN).join(bin).exists() {
            return Err(format!("{SBIN}/{bin} is missing (bash hack/slurm-deps.sh installs Slurm)"));
        }
    }
    let munge = Command::new("sh").args(["-c", "munge -n | unmunge >/dev/null"]).status();
    if !munge.is_ok_and(|s| s.success()) {
        return Err("munged is not running (bash hack/slurm-deps.sh starts it)".into());
    }
    if !Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n")) {
        return Err("not root: slurmd runs as root here and the fake GPUs need mknod".into());
    }
    Ok(())
}

/// `Ok` when Slurm can run; otherwise the test passes with a note, or fails under
/// `MIGDRA_REQUIRE_SLURM=1` (as .ci/run sets it).
#[allow(clippy::print_stdout)]
pub fn required() -> bool {
    match ready() {
        Ok(()) => true,
        Err(why) => {
            assert!(std::env::var("MIGDRA_REQUIRE_SLURM").as_deref() != Ok("1"), "Slurm is required here: {why}");
            println!("SKIPPED (set MIGDRA_REQUIRE_SLURM=1 to fail instead): {why}");
            false
        }
    }
}

/// This machine's host name, which slurm.conf must name.
pub fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string()
}

/// Run a Slurm client command that must succeed; its stdout.
pub fn run(cmd: &str, args: &[&str], conf: &Path) -> String {
    let out = Command::new(cmd).args(args).env("SLURM_CONF", conf).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Slurm configured from `migdra slurm-conf -o json`'s output `conf`: a character device for each
/// GPU record's file, gres.conf as printed, and the node's `Gres=`; started in `dir`.
pub fn from_slurm_conf(dir: &Path, conf: &serde_json::Value) -> Slurm {
    for g in conf["gpus"].as_array().expect("slurm-conf's gpus").iter().filter(|g| g["slurmGpuIndex"].is_u64()) {
        let file = Path::new(g["file"].as_str().unwrap());
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        if !file.exists() {
            run("mknod", &[file.to_str().unwrap(), "c", "195", &g["minor"].to_string()], Path::new("/dev/null"));
        }
    }
    let lines: Vec<&str> = conf["gresConf"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    std::fs::write(dir.join("gres.conf"), format!("{}\n", lines.join("\n"))).unwrap();
    Slurm::start(dir, conf["gres"].as_str().unwrap())
}

/// One Slurm at a time in a test process: its ports come from the process ID.
static ONE_SLURM: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// slurmctld and slurmd in the foreground, killed on drop.
pub struct Slurm {
    pub conf: PathBuf,
    daemons: Vec<(&'static str, Child)>,
    dir: PathBuf,
    host: String,
    _one: std::sync::MutexGuard<'static, ()>,
}

impl Drop for Slurm {
    #[allow(clippy::print_stdout)] // the logs of a failing test
    fn drop(&mut self) {
        let _ = Command::new("scancel").arg("--full").arg("-u").arg("root").env("SLURM_CONF", &self.conf).status();
        // Let slurmd end the jobs' steps before it goes, so no job outlives the test.
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            let jobs = self.scontrol(&["show", "jobs"]);
            if !jobs.contains("JobState=RUNNING") && !jobs.contains("JobState=COMPLETING") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for (_, d) in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
        for log in ["slurmctld.log", "slurmd.log"] {
            if std::thread::panicking()
                && let Ok(text) = std::fs::read_to_string(self.dir.join(log))
            {
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                println!("--- {log} (last lines, newest first)\n{}", tail.join("\n"));
            }
        }
    }
}

impl Slurm {
    /// Write slurm.conf (this node with `gres`, e.g. `gpu:h100:2,shard:16`) into `dir`, beside the
    /// caller's gres.conf, start slurmctld and slurmd, and wait until the node is IDLE.
    pub fn start(dir: &Path, gres: &str) -> Self {
        let one = ONE_SLURM.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let host = host();
        let conf = dir.join("slurm.conf");
        let port = 17000 + (std::process::id() % 2000) * 2;
        for sub in ["ctld", "d"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let d = dir.display();
        std::fs::write(
            &conf,
            format!(
                "ClusterName=migdra\nSlurmctldHost={host}(127.0.0.1)\nSlurmUser=root\nSlurmdUser=root\n\
                 SlurmctldPort={port}\nSlurmdPort={}\nAuthType=auth/munge\nStateSaveLocation={d}/ctld\n\
                 SlurmdSpoolDir={d}/d\nSlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
                 SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\nProctrackType=proctrack/linuxproc\n\
                 TaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
                 MpiDefault=none\nSwitchType=switch/none\nReturnToService=2\nSelectType=select/cons_tres\n\
                 SelectTypeParameters=CR_Core\nSchedulerParameters=bf_interval=1\nGresTypes=gpu,shard\n\
                 SlurmdParameters=config_overrides\n\
                 NodeName={host} NodeAddr=127.0.0.1 CPUs=32 RealMemory=20000 Gres={gres} State=UNKNOWN\n\
                 PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
                port + 1
            ),
        )
        .unwrap();
        let mut slurm = Self { conf, daemons: Vec::new(), dir: dir.to_path_buf(), host, _one: one };
        slurm.spawn("slurmctld");
        std::thread::sleep(Duration::from_millis(500));
        slurm.spawn("slurmd");
        let host = slurm.host.clone();
        slurm.wait_for(|s| s.scontrol(&["show", "node", &host]).contains("State=IDLE"), "node IDLE");
        slurm
    }

    fn spawn(&mut self, daemon: &'static str) {
        let args: Vec<&str> = match daemon {
            "slurmctld" => vec!["-D", "-i"],
            _ => vec!["-D", "-N", &self.host],
        };
        let child = Command::new(Path::new(SBIN).join(daemon))
            .args(&args)
            .arg("-f")
            .arg(&self.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.daemons.push((daemon, child));
    }

    /// Stop slurmctld as `systemctl restart` does (SIGTERM: it saves its state and exits), and
    /// start it again on that state; waits until it answers. (A SIGKILL right after a submission
    /// loses the jobs slurmctld had not saved yet.)
    pub fn restart_slurmctld(&mut self) {
        let i = self.daemons.iter().position(|(n, _)| *n == "slurmctld").expect("slurmctld runs");
        let (_, mut old) = self.daemons.remove(i);
        let _ = Command::new("kill").arg("-TERM").arg(old.id().to_string()).status();
        let _ = old.wait();
        let child = Command::new(Path::new(SBIN).join("slurmctld"))
            .args(["-D", "-i", "-f"])
            .arg(&self.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.daemons.push(("slurmctld", child));
        let host = self.host.clone();
        self.wait_for(|s| s.scontrol(&["show", "node", &host]).contains("State="), "slurmctld to answer");
    }

    pub fn scontrol(&self, args: &[&str]) -> String {
        Command::new("scontrol")
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Poll `ok` every 200 ms for up to 60 s.
    pub fn wait_for(&self, ok: impl Fn(&Self) -> bool, what: &str) {
        let start = Instant::now();
        while !ok(self) {
            assert!(start.elapsed() < Duration::from_secs(60), "waited 60 s for {what}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Submit a job holding `gres` (`shard:2`, `gpu:1`) and return its ID.
    pub fn submit(&self, name: &str, gres: &str) -> String {
        run(
            "sbatch",
            &["--parsable", "-J", name, "-o", "/dev/null", &format!("--gres={gres}"), "--wrap", "sleep 600"],
            &self.conf,
        )
        .trim()
        .to_string()
    }

    /// `JobState=` of a job.
    pub fn job_state(&self, id: &str) -> String {
        let text = self.scontrol(&["show", "job", id]);
        text.split_whitespace().find_map(|w| w.strip_prefix("JobState=")).unwrap_or("GONE").to_string()
    }

    /// Wait until a job runs; its GPU index (`scontrol show job -d`: `GRES=shard:1(IDX:1)`).
    pub fn running_index(&self, id: &str) -> u32 {
        self.wait_for(|s| s.job_state(id) == "RUNNING", &format!("job {id} RUNNING"));
        self.job_index(id)
    }

    /// The GPU index of a running job.
    pub fn job_index(&self, id: &str) -> u32 {
        let text = self.scontrol(&["show", "job", "-d", id]);
        let at = text.find("(IDX:").unwrap_or_else(|| panic!("job {id} has no IDX: {text}")) + 5;
        let idx = &text[at..at + text[at..].find(')').unwrap()];
        idx.parse().unwrap_or_else(|_| panic!("job {id}: IDX {idx} is not one index"))
    }

    /// Hold a pending job (`scontrol hold`), or release it again.
    pub fn hold(&self, id: &str, hold: bool) {
        run("scontrol", &[if hold { "hold" } else { "release" }, id], &self.conf);
    }

    /// Cancel a job, as slurm-bridge releases its placeholder, and wait until it is gone.
    pub fn cancel(&self, id: &str) {
        run("scancel", &[id], &self.conf);
        self.wait_for(|s| !matches!(s.job_state(id).as_str(), "RUNNING" | "COMPLETING" | "PENDING"), "job cancelled");
    }
}
