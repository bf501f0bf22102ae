//! `migdra slices`: the ResourceSlices serve would publish for this node, built from the same GPUs,
//! modes and instances, and checked against the API server's rules. A dry run: it talks to no
//! server, so `--slice-layout auto` means split (Kubernetes 1.35 and newer) here.
//!
//! Output: a table (one row per slice), or `-o json` / `-o yaml`: a `v1` `List` of the slices, as
//! `kubectl get resourceslices -o json|yaml` prints them (`kubectl apply -f` takes it too).

use super::{CliError, CliResult, Format, Global, SliceLayoutFlag, backend, output};
use crate::kube::inventory;
use crate::kube::slices::{self, Layout};
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::Serialize;
use std::collections::BTreeSet;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Pool generation the slices carry
    #[arg(long, env = "MIGDRA_GENERATION", default_value_t = 1)]
    pub generation: i64,
    /// Node UID for the owner reference (serve reads it from the API server); none by default
    #[arg(long, env = "MIGDRA_NODE_UID", value_name = "UID")]
    pub node_uid: Option<String>,
}

/// `kubectl`'s list of mixed objects.
#[derive(Serialize)]
struct List<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    items: &'a [ResourceSlice],
}

/// The layout a dry run uses: the flag's, with auto = split.
fn layout(flag: SliceLayoutFlag) -> Layout {
    match flag {
        SliceLayoutFlag::Combined => Layout::Combined,
        SliceLayoutFlag::Split | SliceLayoutFlag::Auto => Layout::Split,
    }
}

pub fn run(args: &Args, global: &Global, out: &mut dyn Write) -> CliResult {
    if args.generation < 0 {
        return Err(CliError::Usage(format!("--generation {}: must be 0 or more", args.generation)));
    }
    let node = backend::node_name(global);
    if node.is_empty() {
        return Err(CliError::Usage("no node name: pass --node-name or set NODE_NAME".into()));
    }
    if !crate::names::is_dns_subdomain(&node) {
        return Err(CliError::Usage(format!("--node-name {node:?} is not a DNS subdomain, as node names are")));
    }
    let driver = &global.node.driver_name;
    if !crate::names::is_dns_subdomain(driver) || driver.len() > slices::MAX_DRIVER_LEN {
        return Err(CliError::Usage(format!(
            "--driver-name {driver:?} is not a DNS subdomain of at most {} characters",
            slices::MAX_DRIVER_LEN
        )));
    }
    let layout = layout(global.node.slice_layout);
    let taints = global.node.taint_policy()?;
    // The engine makes its state directory; a dry run creates nothing, and the GPUs, modes and
    // instances it reads do not depend on that directory.
    let mut dry = global.clone();
    if !backend::state_dir(global).is_dir() {
        dry.node.state_dir = Some(std::env::temp_dir());
    }
    let engine = backend::engine(&dry)?;
    let opts = inventory::PublishOptions { order: global.node.device_order.into(), taints };
    let gpus = inventory::node_gpus_with(&engine, false, opts)?;
    let built = slices::build(driver, &node, args.node_uid.as_deref(), args.generation, layout, &gpus)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let problems = slices::validate(&built, layout);
    if !problems.is_empty() {
        return Err(CliError::Failed(format!(
            "{} slices ({layout} layout) break {} API rule(s): {}",
            built.len(),
            problems.len(),
            problems.join("; ")
        )));
    }
    match global.output {
        Format::Json | Format::Yaml => {
            output::data(out, global.output, &List { api_version: "v1", kind: "List", items: &built })?
        }
        Format::Table => table(&built, layout, out)?,
    }
    Ok(())
}

/// `0-3,5,7-8`.
fn ranges(minors: &BTreeSet<u32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut run: Option<(u32, u32)> = None;
    for &m in minors {
        run = match run {
            Some((a, b)) if m == b + 1 => Some((a, m)),
            Some((a, b)) => {
                parts.push(if a == b { a.to_string() } else { format!("{a}-{b}") });
                Some((m, m))
            }
            None => Some((m, m)),
        };
    }
    if let Some((a, b)) = run {
        parts.push(if a == b { a.to_string() } else { format!("{a}-{b}") });
    }
    if parts.is_empty() { "-".into() } else { parts.join(",") }
}

/// The minors of the GPUs a slice covers: from its devices' `minor` attribute and its counter
/// sets' `gpu-<minor>-counters` names.
fn gpus_of(s: &ResourceSlice) -> BTreeSet<u32> {
    let from_devices = s
        .spec
        .devices
        .iter()
        .flatten()
        .filter_map(|d| d.attributes.as_ref()?.get("minor")?.int.and_then(|m| u32::try_from(m).ok()));
    let from_sets = s
        .spec
        .shared_counters
        .iter()
        .flatten()
        .filter_map(|c| c.name.strip_prefix("gpu-")?.strip_suffix("-counters")?.parse().ok());
    from_devices.chain(from_sets).collect()
}

fn table(built: &[ResourceSlice], layout: Layout, out: &mut dyn Write) -> std::io::Result<()> {
    let rows: Vec<Vec<String>> = built
        .iter()
        .map(|s| {
            let devices = s.spec.devices.as_ref().map_or(0, Vec::len);
            let sets = s.spec.shared_counters.as_deref().unwrap_or_default();
            let kind = match (devices > 0, !sets.is_empty()) {
                (true, true) => "devices+counters",
                (true, false) => "devices",
                (false, true) => "counters",
                (false, false) => "empty",
            };
            vec![
                s.metadata.name.clone().unwrap_or_default(),
                kind.to_string(),
                devices.to_string(),
                sets.len().to_string(),
                sets.iter().map(|c| c.counters.len()).sum::<usize>().to_string(),
                ranges(&gpus_of(s)),
            ]
        })
        .collect();
    output::table(out, &["NAME", "KIND", "DEVICES", "COUNTER SETS", "COUNTERS", "GPUS (minor)"], &rows)?;
    if let Some(first) = built.first() {
        let p = &first.spec.pool;
        writeln!(
            out,
            "pool {} of {}: generation {}, {} slices, {layout} layout",
            p.name,
            first.spec.driver,
            p.generation,
            built.len()
        )?;
    } else {
        writeln!(out, "no GPUs to publish")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minors_print_as_ranges() {
        assert_eq!(ranges(&BTreeSet::from([0, 1, 2, 3, 5, 7, 8])), "0-3,5,7-8");
        assert_eq!(ranges(&BTreeSet::from([4])), "4");
        assert_eq!(ranges(&BTreeSet::new()), "-");
    }
}
