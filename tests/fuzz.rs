//! Hostile-input fuzz targets, as proptest properties so they run on stable Rust in CI: device
//! names, checkpoint files, gres.conf and slurm.conf, the Slurm index map and host lists, CDI spec
//! writing, the gRPC messages the kubelet sends, and the HTTP/2 re-framing of every socket. Each
//! must never panic, and what it accepts must be sound (names round-trip, CDI files stay in their
//! directory).
//!
//! `MIGDRA_FUZZ_CASES` sets the cases per round (default 256), `MIGDRA_FUZZ_SECONDS` runs rounds
//! of fresh inputs for that long per target (default: one round); `hack/reliability.sh` sets both.
//! A crash found here becomes a named regression test at the bottom of this file.

#![allow(clippy::print_stdout)] // each target prints its figure

use migdra::cdi::CdiWriter;
use migdra::cdi::{CdiDevice, DeviceNode};
use migdra::kubelet::proto::{dra_v1, dra_v1beta1, health_v1alpha1, registration};
use migdra::mig::naming::DeviceName;
use migdra::slurm::{conf, gresconf, hostlist, indexmap, slurmconf};
use migdra::state::format;
use migdra::state::{Checkpoint, CheckpointStore};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

fn cases() -> u32 {
    std::env::var("MIGDRA_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(256)
}

/// Run `test` on `cases()` inputs of `strategy`; print the figure line.
fn fuzz<S: Strategy>(target: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let started = Instant::now();
    // With MIGDRA_FUZZ_SECONDS, rounds of `cases()` fresh random inputs until the time is up.
    let budget = std::env::var("MIGDRA_FUZZ_SECONDS").ok().and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    let mut n = 0;
    loop {
        let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
        if let Err(e) = runner.run(&strategy, &test) {
            panic!("{target}: {e}");
        }
        n += cases();
        if started.elapsed().as_secs_f64() >= budget {
            break;
        }
    }
    println!("FIGURE\tfuzz\t{target}\t{n} inputs, 0 crashes, {:.1} s", started.elapsed().as_secs_f64());
}

/// Text made of the pieces a parser looks for, glued in any order, plus any characters.
fn pieces(words: &'static [&'static str], max: usize) -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => proptest::sample::select(words).prop_map(str::to_string),
        1 => "\\PC{0,6}",
        1 => "[0-9]{1,20}",
    ];
    proptest::collection::vec(piece, 0..max).prop_map(|v| v.concat())
}

// === device names ===

const NAME_WORDS: &[&str] =
    &["gpu-", "mig-", "-", "0", "7", "99", "4294967296", "1g10gb", "3g40gb", "1g", "+me", "gb", "19", "9", ""];

#[test]
fn fuzz_device_names() {
    let strategy = prop_oneof!["\\PC{0,80}", pieces(NAME_WORDS, 12)];
    fuzz("device-name decoding", strategy, |s| {
        if let Ok(name) = DeviceName::parse(&s) {
            let again = DeviceName::parse(&name.to_string());
            prop_assert_eq!(again.as_ref().ok(), Some(&name), "{:?} does not round-trip", s);
            prop_assert!(migdra::names::is_dns_label(&name.to_string()));
        }
        Ok(())
    });
}

// === checkpoint files ===

fn sample_payload() -> String {
    serde_json::json!({
        "bootId": "b0d1e1d0-0000-4000-8000-000000000000",
        "claims": {"u1": {
            "uid": "u1", "namespace": "team-a", "name": "c", "state": "PrepareCompleted",
            "devices": [{
                "requests": ["gpu"], "pool": "node-a", "device": "gpu-0-mig-3g40gb-9-4",
                "gpuUuid": "GPU-1", "pciBusId": "00000000:18:00.0", "gpuMinor": 0, "gpuIndex": 0,
                "mig": {"owner": "dynamic", "profileId": 9, "profile": "3g.40gb", "start": 4, "size": 4,
                        "giId": 2, "ciId": 0, "uuid": "MIG-1", "giCapMinor": 21, "ciCapMinor": 22},
                "cdiIds": ["mig.slinky.slurm.net/claim=u1-gpu-0-mig-3g40gb-9-4"]
            }]
        }}
    })
    .to_string()
}

/// A valid envelope around `payload`, so mutations get past the checksum into the records.
fn envelope(version: u64, payload: &str) -> String {
    format!(
        "{{\"version\": {version}, \"checksum\": \"{}\", \"checkpoint\": {payload}}}",
        format::checksum(payload.as_bytes())
    )
}

