//! A run's trainer metrics as a table: one row per report in `metrics.jsonl` within the window,
//! in file order, with the rank that sent it. The named scalars a trainer adds (learning rate,
//! accuracy, …) get a column each, after the fixed ones.
//!
//! The file is read line by line without following a link; a line that does not parse (cut
//! short by a crash mid-write) or is longer than [`MAX_LINE`] is skipped and counted.

use std::collections::BTreeSet;
use std::io::BufReader;
use std::ops::ControlFlow;
use std::path::Path;

use super::{Cells, Column, ExportError, Table};
use crate::config::safe_fs;
use crate::training::MetricsPoint;

/// Longest line read; the daemon writes lines of a few hundred bytes.
pub const MAX_LINE: usize = crate::training::MAX_METRICS_LINE;

/// Most rows in one export.
pub const MAX_ROWS: usize = 5_000_000;

/// The fixed columns, in order (`extra` scalars follow).
pub const COLUMNS: [&str; 13] = [
    "time",
    "run",
    "rank",
    "n",
    "source",
    "step",
    "epoch",
    "loss",
    "samples_per_s",
    "step_time_s",
    "data_wait_s",
    "batch_size",
    "prefetch",
];

/// What was read.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsTable {
    pub table: Table,
    /// Lines skipped: not JSON of a report, or too long.
    pub unreadable: usize,
}

/// The reports of run `run` in `path` with `from <= t < to`.
pub fn table(path: &Path, run: &str, from: f64, to: f64) -> Result<MetricsTable, ExportError> {
    let file = match safe_fs::open_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(MetricsTable {
                table: build(run, Vec::new()),
                unreadable: 0,
            });
        }
        Err(e) => return Err(ExportError::Io(e)),
    };
    let (mut points, mut unreadable) = (Vec::new(), 0);
    let mut too_many = false;
    safe_fs::visit_lines(BufReader::new(file), MAX_LINE, |line| {
        let Some(line) = line else {
            unreadable += 1;
            return ControlFlow::Continue(());
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            return ControlFlow::Continue(());
        }
        match serde_json::from_slice::<MetricsPoint>(line) {
            Ok(p) if p.t >= from && p.t < to => {
                if points.len() == MAX_ROWS {
                    too_many = true;
                    return ControlFlow::Break(());
                }
                points.push(p);
            }
            Ok(_) => {}
            Err(_) => unreadable += 1,
        }
        ControlFlow::Continue(())
    })?;
    if too_many {
        return Err(ExportError::TooLarge(format!(
            "more than {MAX_ROWS} reports: give a shorter window (--since, --until)"
        )));
    }
    Ok(MetricsTable {
        table: build(run, points),
        unreadable,
    })
}

/// The table of `points`.
pub fn build(run: &str, points: Vec<MetricsPoint>) -> Table {
    let extras: BTreeSet<String> = points
        .iter()
        .flat_map(|p| p.report.extra.keys().cloned())
        .collect();
    let f = |get: &dyn Fn(&MetricsPoint) -> Option<f64>| {
        Cells::F64(
            points
                .iter()
                .map(|p| get(p).filter(|v| v.is_finite()))
                .collect(),
        )
    };
    let i =
        |get: &dyn Fn(&MetricsPoint) -> Option<i64>| Cells::I64(points.iter().map(get).collect());
    let as_i64 = |v: Option<u64>| v.and_then(|v| i64::try_from(v).ok());
    let cells = [
        Cells::Time(points.iter().map(|p| p.t).collect()),
        Cells::Text(points.iter().map(|_| Some(run.to_string())).collect()),
        i(&|p| p.rank.map(i64::from)),
        i(&|p| as_i64(Some(p.n))),
        Cells::Text(points.iter().map(|p| Some(p.from.clone())).collect()),
        i(&|p| as_i64(p.report.step)),
        i(&|p| as_i64(p.report.epoch)),
        f(&|p| p.report.loss),
        f(&|p| p.report.samples_per_s),
        f(&|p| p.report.step_time_s),
        f(&|p| p.report.data_wait_s),
        i(&|p| p.report.batch_size),
        i(&|p| p.report.prefetch),
    ];
    let mut columns: Vec<Column> = COLUMNS
        .iter()
        .zip(cells)
        .map(|(name, cells)| Column {
            name: (*name).into(),
            cells,
        })
        .collect();
    for name in extras {
        let cells = f(&|p| p.report.extra.get(&name).copied());
        // A trainer's scalar named like a fixed column keeps both.
        let name = if COLUMNS.contains(&name.as_str()) {
            format!("extra_{name}")
        } else {
            name
        };
        columns.push(Column { name, cells });
    }
    Table { columns }
}
