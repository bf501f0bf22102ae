//! Output formats and the one place the CLI writes errors.

use serde::Serialize;
use std::io::Write;

/// How a command prints its result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned text for people
    #[default]
    Table,
    /// JSON for scripts
    Json,
    /// YAML, the same content as JSON
    Yaml,
}

/// Write `value` as pretty JSON.
pub fn json(out: &mut dyn Write, value: &impl Serialize) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)
}

/// Write `value` as YAML.
pub fn yaml(out: &mut dyn Write, value: &impl Serialize) -> std::io::Result<()> {
    serde_norway::to_writer(&mut *out, value).map_err(std::io::Error::other)
}

/// Write `value` as YAML when `format` says so, JSON otherwise (for the arm that serves both).
pub fn data(out: &mut dyn Write, format: Format, value: &impl Serialize) -> std::io::Result<()> {
    match format {
        Format::Yaml => yaml(out, value),
        Format::Json | Format::Table => json(out, value),
    }
}

/// Print an error as one line on stderr.
pub fn error_line(message: &str) {
    let line = message.replace('\n', " ");
    let _ = writeln!(std::io::stderr(), "migdra: error: {line}");
}

/// Columns padded to the widest cell, two spaces apart; numbers right-aligned.
pub fn table(out: &mut dyn Write, header: &[&str], rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let numeric: Vec<bool> = (0..header.len())
        .map(|i| {
            !rows.is_empty() && rows.iter().all(|r| r.get(i).is_some_and(|c| c.parse::<f64>().is_ok() || c == "-"))
        })
        .collect();
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(
                |(i, c)| if numeric[i] { format!("{c:>w$}", w = widths[i]) } else { format!("{c:<w$}", w = widths[i]) },
            )
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    writeln!(out, "{}", line(&header))?;
    for row in rows {
        writeln!(out, "{}", line(row))?;
    }
    Ok(())
}
