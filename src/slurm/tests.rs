use super::*;

/// Four GPUs whose minors (3, 0, 12, 7) follow neither NVML order nor each other.
fn gpus() -> Vec<NodeGpu> {
    [(0, 3), (1, 0), (2, 12), (3, 7)]
        .into_iter()
        .map(|(i, minor)| NodeGpu {
            nvml_index: i,
            minor,
            uuid: format!("GPU-0000000{i}"),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i),
            mig_enabled: true,
            memory_slices: 8,
            migs: Vec::new(),
        })
        .collect()
}

struct Node {
    dir: tempfile::TempDir,
    settings: Settings,
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings {
            index_map: None,
            slurm_conf: dir.path().join("slurm.conf"),
            gres_conf: None,
            slurmd: None,
            node_name: "vm".into(),
            shards_per_gpu: None,
        };
        Self { dir, settings }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// slurm.conf with per-GPU types in `types` order, gres.conf with `gres` lines.
    fn slurm(&self, gres_items: &str, gres: &str) {
        self.write("slurm.conf", &format!("ClusterName=t\nNodeName=vm CPUs=4 Gres={gres_items}\n"));
        self.write("gres.conf", gres);
    }

    fn resolve(&self, gpus: &[NodeGpu]) -> Resolution {
        resolve(&self.settings, gpus).unwrap()
    }
}

fn indexes(r: &Resolution) -> Vec<Option<u32>> {
    r.gpus.iter().map(|g| g.index).collect()
}

fn warnings(r: &Resolution) -> Vec<&str> {
    r.notes.iter().filter(|n| n.warning).map(|n| n.message.as_str()).collect()
}

const GRES: &str = "AutoDetect=off\n# minors 7, 0 typed b; 12, 3 typed a\n\
                    Name=gpu Type=b File=/dev/nvidia7\nName=gpu Type=a File=/dev/nvidia[12,3]\n\
                    Name=gpu Type=b File=/dev/nvidia0\nName=shard Count=14 File=/dev/nvidia[12,3]\n";

#[test]
fn without_slurm_nvml_order_and_memory_slices() {
    let n = Node::new();
    let r = n.resolve(&gpus());
    assert_eq!(r.source, Source::Nvml);
    assert_eq!(indexes(&r), [Some(0), Some(1), Some(2), Some(3)]);
    assert!(r.gpus.iter().all(|g| g.shards == 8 && g.source == Source::Nvml));
    assert!(warnings(&r).is_empty(), "{:?}", r.notes);
    assert!(r.notes[0].message.contains("Slurm's configuration is not on this node"));
}

#[test]
fn gres_conf_emulation_by_device_file() {
    let n = Node::new();
    n.slurm("gpu:a:2,gpu:b:2,shard:14", GRES);
    let r = n.resolve(&gpus());
    assert_eq!(r.source, Source::GresConf, "{:?}", r.notes);
    // a: nvidia12 → 0, nvidia3 → 1; b: nvidia7 → 2, nvidia0 → 3. GPUs in NVML order: minors 3, 0, 12, 7.
    assert_eq!(indexes(&r), [Some(1), Some(3), Some(0), Some(2)]);
    // 14 shards over nvidia12 and nvidia3; the b GPUs have none in Slurm.
    assert_eq!(r.gpus.iter().map(|g| g.shards).collect::<Vec<_>>(), [7, 0, 7, 0]);
    assert!(r.rule.contains("type order"), "{}", r.rule);
    assert!(warnings(&r).is_empty(), "{:?}", r.notes);
}

#[test]
fn shards_flag_applies_only_where_slurm_says_nothing() {
    let mut n = Node::new();
    n.slurm("gpu:a:2,gpu:b:2", GRES.replace("Name=shard Count=14 File=/dev/nvidia[12,3]\n", "").as_str());
    n.settings.shards_per_gpu = Some(4);
    let r = n.resolve(&gpus());
    assert!(r.gpus.iter().all(|g| g.shards == 4));
    n.slurm("gpu:a:2,gpu:b:2,shard:14", GRES);
    let r = n.resolve(&gpus());
    assert_eq!(r.gpus.iter().map(|g| g.shards).collect::<Vec<_>>(), [7, 0, 7, 0]);
    assert!(warnings(&r).iter().any(|w| w.contains("--shards-per-gpu 4") && w.contains("7 shards")), "{:?}", r.notes);
}

