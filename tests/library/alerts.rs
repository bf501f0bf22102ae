//! The chart's alerts in Prometheus' own tools (promtool, built by hack/build-promtool.sh):
//! `promtool check rules` on the PrometheusRule's groups, and `promtool test rules` on the events
//! each alert is for — a counter's first event, whether its series is born at 1 (a restarted
//! migdra pod, or a label value migdra did not know at start-up) or rises from the 0 migdra
//! writes at start-up, and a GPU whose unhealthy reason changes (an XID, then the GPU lost). The
//! same cases then run on the rules as they were before (increase() alone, one alert per reason):
//! promtool must fail them, so the cases can fail.

use crate::support::render::{self, HELM, PROMTOOL};
use serde_json::{Map, Value, json};
use std::path::Path;
use std::process::Command;

/// One `promtool test rules` case: input series (`{labels}` and promtool's values notation), and
/// per evaluation time the alert's expected label sets (empty: it must not fire).
struct Case {
    name: &'static str,
    series: Vec<(String, &'static str)>,
    alert: &'static str,
    evals: Vec<(&'static str, Vec<Value>)>,
}

fn cases() -> Vec<Case> {
    let stale = |reason: &str| format!("migdra_stale_claims_rolled_back_total{{node=\"n1\",reason=\"{reason}\"}}");
    let unprepare = r#"migdra_errors_total{node="n1",operation="unprepare",reason="nvml-in-use"}"#.to_string();
    let stale_fires = json!({"node": "n1", "reason": "deleted", "severity": "info"});
    let unprepare_fires = json!({"node": "n1", "reason": "nvml-in-use", "severity": "warning"});
    vec![
        Case {
            name: "one claim rolled back, its series born at 1",
            series: vec![(stale("deleted"), "_x10 1x80")],
            alert: "MigdraStaleClaimsRolledBack",
            evals: vec![("5m", vec![]), ("15m", vec![stale_fires.clone()]), ("75m", vec![])],
        },
        Case {
            name: "one claim rolled back, from the 0 written at start-up",
            series: vec![(stale("deleted"), "0x10 1x80")],
            alert: "MigdraStaleClaimsRolledBack",
            evals: vec![("15m", vec![stale_fires]), ("75m", vec![])],
        },
        Case {
            name: "one unprepare failed, its series born at 1",
            series: vec![(unprepare.clone(), "_x10 1x80")],
            alert: "MigdraUnprepareFailing",
            evals: vec![("15m", vec![unprepare_fires.clone()]), ("45m", vec![])],
        },
        Case {
            name: "one unprepare failed, from the 0 written at start-up",
            series: vec![(unprepare, "0x10 1x80")],
            alert: "MigdraUnprepareFailing",
            evals: vec![("15m", vec![unprepare_fires]), ("45m", vec![])],
        },
        Case {
            name: "a GPU unhealthy for 9 minutes, an XID then lost",
            series: vec![
                (r#"migdra_gpu_healthy{node="n1",gpu="GPU-1",reason="xid-79"}"#.into(), "0x5 stale"),
                (r#"migdra_gpu_healthy{node="n1",gpu="GPU-1",reason="lost"}"#.into(), "_x6 0x20"),
            ],
            alert: "MigdraGpuUnhealthy",
            evals: vec![("4m", vec![]), ("9m", vec![json!({"node": "n1", "gpu": "GPU-1", "severity": "warning"})])],
        },
    ]
}

/// An annotation template with `{{ $labels.NAME }}` filled in, as Prometheus renders these.
fn fill(template: &str, labels: &Map<String, Value>) -> String {
    let mut out = template.to_string();
    for (k, v) in labels {
        out = out.replace(&format!("{{{{ $labels.{k} }}}}"), v.as_str().unwrap());
    }
    out
}

/// promtool's test file for `groups`: each case, with the alert's annotations filled in.
fn test_file(groups: &Value) -> Value {
    let rule = |name: &str| {
        groups[0]["rules"].as_array().unwrap().iter().find(|r| r["alert"] == name).cloned().unwrap_or_else(|| {
            panic!("the chart has no alert {name}");
        })
    };
    let tests: Vec<Value> = cases()
        .into_iter()
        .map(|c| {
            let annotations = rule(c.alert)["annotations"].as_object().unwrap().clone();
            let series: Vec<Value> = c.series.iter().map(|(s, v)| json!({"series": s, "values": v})).collect();
            let evals: Vec<Value> = c
                .evals
                .iter()
                .map(|(at, fires)| {
                    let exp: Vec<Value> = fires
                        .iter()
                        .map(|labels| {
                            let labels = labels.as_object().unwrap();
                            let filled: Map<String, Value> = annotations
                                .iter()
                                .map(|(k, t)| (k.clone(), fill(t.as_str().unwrap(), labels).into()))
                                .collect();
                            json!({"exp_labels": labels, "exp_annotations": filled})
                        })
                        .collect();
                    json!({"eval_time": at, "alertname": c.alert, "exp_alerts": exp})
                })
                .collect();
            json!({"name": c.name, "interval": "1m", "input_series": series, "alert_rule_test": evals})
        })
        .collect();
    json!({"rule_files": ["rules.json"], "evaluation_interval": "1m", "tests": tests})
}

/// `promtool ARGS` in `dir`: whether it passed, and what it printed.
fn promtool(bin: &Path, dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin).args(args).current_dir(dir).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
#[allow(clippy::print_stdout)] // promtool's report
fn the_alerts_fire_on_a_first_event_in_promtool() {
    let Some(promtool_bin) = PROMTOOL.find() else { return };
    let Some(helm) = HELM.find() else { return };
    let text = render::helm_template(&helm, &["--set", "monitoring.prometheusRule.enabled=true"]);
    let docs = render::documents("helm template (alerts)", &text);
    let groups =
        docs.iter().find(|d| d["kind"] == "PrometheusRule").expect("a PrometheusRule")["spec"]["groups"].clone();
    let dir = tempfile::tempdir().unwrap();
    let write = |groups: &Value| {
        std::fs::write(dir.path().join("rules.json"), json!({"groups": groups}).to_string()).unwrap();
        std::fs::write(dir.path().join("test.json"), test_file(groups).to_string()).unwrap();
    };
    write(&groups);
    let (ok, said) = promtool(&promtool_bin, dir.path(), &["check", "rules", "rules.json"]);
    assert!(ok, "promtool check rules:\n{said}");
    let (ok, said) = promtool(&promtool_bin, dir.path(), &["test", "rules", "test.json"]);
    assert!(ok, "promtool test rules:\n{said}");
    println!("promtool check rules and test rules: {} cases pass\n{said}", cases().len());

    // The rules as they were: increase() alone misses a series born at 1, and a `for` as long as
    // the window never lets one event fire; one alert per reason starts its wait again when the
    // reason changes. promtool fails every case but those from 0.
    let mut old = groups.clone();
    for rule in old[0]["rules"].as_array_mut().unwrap() {
        let alert = rule["alert"].as_str().unwrap().to_string();
        let expr = match alert.as_str() {
            "MigdraStaleClaimsRolledBack" => {
                "sum by (node, reason) (increase(migdra_stale_claims_rolled_back_total[1h])) > 0"
            }
            "MigdraUnprepareFailing" => {
                rule["for"] = "30m".into();
                "sum by (node, reason) (increase(migdra_errors_total{operation=\"unprepare\"}[30m])) > 0"
            }
            "MigdraGpuUnhealthy" => "migdra_gpu_healthy == 0",
            _ => continue,
        };
        rule["expr"] = expr.into();
    }
    write(&old);
    let (ok, said) = promtool(&promtool_bin, dir.path(), &["test", "rules", "test.json"]);
    assert!(!ok, "the old rules pass:\n{said}");
    for case in cases() {
        let from_zero =
            case.name.ends_with("from the 0 written at start-up") && case.alert == "MigdraStaleClaimsRolledBack";
        assert_eq!(said.contains(case.name), !from_zero, "old rules, case {:?}:\n{said}", case.name);
    }
}
