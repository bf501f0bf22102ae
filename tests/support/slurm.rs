//! A real Slurm on this machine: slurmctld and slurmd for one node on localhost (as root, no
//! systemd: proctrack/linuxproc, task/none, select/cons_tres), with fake `/dev/nvidiaN` character
//! devices for the simulated GPUs. Two releases: Debian 12's 22.05 (`hack/slurm-deps.sh` installs
//! it and starts munged) and, when `MIGDRA_SLURM_BIN` names the wrappers `hack/slurm-2605.sh`
//! makes, Debian unstable's 26.05 in a chroot, with slurmrestd for the bridge's REST calls.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const SBIN: &str = "/usr/sbin";

/// The chroot's unprivileged user (`hack/slurm-2605.sh`) that is 26.05's SlurmUser here and runs
/// slurmrestd: slurm-bridge submits as SlurmUser, the only user without slurmdbd that may set a
/// job's AdminComment.
pub const BRIDGE_USER: &str = "bridge";

/// The wrappers of `hack/slurm-2605.sh` (Slurm 26.05 in a chroot), or `None`: Debian 12's Slurm.
fn wrappers() -> Option<PathBuf> {
    std::env::var_os("MIGDRA_SLURM_BIN").filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// `program` run in the release under test: inside 26.05's chroot, else on this machine.
fn in_release(program: &str) -> Command {
    match wrappers() {
        Some(dir) => {
            let mut cmd = Command::new(dir.join("run"));
            cmd.arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// `args` of a command run as [`BRIDGE_USER`] in the release under test.
fn as_bridge(args: &[&str]) -> Command {
    let mut cmd = in_release("setpriv");
    cmd.args(["--reuid", BRIDGE_USER, "--regid", BRIDGE_USER, "--init-groups"]).args(args);
    cmd
}

/// The bridge user's numeric ID, for the files of a daemon that runs as it.
fn bridge_uid() -> String {
    let out = in_release("id").args(["-u", BRIDGE_USER]).output().unwrap();
    assert!(out.status.success(), "no user {BRIDGE_USER} in this Slurm's system (hack/slurm-2605.sh adds it)");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A Slurm program of the release under test: a daemon (`slurmd`, `slurmctld`, `slurmrestd`,
/// `munged`) or a client (`sbatch`, `scontrol`, ...).
pub fn bin(cmd: &str) -> PathBuf {
    match wrappers() {
        Some(dir) => dir.join(cmd),
        None if matches!(cmd, "slurmctld" | "slurmd" | "slurmrestd" | "munged") => Path::new(SBIN).join(cmd),
        None => PathBuf::from(cmd),
    }
}

/// The release under test, as `slurmd -V` prints it (`26.05.5`, `22.05.8`).
pub fn version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        let out = Command::new(bin("slurmd")).arg("-V").output().map(|o| o.stdout).unwrap_or_default();
        String::from_utf8_lossy(&out).split_whitespace().last().unwrap_or("unknown").to_string()
    })
}

/// Whether the release has external jobs and slurmrestd v0.0.44 (Slurm 25.11 and later), which
/// is how slurm-bridge reserves capacity.
pub fn has_bridge_api() -> bool {
    let mut parts = version().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (25, 11)
}

/// Whether Slurm can run here; `Err` says what is missing.
pub fn ready() -> Result<(), String> {
    let how = match wrappers() {
        Some(_) => "bash hack/slurm-2605.sh makes it",
        None => "bash hack/slurm-deps.sh installs Slurm",
    };
    for daemon in ["slurmctld", "slurmd", "munged"] {
        let path = bin(daemon);
        if !path.exists() {
            return Err(format!("{} is missing ({how})", path.display()));
        }
    }
    let munge = Command::new(bin("munge")).arg("-n").stdout(Stdio::piped()).spawn().and_then(|mut m| {
        let stdout = m.stdout.take().expect("piped");
        let unmunge = Command::new(bin("unmunge")).stdin(stdout).stdout(Stdio::null()).stderr(Stdio::null()).status();
        m.wait()?;
        unmunge
    });
    if !munge.is_ok_and(|s| s.success()) {
        return Err(format!("munged is not running ({how} and starts it)"));
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
        Ok(()) => {
            let v = version();
            println!("Slurm {v} ({})", bin("slurmd").display());
            let tested = migdra::cli::tested::SLURM;
            assert!(
                tested.contains(&v),
                "Slurm {v} runs here, src/cli/tested.rs lists {tested:?}: update it and the docs"
            );
            true
        }
        Err(why) => {
            super::skip::skip(super::skip::SLURM, &format!("Slurm: {why}"));
            false
        }
    }
}

/// This machine's host name, which slurm.conf must name.
pub fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string()
}

/// Run a command that must succeed (a Slurm client: [`bin`]), with `SLURM_CONF=conf`; its stdout.
pub fn run(cmd: impl AsRef<std::ffi::OsStr>, args: &[&str], conf: &Path) -> String {
    let cmd = cmd.as_ref();
    let out = Command::new(cmd).args(args).env("SLURM_CONF", conf).output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} {args:?}: {}{}",
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
    /// slurmrestd's address (`http://127.0.0.1:PORT`) on a release with the bridge's API.
    pub rest_url: Option<String>,
    daemons: Vec<(&'static str, Child)>,
    dir: PathBuf,
    host: String,
    _one: std::sync::MutexGuard<'static, ()>,
}

impl Drop for Slurm {
    #[allow(clippy::print_stdout)] // the logs of a failing test
    fn drop(&mut self) {
        let _ = Command::new(bin("scancel")).args(["--full", "-p", "debug"]).env("SLURM_CONF", &self.conf).status();
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
        // Checked free now; Slurm binds them when it starts, a moment later.
        let (port, slurmd_port) = (super::controlplane::free_port(), super::controlplane::free_port());
        for sub in ["ctld", "d"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let d = dir.display();
        let slurm_user = if has_bridge_api() { BRIDGE_USER } else { "root" };
        // Room for slurm-bridge's External dynamic nodes (`POST new/node/`) in the partition.
        let (dynamic, nodes) = if has_bridge_api() { ("MaxNodeCount=8\n", "ALL") } else { ("", host.as_str()) };
        // What slurm-bridge's own client and jobs need (docs/facts/slurm-bridge.md §8): JWT as an
        // alternative authentication, with a key of SlurmUser's; MCS labels on demand (it submits
        // `mcs_label: kubernetes`); and its default partition, `slurm-bridge`.
        let bridge = if has_bridge_api() {
            format!(
                "AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key={d}/jwt.key\nMCSPlugin=mcs/label\n\
                 MCSParameters=ondemand,ondemandselect\n"
            )
        } else {
            String::new()
        };
        let bridge_partition =
            if has_bridge_api() { "PartitionName=slurm-bridge Nodes=ALL MaxTime=INFINITE State=UP\n" } else { "" };
        std::fs::write(
            &conf,
            format!(
                "ClusterName=migdra\nSlurmctldHost={host}(127.0.0.1)\nSlurmUser={slurm_user}\nSlurmdUser=root\n\
                 SlurmctldPort={port}\nSlurmdPort={}\nAuthType=auth/munge\nStateSaveLocation={d}/ctld\n\
                 SlurmdSpoolDir={d}/d\nSlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
                 SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\nProctrackType=proctrack/linuxproc\n\
                 TaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
                 AccountingStorageType=accounting_storage/none\n\
                 MpiDefault=none\nSwitchType=switch/none\nReturnToService=2\nSelectType=select/cons_tres\n\
                 SelectTypeParameters=CR_Core\nSchedulerParameters=bf_interval=1\nGresTypes=gpu,shard\n\
                 SlurmdParameters=config_overrides\n{dynamic}{bridge}\
                 NodeName={host} NodeAddr=127.0.0.1 CPUs=32 Sockets=4 CoresPerSocket=8 \
                 ThreadsPerCore=1 RealMemory=20000 Gres={gres} State=UNKNOWN\n\
                 PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP\n{bridge_partition}",
                slurmd_port
            ),
        )
        .unwrap();
        if wrappers().is_some() {
            // Slurm 26.05's slurmd needs a cgroup plugin unless told there is none; its chroot
            // has no systemd to delegate one.
            std::fs::write(dir.join("cgroup.conf"), "CgroupPlugin=disabled\n").unwrap();
        }
        if has_bridge_api() {
            // slurmctld runs as SlurmUser: its files are the bridge user's.
            let uid = bridge_uid();
            let key = dir.join("jwt.key");
            let mut random = [0u8; 32];
            std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut random).unwrap();
            std::fs::write(&key, random).unwrap();
            for path in [dir.join("ctld"), dir.join("slurmctld.log"), dir.join("slurmctld.pid"), key.clone()] {
                if !path.exists() {
                    std::fs::write(&path, "").unwrap();
                }
                run("chown", &[&uid, path.to_str().unwrap()], &conf);
            }
            run("chmod", &["0600", key.to_str().unwrap()], &conf);
        }
        let mut slurm = Self { conf, rest_url: None, daemons: Vec::new(), dir: dir.to_path_buf(), host, _one: one };
        slurm.spawn("slurmctld");
        std::thread::sleep(Duration::from_millis(500));
        slurm.spawn("slurmd");
        let host = slurm.host.clone();
        slurm.wait_for(|s| s.scontrol(&["show", "node", &host]).contains("State=IDLE"), "node IDLE");
        if has_bridge_api() {
            slurm.start_slurmrestd();
        }
        slurm
    }

    /// slurmrestd v0.0.44 as slurm-bridge's client meets it: on TCP, `rest_auth/jwt`, every call
    /// with a token in `X-SLURM-USER-TOKEN` (`SLURM_JWT=daemon` in its environment, else it
    /// rejects each one). It runs as the bridge user, which slurmrestd allows only when that user
    /// is not SlurmUser, so it reads a copy of slurm.conf naming root; the token is SlurmUser's
    /// (`scontrol token username=bridge`): the bridge submits as SlurmUser, the only user without
    /// slurmdbd that may set a job's AdminComment.
    fn start_slurmrestd(&mut self) {
        let rest = self.dir.join("rest");
        std::fs::create_dir_all(&rest).unwrap();
        let text = std::fs::read_to_string(&self.conf).unwrap();
        std::fs::write(rest.join("slurm.conf"), text.replace(&format!("SlurmUser={BRIDGE_USER}"), "SlurmUser=root"))
            .unwrap();
        if self.dir.join("cgroup.conf").exists() {
            std::fs::copy(self.dir.join("cgroup.conf"), rest.join("cgroup.conf")).unwrap();
        }
        run("chown", &[&bridge_uid(), rest.to_str().unwrap()], &self.conf);
        let out = run(bin("scontrol"), &["token", &format!("username={BRIDGE_USER}"), "lifespan=86400"], &self.conf);
        let token = out.trim().strip_prefix("SLURM_JWT=").unwrap_or_else(|| panic!("scontrol token said {out:?}"));
        std::fs::write(self.token_file(), token).unwrap();
        let port = super::controlplane::free_port();
        let child = as_bridge(&["/usr/sbin/slurmrestd", "-s", "openapi/slurmctld", "-d", "v0.0.44"])
            .args(["-a", "rest_auth/jwt", &format!("127.0.0.1:{port}")])
            .env("SLURM_CONF", rest.join("slurm.conf"))
            .env("SLURM_JWT", "daemon")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("slurmrestd.log")).unwrap())
            .spawn()
            .unwrap();
        self.daemons.push(("slurmrestd", child));
        self.rest_url = Some(format!("http://127.0.0.1:{port}"));
        self.wait_for(|s| s.rest_call("GET", "ping", None).is_ok(), "slurmrestd to answer");
    }

    /// The file holding the JWT slurm-bridge sends (its `SLURM_JWT_FILE`).
    pub fn token_file(&self) -> PathBuf {
        self.dir.join("rest/auth-token")
    }

    /// A slurmrestd v0.0.44 call as slurm-bridge makes it (`path` after `/slurm/v0.0.44/`): TCP,
    /// the token file's JWT in `X-SLURM-USER-TOKEN`. The answer, or `Err` with Slurm's errors
    /// when it has any.
    pub fn rest_call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let base = self.rest_url.as_deref().ok_or("this Slurm runs no slurmrestd (22.05 has no v0.0.44)")?;
        let url = format!("{base}/slurm/v0.0.44/{path}");
        let token = std::fs::read_to_string(self.token_file()).map_err(|e| format!("token file: {e}"))?;
        let header = format!("X-SLURM-USER-TOKEN: {}", token.trim());
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "20", "-X", method, "-H", &header, &url]);
        if let Some(body) = body {
            cmd.args(["-H", "Content-Type: application/json", "--data-binary", &body.to_string()]);
        }
        let out = cmd.output().map_err(|e| format!("curl: {e}"))?;
        let answer: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "{method} {path}: not JSON ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        match answer["errors"].as_array() {
            Some(errors) if !errors.is_empty() => Err(format!("{method} {path}: {errors:?}")),
            _ => Ok(answer),
        }
    }

    fn spawn(&mut self, daemon: &'static str) {
        let args: Vec<&str> = match daemon {
            "slurmctld" => vec!["-D", "-i"],
            _ => vec!["-D", "-N", &self.host],
        };
        let child = Command::new(bin(daemon))
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
        let child = Command::new(bin("slurmctld"))
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
        Command::new(bin("scontrol"))
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
            bin("sbatch"),
            &["--parsable", "-J", name, "-o", "/dev/null", &format!("--gres={gres}"), "--wrap", "sleep 600"],
            &self.conf,
        )
        .trim()
        .to_string()
    }

    /// `JobState=` of a job.
    pub fn job_state(&self, id: &str) -> String {
        let text = self.scontrol(&["show", "job", id]);
        let state = field(&text, "JobState");
        if state.is_empty() { "GONE".into() } else { state.into() }
    }

    /// Wait until a job runs; its GPU index (`scontrol show job -d`: `GRES=shard:1(IDX:1)`).
    pub fn running_index(&self, id: &str) -> u32 {
        self.wait_for(|s| s.job_state(id) == "RUNNING", &format!("job {id} RUNNING"));
        self.job_index(id)
    }

    /// The GPU index of a running job on one GPU, as `scontrol show job -d` says.
    pub fn job_index(&self, id: &str) -> u32 {
        let text = self.scontrol(&["show", "job", "-d", id]);
        match job_gpus(&text).as_deref() {
            Ok([k]) => *k,
            other => panic!("job {id} is not on one GPU: {other:?}\n{text}"),
        }
    }

    /// Hold a pending job (`scontrol hold`), or release it again.
    pub fn hold(&self, id: &str, hold: bool) {
        run(bin("scontrol"), &[if hold { "hold" } else { "release" }, id], &self.conf);
    }

    /// slurm-bridge's placeholder for pod `ns/name`, holding `gres` (`shard:2`): its job ID. On a
    /// Slurm with the bridge's API, the call slurm-bridge makes (`POST job/submit` through
    /// slurmrestd v0.0.44, as SlurmUser): an external job (`EXTERNAL_JOB`, no script) on this node,
    /// `tres_per_node` `gres/shard:2`, AdminComment `{"pods":["ns/name"]}`, working directory
    /// `/tmp`, not exclusive (the bridge's `exclusive=false` annotation). On 22.05, which has
    /// neither external jobs nor that API, a batch job that sleeps, submitted with sbatch.
    pub fn reserve(&self, pod: &str, gres: &str) -> String {
        if !has_bridge_api() {
            return self.submit(pod, gres);
        }
        self.reserve_on(&self.host, pod, gres)
    }

    /// [`Slurm::reserve`] through slurmrestd on node `node` (an External node, say).
    pub fn reserve_on(&self, node: &str, pod: &str, gres: &str) -> String {
        let job = serde_json::json!({"job": {
            "name": pod,
            "flags": ["EXTERNAL_JOB"],
            "admin_comment": serde_json::json!({"pods": [pod]}).to_string(),
            "current_working_directory": "/tmp",
            "partition": "debug",
            "nodes": "1",
            "required_nodes": [node],
            "tres_per_node": format!("gres/{gres}"),
            "shared": [],
        }});
        let answer = self.rest_call("POST", "job/submit", Some(&job)).unwrap_or_else(|e| panic!("reserve {pod}: {e}"));
        let id = answer["job_id"].as_u64().unwrap_or_else(|| panic!("reserve {pod}: no job_id in {answer}"));
        let read = self.rest_call("GET", &format!("job/{id}"), None).unwrap();
        let info = &read["jobs"][0];
        assert!(
            info["flags"].as_array().is_some_and(|f| f.iter().any(|f| f == "EXTERNAL_JOB")),
            "job {id} is not external: {}",
            info["flags"]
        );
        assert_eq!(info["admin_comment"], job["job"]["admin_comment"], "job {id}'s AdminComment");
        id.to_string()
    }

    /// GPU indexes of a running job, as slurm-bridge's PreBind reads them: `GET resources/{id}`.
    /// Asked again for up to 60 s while slurmctld answers "Unable to query": it stalls ~10 s
    /// resolving an External node's name (the bridge adds them with no `NodeAddr`), longer than
    /// slurmrestd's RPC timeout; the bridge's PreBind fails then and the scheduler retries it.
    /// Any other error, or the same one after 60 s, is returned.
    pub fn rest_index(&self, id: &str) -> Result<Vec<u32>, String> {
        let start = Instant::now();
        loop {
            match self.rest_call("GET", &format!("resources/{id}"), None) {
                Ok(answer) => return rest_gpus(&answer),
                Err(e) if e.contains("Unable to query") && start.elapsed() < Duration::from_secs(60) => {
                    std::thread::sleep(Duration::from_millis(500))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The GPU index of the bridge's running placeholder, as its PreBind reads it: slurmrestd's
    /// `GET resources/{job_id}`, `nodes[].gres[].index` (retried while Slurm says the job is not
    /// running yet); on 22.05, `scontrol show job -d`'s IDX. Either must name one GPU, the one
    /// [`Slurm::job_index`] gives.
    pub fn reserved_index(&self, id: &str) -> u32 {
        self.wait_for(|s| s.job_state(id) == "RUNNING", &format!("job {id} RUNNING"));
        if !has_bridge_api() {
            return self.job_index(id);
        }
        let gpus = self.rest_index(id).unwrap_or_else(|e| panic!("job {id}: {e}"));
        let [k] = gpus[..] else { panic!("job {id} is not on one GPU: {gpus:?}") };
        assert_eq!(self.job_index(id), k, "slurmrestd and scontrol disagree on job {id}'s GPU");
        k
    }

    /// The bridge releases its placeholder: `DELETE job/{id}` through slurmrestd (22.05:
    /// `scancel`); waits until it is gone.
    pub fn release(&self, id: &str) {
        if !has_bridge_api() {
            return self.cancel(id);
        }
        self.rest_call("DELETE", &format!("job/{id}"), None).unwrap_or_else(|e| panic!("release {id}: {e}"));
        self.wait_for(|s| !matches!(s.job_state(id).as_str(), "RUNNING" | "COMPLETING" | "PENDING"), "job released");
    }

    /// Cancel a job, as slurm-bridge releases its placeholder, and wait until it is gone.
    pub fn cancel(&self, id: &str) {
        run(bin("scancel"), &[id], &self.conf);
        self.wait_for(|s| !matches!(s.job_state(id).as_str(), "RUNNING" | "COMPLETING" | "PENDING"), "job cancelled");
    }
}

/// The value of `KEY=` in `scontrol show` output (its first occurrence), or "" when absent.
pub fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.split_whitespace().find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('='))).unwrap_or("")
}

