//! `migdra cleanup`: MIG instances no claim explains (dynamic GPUs only), CDI specs and device
//! metadata without a claim, prepared claims whose spec is missing or changed, and prepared claims
//! whose instance is gone. `--dry-run` prints what it would do and changes nothing; without it the
//! same list is done, each change re-checked under the daemon's own lock, so it is safe next to a
//! running `migdra serve`. Exit 1 when any change failed.

use super::{CliError, CliResult, Format, Global, backend, output};
use crate::prepare::CleanupReport;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print what would be done and change nothing
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(args: &Args, global: &Global, out: &mut dyn Write) -> CliResult {
    let engine = if args.dry_run { backend::read_engine(global)? } else { backend::engine_with_events(global, false)? };
    let report = engine.cleanup(args.dry_run).map_err(|e| CliError::Failed(e.to_string()))?;
    match global.output {
        Format::Json | Format::Yaml => output::data(out, global.output, &report)?,
        Format::Table => table(&report, out)?,
    }
    if report.failed() {
        return Err(CliError::Failed(
            "cleanup: some changes failed (see ACTION); fix the cause, e.g. stop the workload \
             holding the instance, and run it again"
                .into(),
        ));
    }
    Ok(())
}

fn table(r: &CleanupReport, out: &mut dyn Write) -> std::io::Result<()> {
    if r.is_empty() {
        return writeln!(out, "nothing to clean up");
    }
    let action = |o: &crate::prepare::Outcome| match &o.error {
        Some(e) => format!("{}: {e}", o.action),
        None => o.action.clone(),
    };
    let mut rows = Vec::new();
    for o in &r.orphans {
        rows.push(vec![
            "orphan instance".into(),
            format!("GPU {} {} (GI {})", o.gpu_index, o.device, o.gpu_instance_id),
            "no claim in the checkpoint holds it".into(),
            action(&o.outcome),
        ]);
    }
    for s in &r.stale_cdi_specs {
        rows.push(vec![
            "stale CDI spec".into(),
            s.path.clone(),
            format!("claim {} is not in the checkpoint", s.claim_uid),
            action(&s.outcome),
        ]);
    }
    for s in &r.stale_metadata {
        rows.push(vec![
            "stale device metadata".into(),
            s.path.clone(),
            format!("claim {}/{} is not in the checkpoint", s.namespace, s.name),
            action(&s.outcome),
        ]);
    }
    for b in &r.broken_cdi_specs {
        rows.push(vec![
            "broken CDI spec".into(),
            b.path.clone(),
            format!("the spec of prepared claim {}/{} ({}) is {}", b.namespace, b.name, b.uid, b.problem),
            action(&b.outcome),
        ]);
    }
    for c in &r.lost_claims {
        rows.push(vec![
            "lost claim".into(),
            format!("{}/{} ({})", c.namespace, c.name, c.uid),
            c.missing.join("; "),
            action(&c.outcome),
        ]);
    }
    output::table(out, &["KIND", "WHAT", "WHY", "ACTION"], &rows)?;
    if r.dry_run {
        writeln!(out, "dry run: nothing was changed; run `migdra cleanup` without --dry-run to do it")?;
    }
    Ok(())
}