#[test]
fn fuzz_checkpoint_loading() {
    let seed = sample_payload();
    assert!(format::decode(envelope(migdra::state::CURRENT_VERSION, &seed).as_bytes()).is_ok(), "the seed is valid");
    let mutated =
        (proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8), 0u64..4).prop_map(move |(edits, v)| {
            let mut b = seed.clone().into_bytes();
            for (at, byte) in edits {
                let at = at % b.len();
                b[at] = byte;
            }
            envelope(v, &String::from_utf8_lossy(&b)).into_bytes()
        });
    let strategy = prop_oneof![proptest::collection::vec(any::<u8>(), 0..512), mutated];
    let dir = tempfile::tempdir().unwrap();
    let n = AtomicU64::new(0);
    fuzz("checkpoint loading", strategy, |bytes| {
        let decoded = format::decode(&bytes);
        // Every few inputs, also through the store, which quarantines what it cannot read.
        if n.fetch_add(1, Ordering::Relaxed).is_multiple_of(8) {
            let state = dir.path().join(format!("s{}", n.load(Ordering::Relaxed)));
            std::fs::create_dir_all(&state).unwrap();
            std::fs::write(state.join("checkpoint.json"), &bytes).unwrap();
            let loaded = CheckpointStore::new(&state).load();
            prop_assert!(loaded.is_ok(), "{:?}", loaded.err());
            let empty = Checkpoint::default();
            prop_assert!(decoded.is_ok() || *loaded.unwrap().checkpoint() == empty);
        }
        Ok(())
    });
}

// === Slurm files ===

const GRES_WORDS: &[&str] = &[
    "NodeName=",
    "node-a",
    "node-[a-c]",
    "node[0-3,7]",
    "Name=gpu",
    "Name=shard",
    "Type=",
    "h100",
    "File=",
    "/dev/nvidia[0-3]",
    "/dev/nvidia0",
    "Count=",
    "4",
    "1K",
    "9999999999999999999",
    "Cores=",
    "0-3",
    "AutoDetect=nvml",
    "AutoDetect=off",
    "Flags=",
    " ",
    "\n",
    "\\\n",
    "#",
    "\"",
    "=",
    ",",
    "[",
    "]",
    "-",
    "GresTypes=gpu,shard",
    "Gres=gpu:h100:4,shard:8",
    "NodeName=DEFAULT",
    "Include ",
    "nonexistent.conf",
];

#[test]
fn fuzz_gres_conf() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gres.conf");
    fuzz("gres.conf / slurm.conf parsing", pieces(GRES_WORDS, 40), |text| {
        std::fs::write(&path, &text).unwrap();
        if let Ok(lines) = conf::read(&path) {
            let _ = gresconf::parse(&lines, "node-a");
            let _ = slurmconf::node_gres(&lines, "node-a");
        }
        Ok(())
    });
}

const MAP_WORDS: &[&str] = &[
    "node-a",
    "node-[a-z]",
    "*",
    ":",
    " ",
    "\n",
    "{",
    "}",
    "[",
    "]",
    "\"",
    ",",
    "- ",
    "gpus:",
    "index:",
    "uuid:",
    "pciBusID:",
    "GPU-0000",
    "00000000:18:00.0",
    "0000:18:00.0",
    "18:00.0",
    "0",
    "1",
    "-1",
    "nodes:",
    "slurmIndex:",
    "#",
    "---",
    "\t",
    "null",
    "~",
    "&a",
    "*a",
    "!!str",
];

#[test]
fn fuzz_slurm_index_map() {
    let strategy = prop_oneof!["\\PC{0,200}", pieces(MAP_WORDS, 50)];
    fuzz("Slurm index map parsing", strategy, |text| {
        let _ = indexmap::parse(&text, Path::new("map.yaml"));
        let _ = migdra::pci::bus_id(&text);
        Ok(())
    });
}

const HOST_WORDS: &[&str] = &["node", "[", "]", "-", ",", "0", "1", "9", "007", "99999999999999999999", "a", "^"];

#[test]
fn fuzz_hostlist() {
    let strategy = prop_oneof!["\\PC{0,40}", pieces(HOST_WORDS, 24)];
    fuzz("Slurm host list expansion", strategy, |expr| {
        if let Ok(names) = hostlist::expand(&expr) {
            prop_assert!(names.len() <= hostlist::MAX_NAMES);
        }
        let _ = hostlist::contains(&expr, "node1");
        Ok(())
    });
}

// === CDI writing ===

