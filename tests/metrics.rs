//! Metrics and logs of a real `migdra serve`: the daemon runs on simulated GPUs with claims from
//! files, a test kubelet prepares and unprepares over the real DRA socket, and the test scrapes
//! `/metrics` and reads the JSON log, as Prometheus and a log pipeline would.

#![allow(clippy::print_stdout)] // the scrape is printed for the README (--show-output)

use migdra::claims::ClaimRef;
use migdra::kubelet::client::{TestKubelet, Version};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DRIVER: &str = "mig.slinky.slurm.net";
const NODE: &str = "node-m";
const NAMESPACE: &str = "team-m";
const UID: &str = "5b0c2f3e-9a41-4d2e-8f00-000000000001";

/// A command with none of the caller's `MIGDRA_*`, `POD_UID` or `NODE_NAME` settings.
fn migdra() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_migdra"));
    for (key, _) in std::env::vars_os() {
        if let Some(k) = key.to_str()
            && (k.starts_with("MIGDRA_") || k == "POD_UID" || k == "NODE_NAME")
        {
            cmd.env_remove(k);
        }
    }
    cmd
}

fn node_flags(dir: &Path) -> Vec<String> {
    let p = |name: &str| dir.join(name).display().to_string();
    vec![
        "--sim-state".into(),
        p("gpus.json"),
        "--state-dir".into(),
        p("state"),
        "--cdi-dir".into(),
        p("cdi"),
        "--claims-dir".into(),
        p("claims"),
        "--node-name".into(),
        NODE.into(),
    ]
}