/// The GPU indexes a job holds, from `scontrol show job -d`'s per-node `GRES=`. Both releases print
/// a `gpu` job as `GRES=gpu:h100:1(IDX:1)`; a `shard` job is `GRES=shard:2(IDX:0)` on 22.05, and
/// on 26.05 the job's shards of each GPU in index order, `GRES=shard:2(0/8,2/8)`.
///
/// # Errors
/// No `GRES=` with either form: the text and what was expected.
pub fn job_gpus(detail: &str) -> Result<Vec<u32>, String> {
    let mut gpus = Vec::new();
    for gres in detail.split_whitespace().filter_map(|w| w.strip_prefix("GRES=")) {
        for item in gres.split_inclusive(')') {
            let Some((_, inner)) = item.trim_start_matches(',').split_once('(') else { continue };
            let inner = inner.trim_end_matches(')');
            if let Some(list) = inner.strip_prefix("IDX:") {
                gpus.extend(indexes(list)?);
            } else {
                for (k, per_gpu) in inner.split(',').enumerate() {
                    let counts = per_gpu.split_once('/').map(|(u, t)| (u.parse::<u32>(), t.parse::<u32>()));
                    match counts {
                        Some((Ok(0), Ok(_))) => {}
                        Some((Ok(_), Ok(_))) => gpus.push(k as u32),
                        _ => return Err(format!("GRES {gres}: {per_gpu} is neither IDX:k nor used/total")),
                    }
                }
            }
        }
    }
    if gpus.is_empty() {
        return Err("no GRES=...(IDX:k) or GRES=...(used/total,...) in the job".into());
    }
    gpus.sort_unstable();
    gpus.dedup();
    Ok(gpus)
}

