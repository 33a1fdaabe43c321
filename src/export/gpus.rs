//! The GPU history as a table: one row per GPU and time step that has any sample, one column
//! per series, each the mean of the samples in its step (the history's own buckets, as
//! `gpupilot`'s charts see them).
//!
//! The window is cut into steps on a [`Grid`] aligned to the wall clock (whole multiples of the
//! step since the Unix epoch), so that exports of the same window join on `time`; the history
//! is asked for at most [`CHUNK`] steps at a time, each chunk on the same grid, so that every
//! series of a GPU has its points in the same steps and they line up into rows. The history
//! holds its readings as `f32`: each is written as the decimal it was ([`super::measured_f32`]).

use std::collections::BTreeMap;

use super::{Cells, Column, ExportError, Table};
use crate::history::{Metric, Point};

/// Steps asked for in one history query (the protocol's limit on points per answer).
pub const CHUNK: u32 = crate::protocol::MAX_HISTORY_POINTS;

/// Most steps per GPU in one export: a week at 1 s. A finer step over a longer window is
/// refused with the step that would fit.
pub const MAX_STEPS: u64 = 7 * 24 * 3600;

/// A series' column name, its unit in the name.
pub fn column_name(m: Metric) -> &'static str {
    match m {
        Metric::UtilGpu => "util_gpu_pct",
        Metric::UtilMem => "util_mem_pct",
        Metric::MemoryUsed => "memory_used_bytes",
        Metric::Temperature => "temperature_c",
        Metric::Power => "power_w",
        Metric::PowerLimit => "power_limit_w",
        Metric::SmClock => "sm_clock_mhz",
        Metric::Fan => "fan_pct",
        Metric::PcieRx => "pcie_rx_kbps",
        Metric::PcieTx => "pcie_tx_kbps",
        // A step's share of time held down (0..1).
        Metric::PowerLimited => "power_limited_share",
        Metric::ThermalLimited => "thermal_limited_share",
    }
}

/// The step the history keeps at `age_s` seconds back (its default tiers: 1 s buckets for an
/// hour, 15 s for a day, 2 min beyond), the finest that is not finer than what is stored.
pub fn default_step(age_s: f64) -> f64 {
    if age_s <= 3600.0 {
        1.0
    } else if age_s <= 24.0 * 3600.0 {
        15.0
    } else {
        120.0
    }
}

/// The steps a window is cut into: whole multiples of the step since the Unix epoch, so that two
/// exports of one window at one step have the same times however their edges fall (`--since
/// 2h` run twice, a run's span). Kept in whole milliseconds, the resolution of the `time`
/// column: a step is taken to the millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// Milliseconds per step (at least 1).
    pub step_ms: i64,
    /// The first step's start, in steps since the epoch.
    pub first: i64,
    /// How many steps.
    pub steps: u64,
}

impl Grid {
    /// The steps that cover `[from, to)` at `step` seconds: from the one holding `from` to the
    /// one holding the last instant before `to`. Refused beyond [`MAX_STEPS`].
    pub fn cover(from: f64, to: f64, step: f64) -> Result<Grid, ExportError> {
        let step_ms = ((step * 1000.0).round() as i64).max(1);
        let ms = |t: f64| (t * 1000.0).round() as i64;
        let first = ms(from).div_euclid(step_ms);
        let end = (ms(to) + step_ms - 1).div_euclid(step_ms);
        let n = (end - first).max(0);
        if n as u64 > MAX_STEPS {
            let fits = ((to - from) / MAX_STEPS as f64).ceil();
            return Err(ExportError::TooLarge(format!(
                "{n} steps of {step} s per GPU is more than {MAX_STEPS}: give a shorter window \
                 or --step {fits} or more"
            )));
        }
        Ok(Grid {
            step_ms,
            first,
            steps: n as u64,
        })
    }

    /// Seconds per step.
    pub fn step_s(&self) -> f64 {
        self.step_ms as f64 / 1000.0
    }

    /// Where step `i` of the window starts (Unix seconds): a whole number of milliseconds, and
    /// of steps.
    pub fn start(&self, i: u64) -> f64 {
        ((self.first + i as i64) * self.step_ms) as f64 / 1000.0
    }
}

/// One row's value per series of [`Metric::ALL`], keyed by (step since the epoch, GPU).
type Row = [Option<f64>; Metric::ALL.len()];

/// The table of `gpus` over `grid`, asking `window(gpu, metric, from, to, points)` for the
/// history (the daemon's `History` request). A row's `time` is the start of its step (as
/// pandas' `resample` labels a bin); its values are the step's means.
pub fn table<E>(
    gpus: &[u32],
    grid: &Grid,
    mut window: impl FnMut(u32, Metric, f64, f64, u32) -> Result<Vec<Point>, E>,
) -> Result<Table, E> {
    let mut rows: BTreeMap<(i64, u32), Row> = BTreeMap::new();
    let step = grid.step_s();
    for &gpu in gpus {
        for (slot, m) in Metric::ALL.into_iter().enumerate() {
            let mut done = 0u64;
            while done < grid.steps {
                let n = (grid.steps - done).min(u64::from(CHUNK));
                let a = grid.start(done);
                let b = grid.start(done + n);
                for p in window(gpu, m, a, b, n as u32)? {
                    // A point stands at its step's centre: its step is the one it falls in.
                    let i = ((p.t - a) / step).floor();
                    if !(0.0..n as f64).contains(&i) {
                        continue;
                    }
                    let k = grid.first + (done + i as u64) as i64;
                    let row = rows.entry((k, gpu)).or_insert([None; Metric::ALL.len()]);
                    row[slot] = super::measured_f32(p.mean);
                }
                done += n;
            }
        }
    }
    let mut time = Vec::with_capacity(rows.len());
    let mut gpu = Vec::with_capacity(rows.len());
    let mut values: Vec<Vec<Option<f64>>> = vec![Vec::with_capacity(rows.len()); Metric::ALL.len()];
    for ((k, g), v) in rows {
        time.push((k * grid.step_ms) as f64 / 1000.0);
        gpu.push(Some(i64::from(g)));
        for (col, x) in values.iter_mut().zip(v) {
            col.push(x);
        }
    }
    let mut columns = vec![
        Column {
            name: "time".into(),
            cells: Cells::Time(time),
        },
        Column {
            name: "gpu".into(),
            cells: Cells::I64(gpu),
        },
    ];
    for (m, v) in Metric::ALL.into_iter().zip(values) {
        columns.push(Column {
            name: column_name(m).into(),
            cells: Cells::F64(v),
        });
    }
    Ok(Table { columns })
}