/// A running `migdra serve`, killed when dropped.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The JSON log lines so far.
    fn json_lines(&self) -> Vec<Value> {
        self.log()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}")))
            .collect()
    }

    /// The address the metrics endpoint listens on, from its log line.
    fn metrics_addr(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            assert!(self.child.try_wait().unwrap().is_none(), "serve exited:\n{}", self.log());
            if let Some(addr) = self.log().lines().find_map(|l| {
                let v: Value = serde_json::from_str(l).ok()?;
                (v["fields"]["message"] == "serving metrics at /metrics")
                    .then(|| v["fields"]["addr"].as_str().map(String::from))?
            }) {
                return addr;
            }
            assert!(Instant::now() < deadline, "no metrics address logged:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP request; (status line, body).
fn http(addr: &str, request: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    (head.lines().next().unwrap_or_default().to_string(), body.to_string())
}

fn scrape(addr: &str) -> String {
    let (status, body) = http(addr, "GET /metrics HTTP/1.1\r\nHost: migdra\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    body
}

/// The value of the sample `name{labels}` (exact text before the value).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

/// Every family of issue 9 item 3, with its type.
const FAMILIES: [(&str, &str); 6] = [
    ("migdra_prepare_duration_seconds", "histogram"),
    ("migdra_unprepare_duration_seconds", "histogram"),
    ("migdra_errors_total", "counter"),
    ("migdra_mig_instances", "gauge"),
    ("migdra_checkpoint_writes_total", "counter"),
    ("migdra_slice_publishes_total", "counter"),
];

/// A prepare over the real DRA socket shows up in every metric family, and every log line of
/// that claim carries its UID and device; an unprepare and a failed prepare are counted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_after_a_prepare_finds_every_family_and_the_claim_logs_carry_its_span() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = migdra().args(["layout", "-o", "json", "--sim", "h100-80gb:1"]).args(node_flags(dir)).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let layout: Value = serde_json::from_slice(&out.stdout).unwrap();
    let minor = layout["gpus"][0]["minor"].as_u64().unwrap();
    let device = format!("gpu-{minor}-mig-1g10gb-19-3");
    let claim_object = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "notebook", "namespace": NAMESPACE, "uid": UID},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
        ]}}}
    });
    std::fs::create_dir_all(dir.join("claims")).unwrap();
    std::fs::write(dir.join("claims/notebook.json"), claim_object.to_string()).unwrap();

    let log = dir.join("serve.log");
    let registry = dir.join("registry");
    let child = migdra()
        .arg("serve")
        .args(node_flags(dir))
        .arg("--plugin-dir")
        .arg(dir.join("plugin"))
        .arg("--registry-dir")
        .arg(&registry)
        .args(["--log-format", "json", "--metrics-addr", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut daemon = Daemon { child, log };
    let addr = daemon.metrics_addr();

    let before = scrape(&addr);
    for (family, kind) in FAMILIES {
        assert!(before.contains(&format!("# HELP {family} ")), "{family} has HELP before any call:\n{before}");
        assert!(before.contains(&format!("# TYPE {family} {kind}\n")), "{family} is a {kind}:\n{before}");
    }
    assert_eq!(sample(&before, "migdra_prepare_duration_seconds_count"), 0.0);
    assert_eq!(sample(&before, "migdra_mig_instances{profile=\"1g.10gb\"}"), 0.0);

    let registration = registry.join(format!("{DRIVER}-reg.sock"));
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::os::unix::net::UnixStream::connect(&registration).is_err() {
        assert!(Instant::now() < deadline, "no registration socket:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let kubelet = TestKubelet::register(&registration).await.unwrap_or_else(|e| panic!("{e}\n{}", daemon.log()));
    let claim = ClaimRef { uid: UID.into(), namespace: NAMESPACE.into(), name: "notebook".into() };
    let prepared = kubelet.prepare(Version::V1, std::slice::from_ref(&claim)).await.unwrap();
    assert!(matches!(prepared.get(UID), Some(Ok(d)) if d.len() == 1), "{prepared:?}\n{}", daemon.log());
    let unknown = ClaimRef { uid: "5b0c2f3e-9a41-4d2e-8f00-00000000dead".into(), ..claim.clone() };
    let failed = kubelet.prepare(Version::V1, &[unknown]).await.unwrap();
    assert!(failed.values().all(Result::is_err), "{failed:?}");

    let text = scrape(&addr);
    println!("scrape after one prepare and one failed prepare:\n{text}");
    assert!(sample(&text, "migdra_prepare_duration_seconds_count") >= 2.0, "{text}");
    assert!(sample(&text, "migdra_prepare_duration_seconds_bucket{le=\"+Inf\"}") >= 2.0, "{text}");
    assert!(sample(&text, "migdra_prepare_duration_seconds_sum") > 0.0, "{text}");
    assert_eq!(sample(&text, "migdra_mig_instances{profile=\"1g.10gb\"}"), 1.0, "{text}");
    assert_eq!(sample(&text, "migdra_mig_instances{profile=\"7g.80gb\"}"), 0.0, "{text}");
    assert!(sample(&text, "migdra_checkpoint_writes_total") > 0.0, "{text}");
    assert_eq!(sample(&text, "migdra_errors_total{operation=\"prepare\",reason=\"claim-not-found\"}"), 1.0, "{text}");
    // Claims come from files here, so nothing is published; the family is there, at zero.
    assert_eq!(sample(&text, "migdra_slice_publishes_total{result=\"written\"}"), 0.0, "{text}");

    let unprepared = kubelet.unprepare(Version::V1, std::slice::from_ref(&claim)).await.unwrap();
    assert_eq!(unprepared.get(UID).map(String::as_str), Some(""), "{unprepared:?}");
    let after = scrape(&addr);
    assert_eq!(sample(&after, "migdra_unprepare_duration_seconds_count"), 1.0, "{after}");
    assert_eq!(sample(&after, "migdra_mig_instances{profile=\"1g.10gb\"}"), 0.0, "{after}");
    assert!(
        sample(&after, "migdra_checkpoint_writes_total") > sample(&text, "migdra_checkpoint_writes_total"),
        "unprepare writes the checkpoint:\n{after}"
    );

    // The other paths answer as HTTP says, and the daemon lives on.
    assert_eq!(http(&addr, "GET /nope HTTP/1.1\r\n\r\n").0, "HTTP/1.1 404 Not Found");
    assert_eq!(http(&addr, "POST /metrics HTTP/1.1\r\n\r\n").0, "HTTP/1.1 405 Method Not Allowed");
    assert_eq!(http(&addr, "GET / HTTP/1.1\r\n\r\n").0, "HTTP/1.1 200 OK");

    // Logs: every line of the claim (prepared, unprepared) carries the claim span.
    let lines = daemon.json_lines();
    let of_claim: Vec<&Value> = lines.iter().filter(|l| l["span"]["claim_uid"] == UID).collect();
    let messages: Vec<&str> = of_claim.iter().filter_map(|l| l["fields"]["message"].as_str()).collect();
    assert!(messages.contains(&"prepared") && messages.contains(&"unprepared"), "{messages:?}\n{}", daemon.log());
    for l in &of_claim {
        assert_eq!(l["span"]["name"], "claim", "{l}");
        assert_eq!(l["span"]["namespace"], NAMESPACE, "{l}");
        assert_eq!(l["span"]["claim_name"], "notebook", "{l}");
        assert_eq!(l["span"]["device"], device.as_str(), "{l}");
    }
    println!("a log line of the claim:\n{}", of_claim[0]);
    let failure = lines
        .iter()
        .find(|l| l["fields"]["message"] == "prepare failed")
        .unwrap_or_else(|| panic!("no prepare failed line:\n{}", daemon.log()));
    assert_eq!(failure["span"]["claim_uid"], "5b0c2f3e-9a41-4d2e-8f00-00000000dead", "{failure}");
}

/// Metrics stay on this host unless the operator says otherwise: a non-loopback address is
/// refused at start, with one line that names the fix.
#[test]
fn a_remote_metrics_address_needs_the_allow_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let out = migdra()
        .args(["serve", "--sim", "h100-80gb:1", "--metrics-addr", "0.0.0.0:0"])
        .args(node_flags(tmp.path()))
        .arg("--plugin-dir")
        .arg(tmp.path().join("plugin"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("not a loopback address") && last.contains("--metrics-allow-remote"), "{stderr}");
    assert!(!tmp.path().join("plugin").exists(), "nothing was started");

    let out = migdra().args(["serve", "--metrics-addr", "nonsense"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:9400"));
}