#[test]
fn admin_map_wins_and_conflicts_are_loud() {
    let mut n = Node::new();
    n.slurm("gpu:a:2,gpu:b:2", GRES);
    n.settings.index_map =
        Some(n.write("map.yaml", "GPU-00000000: 1\nGPU-00000001: 3\n\"0000:1a:00.0\": 2\nGPU-00000003: 0\n"));
    let r = n.resolve(&gpus());
    assert_eq!(r.source, Source::AdminMap);
    assert_eq!(indexes(&r), [Some(1), Some(3), Some(2), Some(0)]);
    let w = warnings(&r);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[0].starts_with("CONFLICT: admin-map gives GPU GPU-00000002 (minor 12) Slurm index 2, gres.conf gives 0"),
        "{w:?}"
    );
}

#[test]
fn bad_sources_fall_back_naming_file_and_line() {
    let mut n = Node::new();
    n.slurm("gpu:a:2,gpu:b:2", "AutoDetect=off\nName=gpu Type=a File=/dev/nvidia[12,3\n");
    let r = n.resolve(&gpus());
    assert_eq!(r.source, Source::Nvml);
    let w = warnings(&r);
    assert_eq!(w.len(), 1, "{w:?}");
    let gres = n.dir.path().join("gres.conf");
    assert!(w[0].starts_with(&format!("gres.conf unusable: {}:2: File=/dev/nvidia[12,3:", gres.display())), "{w:?}");
    assert!(w[0].ends_with("; falling back to nvml"), "{w:?}");

    // A GPU that is not on this node.
    n.slurm("gpu:a:2,gpu:b:2", &GRES.replace("nvidia7", "nvidia9"));
    let w = warnings(&n.resolve(&gpus())).join("\n");
    assert!(
        w.contains(&format!(
            "{}:3: /dev/nvidia9 (Slurm index 2) is not a GPU on this node; GPU minors here: 3, 0, 12, 7",
            gres.display()
        )),
        "{w}"
    );

    // A GPU with MIG off that Slurm does not list: unusable. With MIG on (static MIG, left out
    // by `migdra slurm-conf`) it only has no index.
    n.slurm("gpu:a:2,gpu:b:1", &GRES.replace("Name=gpu Type=b File=/dev/nvidia0\n", ""));
    let mut g = gpus();
    g[1].mig_enabled = false;
    let w = warnings(&n.resolve(&g)).join("\n");
    assert!(w.contains("GPU GPU-00000001 (/dev/nvidia0) is not in Slurm's GPU list"), "{w}");
    let r = n.resolve(&gpus());
    assert_eq!((r.source, indexes(&r)), (Source::GresConf, vec![Some(1), None, Some(0), Some(2)]));
    assert!(warnings(&r).is_empty(), "{:?}", r.notes);

    // Unknown keys.
    n.slurm("gpu:a:2,gpu:b:2", &format!("{GRES}Flags=x Colour=blue\n"));
    let w = warnings(&n.resolve(&gpus())).join("\n");
    assert!(w.contains("gres.conf:7: unknown key \"Colour\""), "{w}");

    // A map that gives two GPUs one index is refused outright, naming both and the index: no
    // fallback, since the administrator said the other sources are wrong.
    n.slurm("gpu:a:2,gpu:b:2", GRES);
    let map = n.write("map.yaml", "GPU-00000000: 1\n0000:19:00.0: 1\nGPU-00000002: 0\n");
    n.settings.index_map = Some(map.clone());
    let e = resolve(&n.settings, &gpus()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{}: GPU GPU-00000000 (line 1) and GPU GPU-00000001 (as 0000:19:00.0, line 2) both \
             have Slurm index 1 on this node; give each GPU of a node its own index",
            map.display()
        )
    );

    // A map that does not cover a GPU with MIG off, or with a non-integer: unusable.
    n.settings.index_map = Some(n.write("map.yaml", "GPU-99: 1\nGPU-00000000: 0\nGPU-00000002: 1\n"));
    let mut g = gpus();
    g[3].mig_enabled = false;
    assert!(warnings(&n.resolve(&g))[0].contains("map.yaml does not map GPU GPU-00000003"));
    // MIG GPUs it leaves out (static MIG, which Slurm does not schedule) have no index.
    g[3].mig_enabled = true;
    n.settings.index_map = Some(n.write("map.yaml", "GPU-00000000: 0\nGPU-00000002: 1\nGPU-00000003: 2\n"));
    let r = n.resolve(&g);
    assert_eq!((r.source, indexes(&r)), (Source::AdminMap, vec![Some(0), None, Some(1), Some(2)]));
    assert!(
        r.notes.iter().any(|n| !n.warning
            && n.message.starts_with("GPU GPU-00000001 (minor 0, MIG on) has no Slurm index: admin-map lists neither")),
        "{:?}",
        r.notes
    );
    n.settings.index_map = Some(n.write("map.yaml", "GPU-00000000: one\n"));
    assert!(
        warnings(&n.resolve(&gpus()))[0]
            .contains("map.yaml:1: index \"one\" of GPU-00000000 is not a non-negative integer")
    );
}

