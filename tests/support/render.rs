//! What `kustomize build` and `helm template` make of daemonset/: the two binaries, found the
//! same way, and their renders as JSON documents.
//!
//! - A binary comes from its variable (`MIGDRA_KUSTOMIZE`, `MIGDRA_HELM`), else from the cache
//!   its hack/build-*.sh script fills for the version its hack/*/go.mod pins.
//! - Without one a test skips what needs it, saying so, unless `MIGDRA_REQUIRE_RENDERS=1` (set by
//!   .ci/run, which builds both first): then it fails with the command that builds it.
//!
//! tests/library/manifests.rs includes this file alone (`#[path]`), so it uses nothing else of support/,
//! and allows what that binary leaves unused, as support/mod.rs does for the rest.
#![allow(dead_code)]

use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The chart, relative to the repository.
pub const CHART: &str = "daemonset/helm/migdra";
/// The release name and namespace the chart is rendered with, as daemonset/README.md installs it.
pub const RELEASE: &str = "migdra";
pub const NAMESPACE: &str = "migdra-system";
/// Where the chart keeps a values file per kustomize overlay (`<overlay>-values.yaml`) and the
/// file that sets every value (`every-value-values.yaml`).
pub const CHART_VALUES_DIR: &str = "daemonset/helm/migdra/ci";

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One of the two renderers.
#[derive(Debug, Clone, Copy)]
pub struct Tool {
    /// Its binary's name, and the cache directory's prefix.
    pub name: &'static str,
    /// The variable naming a binary to use.
    pub env: &'static str,
    /// hack/<dir>/go.mod pins it.
    pub go_mod_dir: &'static str,
    /// The module path in that go.mod's `require` line.
    pub module: &'static str,
    /// The `MIGDRA_REQUIRE_*` variable that makes a missing binary fail the test (tests/support/skip.rs).
    pub require: &'static str,
}

pub const KUSTOMIZE: Tool = Tool {
    name: "kustomize",
    env: "MIGDRA_KUSTOMIZE",
    go_mod_dir: "kustomize",
    module: "sigs.k8s.io/kustomize/kustomize/v5",
    require: REQUIRE,
};

pub const HELM: Tool =
    Tool { name: "helm", env: "MIGDRA_HELM", go_mod_dir: "helm", module: "helm.sh/helm/v4", require: REQUIRE };

/// Prometheus' rule checker and tester, for the chart's alerts (tests/library/alerts.rs).
pub const PROMTOOL: Tool = Tool {
    name: "promtool",
    env: "MIGDRA_PROMTOOL",
    go_mod_dir: "promtool",
    module: "github.com/prometheus/prometheus",
    require: super::skip::PROMTOOL,
};

/// `MIGDRA_REQUIRE_RENDERS=1`: a missing renderer fails the test instead of skipping.
pub const REQUIRE: &str = super::skip::RENDERS;

impl Tool {
    /// The binary: the variable's, else the cached build of the pinned version; `None` (after
    /// saying so) when there is none and its `require` variable is not set.
    ///
    /// # Panics
    /// The variable names no file, or there is none and its `require` variable is set.
    #[allow(clippy::print_stdout)] // the skip is said in the test's output, as support/slurm.rs does
    pub fn find(self) -> Option<PathBuf> {
        let build = format!("bash hack/build-{}.sh", self.name);
        if let Some(path) = std::env::var_os(self.env).map(PathBuf::from) {
            assert!(
                path.is_file(),
                "{}={}: no such file; unset it or build one with `{build}`",
                self.env,
                path.display()
            );
            return Some(path);
        }
        let cached = self.cached();
        if let Some(path) = cached.as_ref().filter(|p| p.is_file()) {
            return Some(path.clone());
        }
        let why = format!(
            "no {} at {} and {} is unset; build it with `{build}` (cached, a few minutes cold)",
            self.name,
            cached.map_or_else(|| "(no cache directory)".into(), |p| p.display().to_string()),
            self.env
        );
        super::skip::skip(self.require, &format!("{}: {why}", self.name));
        None
    }

    /// `${MIGDRA_CACHE:-$HOME/.cache/migdra}/<name>-<version>/bin/<name>`, as hack/build-<name>.sh
    /// writes it.
    fn cached(self) -> Option<PathBuf> {
        let go_mod = repo().join("hack").join(self.go_mod_dir).join("go.mod");
        let text = std::fs::read_to_string(&go_mod).unwrap_or_else(|e| panic!("{}: {e}", go_mod.display()));
        let prefix = format!("require {} ", self.module);
        let version = text
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{}: no `{prefix}vX` line", go_mod.display()))
            .trim();
        let cache = std::env::var_os("MIGDRA_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/migdra")))?;
        Some(cache.join(format!("{}-{version}/bin/{}", self.name, self.name)))
    }
}

/// Run `bin args…` in the repository; its stdout, or a panic with its stderr.
pub fn run(bin: &Path, args: &[&str]) -> String {
    let out =
        Command::new(bin).args(args).current_dir(repo()).output().unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {} failed ({}): {}",
        bin.display(),
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `kustomize build DIR` (relative to the repository).
pub fn kustomize_build(kustomize: &Path, dir: &str) -> String {
    run(kustomize, &["build", dir])
}

/// `helm template migdra daemonset/helm/migdra -n migdra-system ARGS…`.
pub fn helm_template(helm: &Path, args: &[&str]) -> String {
    let mut all = vec!["template", RELEASE, CHART, "-n", NAMESPACE];
    all.extend_from_slice(args);
    run(helm, &all)
}

/// The chart's values files under [`CHART_VALUES_DIR`], relative to the repository, sorted.
pub fn chart_values_files() -> Vec<String> {
    let dir = repo().join(CHART_VALUES_DIR);
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with("-values.yaml"))
        .map(|n| format!("{CHART_VALUES_DIR}/{n}"))
        .collect();
    files.sort();
    files
}

/// The documents of a YAML text as JSON, empty ones left out.
///
/// # Panics
/// A document is not YAML; `source` names the text.
pub fn documents(source: &str, text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .enumerate()
        .map(|(i, d)| Value::deserialize(d).unwrap_or_else(|e| panic!("{source}: document {i}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// Every environment variable some `migdra` flag reads (each flag's environment twin): the
/// `MIGDRA_*` variables a render may set.
pub fn cli_env() -> std::collections::BTreeSet<String> {
    fn walk(cmd: &clap::Command, out: &mut std::collections::BTreeSet<String>) {
        out.extend(cmd.get_arguments().filter_map(|a| a.get_env()).map(|e| e.to_string_lossy().into_owned()));
        cmd.get_subcommands().for_each(|s| walk(s, out));
    }
    let mut out = std::collections::BTreeSet::new();
    walk(&<migdra::cli::Cli as clap::CommandFactory>::command(), &mut out);
    out
}
