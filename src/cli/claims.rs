//! `migdra claims`: what the checkpoint holds, and prepare/unprepare/recover by hand.
//!
//! Safe next to a running daemon: the engine takes the same per-GPU and checkpoint locks.
//! In builds with the `crash-points` feature (the tests'), `MIGDRA_CRASH_AT=<step>` kills the
//! process right after that step, so tests can prove that a kill at any point converges (steps:
//! prepare-started, gi-created, ci-created, metadata-written, cdi-written, prepare-completed, unprepare-started,
//! cdi-deleted, ci-destroyed, gi-destroyed, claim-dropped).

use super::{CliError, CliResult, Format, Global, backend, output};
use crate::claims::{ClaimRef, ClaimSource, DirSource};
use crate::state::{AdminRecord, ClaimRecord};
use serde::Serialize;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<ClaimsCommand>,
}

#[derive(Debug, clap::Subcommand)]
pub enum ClaimsCommand {
    /// List the claims in the checkpoint (the default)
    List,
    /// Prepare a claim from --claims-dir, as the kubelet would
    Prepare {
        /// Claim UID (metadata.uid)
        uid: String,
    },
    /// Unprepare a claim, as the kubelet would
    Unprepare { uid: String },
    /// Run startup recovery: checkpoint check, reboot detection, orphan sweep
    Recover,
}

#[derive(Serialize)]
struct ClaimView<'a> {
    uid: &'a str,
    namespace: &'a str,
    name: &'a str,
    state: String,
    devices: Vec<DeviceView<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    needs_recreate: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<&'a str>,
}

#[derive(Serialize, Default)]
struct DeviceView<'a> {
    device: &'a str,
    gpu: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_instance_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compute_instance_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mig_uuid: Option<&'a str>,
}

pub fn run(args: &Args, global: &Global, out: &mut dyn Write) -> CliResult {
    match args.command.as_ref().unwrap_or(&ClaimsCommand::List) {
        ClaimsCommand::List => list(global, out),
        ClaimsCommand::Prepare { uid } => {
            let engine = backend::engine(global)?;
            let dir = global.node.claims_dir.as_deref().ok_or_else(|| {
                CliError::Usage("claims prepare reads the claim from a directory: pass --claims-dir DIR".into())
            })?;
            let wanted = ClaimRef { uid: uid.clone(), ..Default::default() };
            let claim = DirSource::new(dir)
                .get(&wanted)
                .map_err(|e| CliError::Usage(e.to_string()))?
                .ok_or_else(|| CliError::Usage(format!("no claim with UID {uid} in {}", dir.display())))?;
            let prepared = engine.prepare_claim(&claim).map_err(|e| CliError::Failed(e.to_string()))?;
            match global.output {
                Format::Json | Format::Yaml => {
                    let view: Vec<_> = prepared
                        .iter()
                        .map(|p| {
                            serde_json::json!({
                                "device": p.device, "requests": p.requests, "cdiIDs": p.cdi_ids, "data": p.status
                            })
                        })
                        .collect();
                    output::data(out, global.output, &view)?;
                }
                Format::Table => {
                    for p in &prepared {
                        let what = p.status.mig_uuid.as_deref().unwrap_or(&p.status.parent_uuid);
                        writeln!(out, "{}  {}  {}", p.device, what, p.cdi_ids.join(","))?;
                    }
                }
            }
            Ok(())
        }
        ClaimsCommand::Unprepare { uid } => {
            backend::engine(global)?.unprepare(uid).map_err(|e| CliError::Failed(e.to_string()))?;
            writeln!(out, "unprepared {uid}")?;
            Ok(())
        }
        ClaimsCommand::Recover => {
            let report = backend::engine(global)?.recover().map_err(|e| CliError::Failed(e.to_string()))?;
            match global.output {
                Format::Json | Format::Yaml => output::data(out, global.output, &report)?,
                Format::Table => {
                    writeln!(out, "checkpoint: {}", report.checkpoint)?;
                    if let Some((moved, reason)) = &report.corrupt {
                        writeln!(out, "  corrupt ({reason}); moved to {}", moved.display())?;
                    }
                    writeln!(out, "boot changed: {}", report.boot_changed)?;
                    for o in &report.orphans {
                        writeln!(
                            out,
                            "orphan GI {} (profile {}, start {}) on {}: {:?}",
                            o.gi_id, o.profile_id, o.start, o.gpu, o.action
                        )?;
                    }
                }
            }
            Ok(())
        }
    }
}

fn list(global: &Global, out: &mut dyn Write) -> CliResult {
    let store = crate::state::CheckpointStore::new(&backend::state_dir(global));
    let cp = store.read().map_err(|e| CliError::Failed(e.to_string()))?;
    // Admin-access claims last, in a state of their own: they hold a spec and no instance.
    let views: Vec<ClaimView> = cp.claims.values().map(view).chain(cp.admin.values().map(admin_view)).collect();
    match global.output {
        Format::Json | Format::Yaml => output::data(out, global.output, &views)?,
        Format::Table => {
            let rows: Vec<Vec<String>> = views
                .iter()
                .flat_map(|c| {
                    c.devices.iter().map(move |d| {
                        vec![
                            c.uid.to_string(),
                            format!("{}/{}", c.namespace, c.name),
                            c.state.clone(),
                            d.device.to_string(),
                            d.mig_uuid.unwrap_or("-").to_string(),
                        ]
                    })
                })
                .collect();
            if !rows.is_empty() {
                output::table(out, &["UID", "CLAIM", "STATE", "DEVICE", "MIG UUID"], &rows)?;
            }
        }
    }
    Ok(())
}

fn admin_view(c: &AdminRecord) -> ClaimView<'_> {
    ClaimView {
        uid: &c.uid,
        namespace: &c.namespace,
        name: &c.name,
        state: "AdminAccess".into(),
        devices: c
            .devices
            .iter()
            .map(|d| DeviceView { device: &d.device, gpu: &d.gpu_uuid, ..Default::default() })
            .collect(),
        needs_recreate: false,
        last_error: None,
    }
}

fn view(c: &ClaimRecord) -> ClaimView<'_> {
    ClaimView {
        uid: &c.uid,
        namespace: &c.namespace,
        name: &c.name,
        state: c.state.to_string(),
        devices: c
            .devices
            .iter()
            .map(|d| DeviceView {
                device: &d.device,
                gpu: &d.gpu_uuid,
                gpu_instance_id: d.mig.as_ref().and_then(|m| m.gi_id),
                compute_instance_id: d.mig.as_ref().and_then(|m| m.ci_id),
                mig_uuid: d.mig.as_ref().and_then(|m| m.uuid.as_deref()),
            })
            .collect(),
        needs_recreate: c.needs_recreate,
        last_error: c.last_error.as_deref(),
    }
}
