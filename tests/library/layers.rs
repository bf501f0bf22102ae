//! The crate's layering: no two top-level modules of `src/` import each other, directly or
//! through others. A cycle is where layers start to blur (kube → kubelet → metrics → kube was
//! one); this test names it. Comments and doc links are not imports.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Top-level module → the top-level modules its code names as `crate::<module>`.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = Vec::new();
    for entry in fs::read_dir(src).expect("src/").flatten() {
        let path = entry.path();
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        if path.is_dir() {
            let mut stack = vec![path.clone()];
            while let Some(dir) = stack.pop() {
                for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if p.extension().is_some_and(|x| x == "rs") {
                        files.push((name.clone(), p));
                    }
                }
            }
        } else if path.extension().is_some_and(|x| x == "rs") && !matches!(name.as_str(), "lib" | "main") {
            files.push((name, path));
        }
    }
    for (module, file) in files {
        let text = fs::read_to_string(&file).unwrap_or_default();
        let deps = out.entry(module.clone()).or_default();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let rest = &line[i + "crate::".len()..];
                let dep: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !dep.is_empty() && dep != module {
                    deps.insert(dep);
                }
            }
        }
    }
    out
}

/// A cycle through `start`, as the path of modules, if any.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![start.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().expect("a path has a module");
        for next in graph.get(last).into_iter().flatten() {
            if next == start {
                let mut found = path.clone();
                found.push(next.clone());
                return Some(found);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn no_two_modules_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let graph = imports(&root.join("src"));
    assert!(graph.len() > 10 && graph["cli"].contains("kube"), "read too little of src/: {graph:?}");
    let cycles: Vec<String> = graph.keys().filter_map(|m| cycle(&graph, m)).map(|c| c.join(" → ")).collect();
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
    // The pure domain imports only the primitives every layer shares.
    let primitives = BTreeSet::from(["causes", "duration", "files", "names", "pci"].map(String::from));
    assert!(graph["mig"].is_subset(&primitives), "mig/ is the pure domain: {:?}", graph["mig"]);
}

#[test]
fn the_daemon_is_wired_in_daemon_not_in_the_cli() {
    // `migdra serve` turns flags into a daemon::Config and calls daemon::Daemon; the tasks,
    // servers and the publisher are the daemon's (a CLI function that wires them drifts from
    // what a test or another program builds).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let serve = fs::read_to_string(root.join("src/cli/serve.rs")).expect("src/cli/serve.rs");
    assert!(serve.contains("Daemon::start"), "cli/serve.rs no longer starts the daemon");
    for dir in ["src/cli"] {
        for entry in fs::read_dir(root.join(dir)).expect("src/cli/").flatten() {
            let text = fs::read_to_string(entry.path()).unwrap_or_default();
            for wiring in ["kubelet::serve", "Publisher::new", "metrics::serve", "allocations::follow", "TaskTracker"] {
                assert!(
                    !text.contains(wiring),
                    "{} wires the daemon itself ({wiring}): that is daemon/'s job",
                    entry.path().display()
                );
            }
        }
    }
}