/// One map for a whole cluster: other nodes' GPUs are ignored, so indexes repeat across nodes;
/// a map naming none of this node's GPUs (or `{}`) leaves the decision to the next source.
#[test]
fn one_map_serves_every_node() {
    let mut n = Node::new();
    n.settings.index_map = Some(n.write(
        "map.yaml",
        "GPU-other-node-0: 0\nGPU-other-node-1: 1\nGPU-00000000: 3\nGPU-00000001: 2\n\
         GPU-00000002: 1\nGPU-00000003: 0\n",
    ));
    let r = n.resolve(&gpus());
    assert_eq!((r.source, indexes(&r)), (Source::AdminMap, vec![Some(3), Some(2), Some(1), Some(0)]));
    assert!(warnings(&r).is_empty(), "{:?}", r.notes);
    // Homogeneous nodes: one map by PCI bus ID fits them all; a UUID entry is more specific.
    n.settings.index_map = Some(n.write(
        "map.yaml",
        "0000:18:00.0: 3\n0000:19:00.0: 2\n0000:1a:00.0: 1\n0000:1b:00.0: 0\nGPU-00000000: 3\nGPU-00000003: 2\n",
    ));
    // GPU 3's UUID entry (2) outranks its bus ID entry (0), which leaves GPU 1 (bus ID: 2) on
    // the same index: refused.
    let e = resolve(&n.settings, &gpus()).unwrap_err().to_string();
    assert!(
        e.contains("GPU GPU-00000001 (as 0000:19:00.0, line 2) and GPU GPU-00000003 (line 6) both have Slurm index 2"),
        "{e}"
    );
    n.settings.index_map = Some(n.write(
        "map.yaml",
        "0000:18:00.0: 3\n0000:19:00.0: 2\n0000:1a:00.0: 1\n0000:1b:00.0: 0\nGPU-00000000: 3\nGPU-00000003: 0\n",
    ));
    let r = n.resolve(&gpus());
    assert_eq!((r.source, indexes(&r)), (Source::AdminMap, vec![Some(3), Some(2), Some(1), Some(0)]));
    assert!(warnings(&r).is_empty(), "{:?}", r.notes);
    n.settings.index_map = Some(
        n.write("map.yaml", "0000:1b:00.0: 0\nGPU-00000003: 1\nGPU-00000001: 2\nGPU-00000000: 3\nGPU-00000002: 0\n"),
    );
    let r = n.resolve(&gpus());
    let w = warnings(&r);
    assert!(
        w[0].contains("map.yaml:2: GPU-00000003 maps GPU GPU-00000003 to 1, but 0000:1b:00.0 (")
            && w[0].ends_with("using the UUID's"),
        "{w:?}"
    );
    n.settings.index_map = Some(n.write("map.yaml", "# none yet\n{}\n"));
    let r = n.resolve(&gpus());
    assert_eq!(r.source, Source::Nvml);
    assert!(warnings(&r).is_empty(), "an empty map is not a problem: {:?}", r.notes);
    assert!(r.notes.iter().any(|n| n.message.contains("names no GPU of this node")), "{:?}", r.notes);
}