#[test]
fn fuzz_cdi_writing() {
    let root = tempfile::tempdir().unwrap();
    let cdi = root.path().join("cdi");
    let writer = CdiWriter::new(&cdi, "mig.slinky.slurm.net");
    let text = prop_oneof![
        "\\PC{0,40}",
        pieces(&["..", "/", "a", "-", "0", "\0", ".", "%2e", "\\", "~", "\n", "claim_"], 10),
    ];
    let strategy = (text.clone(), text.clone(), text, "[a-z0-9-]{1,40}");
    fuzz("CDI spec writing (hostile claim UIDs and values)", strategy, |(uid, device, value, good_uid)| {
        for uid in [uid.as_str(), good_uid.as_str()] {
            let dev = CdiDevice {
                name: migdra::cdi::device_name(uid, &device),
                env: vec![("NVIDIA_VISIBLE_DEVICES".into(), value.clone())],
                device_nodes: vec![DeviceNode::host(format!("/dev/{value}"))],
                mounts: vec![migdra::cdi::Mount {
                    host_path: format!("/m/{value}"),
                    container_path: format!("/c/{value}"),
                }],
            };
            if writer.write(uid, &[dev]).is_ok() {
                let path = writer.spec_path(uid).unwrap();
                prop_assert_eq!(path.parent(), Some(cdi.as_path()), "{:?} escaped", uid);
                writer.remove(uid).unwrap();
            }
        }
        // Nothing but the CDI directory itself in the root.
        let entries: Vec<_> = std::fs::read_dir(root.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        prop_assert!(entries.iter().all(|e| e == "cdi"), "{:?}", entries);
        let left: Vec<_> = std::fs::read_dir(&cdi).into_iter().flatten().flatten().collect();
        prop_assert!(left.is_empty(), "{:?}", left);
        Ok(())
    });
}

// === gRPC messages ===

/// Bytes the kubelet could send: random, or a valid request with a few bytes changed.
fn grpc_bytes() -> impl Strategy<Value = Vec<u8>> {
    use prost::Message;
    let valid = dra_v1::NodePrepareResourcesRequest {
        claims: vec![dra_v1::Claim { namespace: "team-a".into(), uid: "u1".into(), name: "c".into() }; 3],
    }
    .encode_to_vec();
    let mutated = proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6).prop_map(move |edits| {
        let mut b = valid.clone();
        for (at, byte) in edits {
            let at = at % b.len();
            b[at] = byte;
        }
        b
    });
    prop_oneof![proptest::collection::vec(any::<u8>(), 0..256), mutated]
}

#[test]
fn fuzz_grpc_decoding() {
    use prost::Message;
    fuzz("gRPC request decoding (DRA v1, v1beta1, registration, health)", grpc_bytes(), |b| {
        let _ = dra_v1::NodePrepareResourcesRequest::decode(b.as_slice());
        let _ = dra_v1::NodeUnprepareResourcesRequest::decode(b.as_slice());
        let _ = dra_v1beta1::NodePrepareResourcesRequest::decode(b.as_slice());
        let _ = dra_v1beta1::NodeUnprepareResourcesRequest::decode(b.as_slice());
        let _ = registration::InfoRequest::decode(b.as_slice());
        let _ = registration::RegistrationStatus::decode(b.as_slice());
        let _ = health_v1alpha1::NodeWatchResourcesRequest::decode(b.as_slice());
        if let Ok(r) = dra_v1::NodePrepareResourcesRequest::decode(b.as_slice()) {
            // What decodes re-encodes to something that decodes the same.
            let again = dra_v1::NodePrepareResourcesRequest::decode(r.encode_to_vec().as_slice());
            prop_assert_eq!(again.ok(), Some(r));
        }
        Ok(())
    });
}

// === HTTP/2 request re-framing (every byte a client sends on a socket goes through it) ===

/// A client's byte stream: random bytes, or a valid preface + HEADERS + DATA with a few bytes
/// changed, cut into random pieces as a socket may deliver it.
fn h2_stream() -> impl Strategy<Value = (Vec<u8>, Vec<usize>)> {
    let block = loona_hpack::Encoder::new().encode([
        (&b":method"[..], &b"POST"[..]),
        (b":path", b"/pluginregistration.Registration/GetInfo"),
        (b":authority", b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock"),
    ]);
    let mut valid = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let len = block.len();
    valid.extend([(len >> 16) as u8, (len >> 8) as u8, len as u8, 0x1, 0x4, 0, 0, 0, 1]);
    valid.extend(block);
    valid.extend([0, 0, 5, 0x0, 0x1, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
    let mutated = proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6).prop_map(move |edits| {
        let mut b = valid.clone();
        for (at, byte) in edits {
            let at = 24 + at % (b.len() - 24);
            b[at] = byte;
        }
        b
    });
    let bytes = prop_oneof![proptest::collection::vec(any::<u8>(), 0..512), mutated];
    (bytes, proptest::collection::vec(1usize..64, 0..8))
}

#[test]
fn fuzz_h2_reframing() {
    use migdra::kubelet::authority::Rewriter;
    fuzz("HTTP/2 request re-framing (:authority)", h2_stream(), |(bytes, cuts)| {
        let mut out = Vec::new();
        let mut r = Rewriter::server();
        let mut rest = bytes.as_slice();
        for cut in cuts {
            let (piece, tail) = rest.split_at(cut.min(rest.len()));
            rest = tail;
            if r.feed(piece, &mut out).is_err() {
                return Ok(());
            }
        }
        let _ = r.feed(rest, &mut out);
        Ok(())
    });
}

// === regressions: crashes the targets above found ===

/// A map key whose fourth byte falls inside a multi-byte character panicked (`s[..4]`) instead of
/// being refused, so a bad ConfigMap crashed the daemon at startup. Found by `fuzz_slurm_index_map`.
#[test]
fn regression_index_map_key_with_multibyte_prefix() {
    for text in ["®\u{fffc}:", "GP\u{e9}-x: 1\n", "\u{1f600}: 0\n"] {
        let r = indexmap::parse(text, Path::new("map.yaml"));
        assert!(r.is_err(), "{text:?} was accepted: {r:?}");
    }
}
