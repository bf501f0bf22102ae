//! Property test of the simulator: random create/destroy sequences on a file-backed node of mixed
//! GPU models. After every step the hardware must be something NVML could hold, the simulator must
//! have answered each create exactly as the placement rules say, and the state file must round-trip.

use crate::support::command::Run;
use migdra::gpu::sim::{SimBackend, SimSpec, SimState};
use migdra::gpu::{GpuBackend, NvmlCode};
use migdra::mig::catalog::{self, GpuModel};
use migdra::mig::rules::{self, Placed};
use proptest::prelude::*;

const GPUS: usize = 4;

/// Three GPUs of different models where the catalog has them (h100-80gb always exists), plus a
/// fourth of any catalog model (`extra` indexes the catalog).
fn node_spec(extra: usize) -> SimSpec {
    let wanted = ["h100-80gb", "a100-40gb", "a30-24gb", "rtx-pro-6000", "b200-180gb"];
    let have: Vec<&str> = wanted.into_iter().filter(|k| catalog::model(k).is_some()).collect();
    let mut parts: Vec<String> = (0..3).map(|i| format!("{}:1", have[i % have.len()])).collect();
    let models = catalog::models();
    parts.push(format!("{}:1", models[extra % models.len()].key));
    SimSpec::parse(&parts.join(",")).unwrap()
}

#[derive(Debug, Clone)]
enum Step {
    /// A GI of the `profile`-th profile (or a profile ID no model has) at the `start`-th valid
    /// placement (or any start, valid or not), then maybe its default CI.
    Create { gpu: usize, profile: usize, bogus_profile: bool, start: usize, raw_start: Option<u32>, with_ci: bool },
    /// Destroy the `which`-th existing GI, its CIs first when `cis_first`.
    Destroy { gpu: usize, which: usize, cis_first: bool },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (
            0..GPUS,
            0..16usize,
            prop::bool::weighted(0.05),
            0..16usize,
            prop::option::weighted(0.2, 0..14u32),
            any::<bool>(),
        )
            .prop_map(|(gpu, profile, bogus_profile, start, raw_start, with_ci)| Step::Create {
                gpu, profile, bogus_profile, start, raw_start, with_ci
            }),
        2 => (0..GPUS, 0..16usize, any::<bool>())
            .prop_map(|(gpu, which, cis_first)| Step::Destroy { gpu, which, cis_first }),
    ]
}

fn placed(st: &SimState, gpu: usize) -> Vec<Placed> {
    st.gpus[gpu].gpu_instances.iter().map(|g| Placed { profile_id: g.profile_id, start: g.start }).collect()
}

/// The hardware invariants of one GPU.
fn check_gpu(st: &SimState, gpu: usize, model: &GpuModel) -> Result<(), TestCaseError> {
    let gis = &st.gpus[gpu].gpu_instances;
    for (i, a) in gis.iter().enumerate() {
        for b in &gis[i + 1..] {
            prop_assert!(a.start + a.size <= b.start || b.start + b.size <= a.start, "GPU {gpu}: {a:?} overlaps {b:?}");
            prop_assert_ne!(a.id, b.id, "GPU {}: two GIs with one ID", gpu);
        }
        prop_assert!(a.start + a.size <= model.memory_slices);
    }
    let set = placed(st, gpu);
    prop_assert!(rules::admits_set(model, &set).is_ok(), "GPU {gpu}: NVML could not hold {set:?}");
    let full = model.profiles.iter().find(|p| p.memory_slices == model.memory_slices).expect("a full-GPU profile");
    let mut sum = [0u64; 7];
    for g in gis {
        let p = model.profile(g.profile_id).expect("a catalog profile");
        let e = p.engines;
        let v = [
            p.memory_mib,
            p.multiprocessors.into(),
            e.copy.into(),
            e.decoders.into(),
            e.encoders.into(),
            e.jpeg.into(),
            e.ofa.into(),
        ];
        for (s, x) in sum.iter_mut().zip(v) {
            *s += x;
        }
        let ci_slices: u32 = g.compute_instances.iter().map(|c| c.size).sum();
        prop_assert!(ci_slices <= p.compute_slices);
    }
    let e = full.engines;
    let cap = [
        full.memory_mib,
        full.multiprocessors.into(),
        e.copy.into(),
        e.decoders.into(),
        e.encoders.into(),
        e.jpeg.into(),
        e.ofa.into(),
    ];
    let names = ["memory_mib", "multiprocessors", "copy", "decoders", "encoders", "jpeg", "ofa"];
    for ((s, c), n) in sum.iter().zip(cap).zip(names) {
        prop_assert!(*s <= c, "GPU {gpu} ({}): {n} {s} exceeds the full GPU's {c} with {set:?}", model.key);
    }
    Ok(())
}

