//! Metrics and logs of a real `migdra serve`: the daemon runs on simulated GPUs with claims from
//! files, a test kubelet prepares and unprepares over the real DRA socket, and the test scrapes
//! `/metrics` and reads the JSON log, as Prometheus and a log pipeline would.

#![allow(clippy::print_stdout)] // the scrape is printed for the README (--show-output)

use crate::support::claim::Claim;
use crate::support::command::{Run, migdra};
use crate::support::daemon::Daemon;
use crate::support::eventually::eventually;
use crate::support::logs::file_tail;
use crate::support::node::NodeDir;
use crate::support::{NAMESPACE, NODE};
use migdra::claims::ClaimRef;
use migdra::kubelet::client::Version;
use serde_json::Value;
use std::io::{Read, Write};
use std::time::Duration;

const UID: &str = "5b0c2f3e-9a41-4d2e-8f00-000000000001";

/// The JSON log lines so far.
fn json_lines(daemon: &Daemon) -> Vec<Value> {
    daemon
        .log()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}")))
        .collect()
}

/// The address the metrics endpoint listens on, from its log line.
async fn metrics_addr(daemon: &mut Daemon) -> String {
    let log = daemon.log_path().to_path_buf();
    eventually("the metrics address logged")
        .within(Duration::from_secs(15))
        .every(Duration::from_millis(20))
        .explain(move || file_tail("migdra serve", &log, 60))
        .until(|| {
            assert!(daemon.running(), "serve exited:\n{}", daemon.log());
            daemon.log().lines().find_map(|l| {
                let v: Value = serde_json::from_str(l).ok()?;
                (v["fields"]["message"] == "serving metrics at /metrics")
                    .then(|| v["fields"]["addr"].as_str().map(String::from))?
            })
        })
        .await
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

/// A prepare over the real DRA socket shows up in every metric family, and every log line of
/// that claim carries its UID and device; an unprepare and a failed prepare are counted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_after_a_prepare_finds_every_family_and_the_claim_logs_carry_its_span() {
    let node = NodeDir::new().simulate("h100-80gb:1");
    let minor = node.minors()[0];
    let device = format!("gpu-{minor}-mig-1g10gb-19-3");
    let claim = Claim::new(UID).named("notebook").device(NODE, &device);
    node.write_as("notebook", &claim);

    let mut daemon =
        node.serve().default_intervals().args(["--log-format", "json", "--metrics-addr", "127.0.0.1:0"]).spawn();
    let addr = metrics_addr(&mut daemon).await;

    let before = scrape(&addr);
    for f in migdra::metrics::FAMILIES {
        assert!(before.contains(&format!("# HELP {} ", f.name)), "{} has HELP before any call:\n{before}", f.name);
        assert!(before.contains(&format!("# TYPE {} {}\n", f.name, f.kind)), "{} is a {}:\n{before}", f.name, f.kind);
    }
    let uuid = node.layout()["gpus"][0]["uuid"].as_str().unwrap().to_string();
    let instances = |profile: &str| format!("migdra_mig_instances{{gpu=\"{uuid}\",profile=\"{profile}\"}}");
    assert_eq!(sample(&before, "migdra_prepare_duration_seconds_count"), 0.0);
    assert_eq!(sample(&before, &instances("1g.10gb")), 0.0);
    assert_eq!(sample(&before, &format!("migdra_gpu_healthy{{gpu=\"{uuid}\",reason=\"none\"}}")), 1.0);

    daemon.wait_ready().await;
    let kubelet = daemon.register().await;
    let claim = claim.reference();
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
    assert_eq!(sample(&text, &instances("1g.10gb")), 1.0, "{text}");
    assert_eq!(sample(&text, &instances("7g.80gb")), 0.0, "{text}");
    assert!(sample(&text, "migdra_checkpoint_writes_total") > 0.0, "{text}");
    assert_eq!(sample(&text, "migdra_errors_total{operation=\"prepare\",reason=\"claim-not-found\"}"), 1.0, "{text}");
    // Claims come from files here, so nothing is published; the family is there, at zero.
    assert_eq!(sample(&text, "migdra_slice_publishes_total{result=\"written\"}"), 0.0, "{text}");

    let unprepared = kubelet.unprepare(Version::V1, std::slice::from_ref(&claim)).await.unwrap();
    assert_eq!(unprepared.get(UID).map(String::as_str), Some(""), "{unprepared:?}");
    let after = scrape(&addr);
    assert_eq!(sample(&after, "migdra_unprepare_duration_seconds_count"), 1.0, "{after}");
    assert_eq!(sample(&after, &instances("1g.10gb")), 0.0, "{after}");
    assert!(
        sample(&after, "migdra_checkpoint_writes_total") > sample(&text, "migdra_checkpoint_writes_total"),
        "unprepare writes the checkpoint:\n{after}"
    );

    // The other paths answer as HTTP says, and the daemon lives on.
    assert_eq!(http(&addr, "GET /nope HTTP/1.1\r\n\r\n").0, "HTTP/1.1 404 Not Found");
    assert_eq!(http(&addr, "POST /metrics HTTP/1.1\r\n\r\n").0, "HTTP/1.1 405 Method Not Allowed");
    assert_eq!(http(&addr, "GET / HTTP/1.1\r\n\r\n").0, "HTTP/1.1 200 OK");

    // Logs: every line of the claim (prepared, unprepared) carries the claim span.
    let lines = json_lines(&daemon);
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
    let node = NodeDir::new().in_memory("h100-80gb:1");
    let out = node.serve().default_intervals().args(["--metrics-addr", "0.0.0.0:0"]).command().run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("not a loopback address") && last.contains("--metrics-allow-remote"), "{stderr}");
    assert!(!node.plugin_dir().exists(), "nothing was started");

    let out = migdra().args(["serve", "--metrics-addr", "nonsense"]).run();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:9400"));
}
