//! `gpupilot export`: the node's GPU history and a run's trainer metrics as tables for pandas
//! and notebooks, written as CSV, JSON lines or Parquet. (Not the Prometheus page: that is
//! [`crate::exporter`].)
//!
//! - [`gpus`]: one row per GPU and time step from the daemon's history (the caller hands in a
//!   window query: the CLI asks the daemon), one column per series, units in the names.
//! - [`metrics`]: one row per trainer report from a run's `metrics.jsonl`, with its rank.
//! - [`csv`], [`jsonl`], [`parquet`]: the three ways to write a [`Table`].
//!
//! Numbers are written with the precision they were measured at: a GPU reading (an `f32` in the
//! history) as the shortest decimal of that `f32` ([`measured_f32`]), a trainer's figure (an
//! `f64` in `metrics.jsonl`) as the shortest decimal of that `f64`, an integer as an integer;
//! never an exponent in CSV, never `-0`.
//!
//! Absent is not zero here either: a value the GPU or the trainer did not report is an empty
//! CSV cell, a JSON `null` or a Parquet null. `time` is RFC 3339 UTC to the millisecond in CSV
//! and JSON lines (`pandas.to_datetime` and `read_csv(…, parse_dates=["time"])` read it as
//! is), and a UTC timestamp in Parquet (`read_parquet` gives a datetime column).
//!
//! Layer: a reader beside `report`; it never talks to a daemon itself.

pub mod csv;
pub mod gpus;
pub mod jsonl;
pub mod metrics;
pub mod parquet;

use std::time::{Duration, UNIX_EPOCH};

/// The file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    Jsonl,
    Parquet,
}

/// A column's values, one per row; `None` is an absent value.
#[derive(Debug, Clone, PartialEq)]
pub enum Cells {
    /// Unix seconds, written as a UTC time.
    Time(Vec<f64>),
    F64(Vec<Option<f64>>),
    I64(Vec<Option<i64>>),
    Text(Vec<Option<String>>),
}

impl Cells {
    pub fn len(&self) -> usize {
        match self {
            Cells::Time(v) => v.len(),
            Cells::F64(v) => v.len(),
            Cells::I64(v) => v.len(),
            Cells::Text(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A named column.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub name: String,
    pub cells: Cells,
}

/// Columns of equal length.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    pub columns: Vec<Column>,
}

impl Table {
    /// Rows (the first column's length; every column has as many).
    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |c| c.cells.len())
    }

    /// The column called `name`.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }
}

/// The table in `format`.
pub fn write(table: &Table, format: Format) -> Result<Vec<u8>, ExportError> {
    match format {
        Format::Csv => Ok(csv::write(table)),
        Format::Jsonl => Ok(jsonl::write(table)),
        Format::Parquet => parquet::write(table),
    }
}

/// Why a table could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("writing Parquet: {0}")]
    Parquet(String),
    #[error("{0}")]
    TooLarge(String),
}

/// A reading the history keeps as an `f32` (every GPU series), as the decimal it was: the
/// shortest text that reads back to that `f32` (`624.4`, where its widening to `f64` spells
/// `624.4000244140625`), taken as the nearest `f64`, so that CSV, JSON lines and Parquet all
/// hold `624.4`. Not finite: absent.
pub fn measured_f32(x: f64) -> Option<f64> {
    let x = x as f32;
    if !x.is_finite() {
        return None;
    }
    x.to_string()
        .parse::<f64>()
        .ok()
        .map(crate::units::no_negative_zero)
}

/// `2026-11-30T03:15:00.123Z`: Unix seconds as UTC, rounded to the millisecond (a history
/// bucket's centre such as `…:00.05` must not read as `…:00.049`).
pub fn time_text(t: f64) -> String {
    let ms = (t.max(0.0) * 1000.0).round();
    crate::time::rfc3339(UNIX_EPOCH + Duration::from_millis(ms as u64))
}

/// Unix milliseconds, as Parquet's timestamp column holds them.
pub fn time_ms(t: f64) -> i64 {
    (t.max(0.0) * 1000.0).round() as i64
}

#[cfg(test)]
mod tests;