/// The GPU indexes of slurmrestd's `GET /slurm/v0.0.44/resources/{job_id}` answer, as slurm-bridge
/// reads them: `nodes[].gres[].index` of the `gpu` and `shard` entries, a Slurm range ("0", "0-1,3").
///
/// # Errors
/// An entry without an index (count-only GRES, Slurm records with no `File=`) or a bad range.
pub fn rest_gpus(resources: &Value) -> Result<Vec<u32>, String> {
    let mut gpus = Vec::new();
    let nodes = resources["nodes"].as_array().ok_or_else(|| format!("no nodes[] in {resources}"))?;
    for gres in nodes.iter().flat_map(|n| n["gres"].as_array().into_iter().flatten()) {
        if !matches!(gres["name"].as_str(), Some("gpu" | "shard")) {
            continue;
        }
        let index = gres["index"].as_str().filter(|i| !i.is_empty());
        let index = index.ok_or_else(|| format!("GRES {gres} has no index: Slurm gave a count, not GPUs"))?;
        gpus.extend(indexes(index)?);
    }
    gpus.sort_unstable();
    gpus.dedup();
    Ok(gpus)
}

/// A Slurm index list (`0`, `0-2,5`), expanded as slurmd expands host lists.
fn indexes(list: &str) -> Result<Vec<u32>, String> {
    let expanded = migdra::slurm::hostlist::expand(&format!("[{list}]"))?;
    expanded.iter().map(|i| i.parse().map_err(|_| format!("{i} (in {list}) is not a GPU index"))).collect()
}