#[test]
fn slurmd_outranks_the_emulation() {
    let mut n = Node::new();
    n.slurm("gpu:a:2,gpu:b:2", GRES);
    // A stand-in slurmd of a release migdra does not know, that orders b before a.
    let script = "#!/bin/sh\n[ \"$1\" = -V ] && { echo 'slurm 27.11.0'; exit 0; }\n\
                  for f in 7 0 12 3; do echo \"slurmd: Gres Name=gpu Type=x Count=1 Index=$f ID=1 \
                  File=/dev/nvidia$f (null)\" >&2; done\n";
    let bin = n.write("slurmd", script);
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    n.settings.slurmd = Some(bin);
    let r = n.resolve(&gpus());
    assert_eq!(r.source, Source::Slurmd, "{:?}", r.notes);
    assert_eq!(indexes(&r), [Some(3), Some(1), Some(2), Some(0)]);
    assert_eq!(r.version.as_deref(), Some("27.11.0"));
    let w = warnings(&r);
    assert_eq!(w.len(), 5, "{w:?}");
    assert_eq!(w.iter().filter(|w| w.starts_with("CONFLICT: slurmd gives")).count(), 4, "{w:?}");
    let unknown = "Slurm 27.11.0 (";
    let assumed = "not a release migdra was checked against (22.05 to 26.05); assuming";
    assert!(w.iter().any(|w| w.starts_with(unknown) && w.contains(assumed)), "{w:?}");

    n.settings.slurmd = Some("no-such-slurmd-binary".into());
    let r = n.resolve(&gpus());
    assert_eq!(r.source, Source::GresConf);
    assert!(r.notes.iter().any(|n| !n.warning && n.message.contains("no-such-slurmd-binary) is not on this node")));
}

#[test]
fn static_mig_instances_get_their_own_index() {
    let mut g = gpus();
    g[1].migs =
        vec![NodeMig { gi: 1, ci: 0, gi_cap: 21, ci_cap: 22 }, NodeMig { gi: 2, ci: 0, gi_cap: 30, ci_cap: 31 }];
    let n = Node::new();
    n.slurm(
        "gpu:5",
        "Name=gpu File=/dev/nvidia[3,12,7]\n\
         Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap[30-31]\n\
         Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22\n",
    );
    let r = n.resolve(&g);
    assert_eq!(r.source, Source::GresConf, "{:?}", r.notes);
    assert_eq!(indexes(&r), [Some(0), None, Some(1), Some(2)]);
    assert_eq!(r.gpus[1].mig_index(2, 0), Some(3));
    assert_eq!(r.gpus[1].mig_index(1, 0), Some(4));
    // Capability files of an instance that is not there.
    n.slurm(
        "gpu:4",
        "Name=gpu File=/dev/nvidia[3,12,7]\nName=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap[40-41]\n",
    );
    let w = warnings(&n.resolve(&g)).join("\n");
    assert!(
        w.contains(
            "gres.conf:2: Slurm index 3 names nvidia-cap40,nvidia-cap41 on GPU minor 0, \
             which match no MIG instance there"
        ),
        "{w}"
    );
}

#[test]
fn autodetect_nvml_puts_mig_instances_last() {
    let mut g = gpus();
    g[0].mig_enabled = false;
    g[2].mig_enabled = false;
    g[3].mig_enabled = false;
    g[1].migs =
        vec![NodeMig { gi: 1, ci: 0, gi_cap: 21, ci_cap: 22 }, NodeMig { gi: 2, ci: 0, gi_cap: 12, ci_cap: 13 }];
    let n = Node::new();
    n.slurm("gpu:5", "AutoDetect=nvml\n");
    let r = n.resolve(&g);
    assert_eq!(r.source, Source::GresConf);
    assert_eq!(indexes(&r), [Some(0), None, Some(1), Some(2)]);
    assert_eq!((r.gpus[1].mig_index(2, 0), r.gpus[1].mig_index(1, 0)), (Some(3), Some(4)));
    assert!(r.rule.contains("AutoDetect=nvml"));
}