fn run(extra: usize, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.json");
    let sim = SimBackend::open(&path, Some(&node_spec(extra))).unwrap();
    let models: Vec<GpuModel> = (0..GPUS).map(|g| sim.model(&g.to_string()).unwrap()).collect();
    let mut last = sim.state().unwrap();
    for s in steps {
        match s {
            Step::Create { gpu, profile, bogus_profile, start, raw_start, with_ci } => {
                let model = &models[gpu];
                let p = &model.profiles[profile % model.profiles.len()];
                let profile_id = if bogus_profile { 99 } else { p.id };
                let start = raw_start.unwrap_or(p.placements[start % p.placements.len()]);
                let expected = rules::admits(model, &placed(&last, gpu), Placed { profile_id, start });
                let got = sim.create_gpu_instance(&gpu.to_string(), profile_id, start);
                match (&expected, &got) {
                    (Ok(()), Ok(gi)) => {
                        prop_assert_eq!((gi.profile_id, gi.start, gi.size), (profile_id, start, p.memory_slices));
                        if with_ci {
                            let ci = p.default_ci().expect("a default CI");
                            let c = sim.create_compute_instance(&gpu.to_string(), gi.id, ci.id);
                            prop_assert!(c.is_ok(), "default CI in a fresh GI: {c:?}");
                        }
                    }
                    (Err(r), Err(e)) => {
                        let want = if r.is_insufficient_resources() {
                            NvmlCode::InsufficientResources
                        } else {
                            NvmlCode::InvalidArgument
                        };
                        prop_assert_eq!(e.code(), Some(want), "rules say {}", r);
                    }
                    _ => {
                        prop_assert!(false, "GPU {gpu} {profile_id}@{start}: rules say {expected:?}, sim says {got:?}")
                    }
                }
            }
            Step::Destroy { gpu, which, cis_first } => {
                let gis = &last.gpus[gpu].gpu_instances;
                if gis.is_empty() {
                    continue;
                }
                let gi = &gis[which % gis.len()];
                let g = gpu.to_string();
                if cis_first {
                    for ci in &gi.compute_instances {
                        sim.destroy_compute_instance(&g, gi.id, ci.id).unwrap();
                    }
                    sim.destroy_gpu_instance(&g, gi.id).unwrap();
                } else if gi.compute_instances.is_empty() {
                    sim.destroy_gpu_instance(&g, gi.id).unwrap();
                } else {
                    let e = sim.destroy_gpu_instance(&g, gi.id).unwrap_err();
                    prop_assert_eq!(e.code(), Some(NvmlCode::InUse));
                }
            }
        }
        last = sim.state().unwrap();
        for (gpu, model) in models.iter().enumerate() {
            check_gpu(&last, gpu, model)?;
        }
    }
    let reopened = SimBackend::open(&path, None).unwrap();
    prop_assert_eq!(reopened.state().unwrap(), last.clone());
    // Another process reads the same hardware from the file.
    let out = crate::support::command::migdra().args(["layout", "-o", "json", "--sim-state"]).arg(&path).run();
    prop_assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    prop_assert_eq!(v["boot_id"].as_str(), Some(last.boot_id.as_str()));
    for (gpu, sim_gpu) in last.gpus.iter().enumerate() {
        let mut seen: Vec<(u64, u64, u64, Vec<String>)> = v["gpus"][gpu]["instances"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| {
                        let uuids = i["compute_instances"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|c| c["uuid"].as_str().unwrap().to_string())
                            .collect();
                        (
                            i["gpu_instance_id"].as_u64().unwrap(),
                            i["profile_id"].as_u64().unwrap(),
                            i["placement"]["start"].as_u64().unwrap(),
                            uuids,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut want: Vec<(u64, u64, u64, Vec<String>)> = sim_gpu
            .gpu_instances
            .iter()
            .map(|g| {
                (
                    g.id.into(),
                    g.profile_id.into(),
                    g.start.into(),
                    g.compute_instances.iter().map(|c| c.uuid.clone()).collect(),
                )
            })
            .collect();
        seen.sort();
        want.sort();
        prop_assert_eq!(seen, want, "GPU {} as another process sees it", gpu);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_create_destroy_sequences_keep_the_hardware_valid(
        extra in 0..64usize,
        steps in prop::collection::vec(step(), 1..40),
    ) {
        run(extra, steps)?;
    }
}
