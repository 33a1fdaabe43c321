//! The GPU history as a table: one row per GPU and time step that has any sample, one column
//! per series, each the mean of the samples in its step (the history's own buckets, as
//! `gpupilot`'s charts see them).
//!
//! The window is cut into steps of `step` seconds from `from`; the history is asked for at most
//! [`CHUNK`] steps at a time, each chunk with the same step, so that every series of a GPU has
//! its points at the same times and they line up into rows.

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

/// Steps in `[from, to)` at `step` (the last one may reach past `to`), refused beyond
/// [`MAX_STEPS`].
pub fn steps(from: f64, to: f64, step: f64) -> Result<u64, ExportError> {
    let n = ((to - from) / step).ceil().max(0.0);
    if n > MAX_STEPS as f64 {
        let fits = ((to - from) / MAX_STEPS as f64).ceil();
        return Err(ExportError::TooLarge(format!(
            "{n:.0} steps of {step} s per GPU is more than {MAX_STEPS}: give a shorter window \
             or --step {fits} or more"
        )));
    }
    Ok(n as u64)
}

/// One row: its time (Unix seconds) and a value per series of [`Metric::ALL`], keyed by (time
/// in milliseconds, GPU).
type Row = (f64, [Option<f64>; Metric::ALL.len()]);

/// The table of `gpus` over `[from, from + steps·step)`, asking `window(gpu, metric, from, to,
/// points)` for the history (the daemon's `History` request).
pub fn table<E>(
    gpus: &[u32],
    from: f64,
    step: f64,
    steps: u64,
    mut window: impl FnMut(u32, Metric, f64, f64, u32) -> Result<Vec<Point>, E>,
) -> Result<Table, E> {
    let mut rows: BTreeMap<(i64, u32), Row> = BTreeMap::new();
    for &gpu in gpus {
        for (slot, m) in Metric::ALL.into_iter().enumerate() {
            let mut done = 0u64;
            while done < steps {
                let n = (steps - done).min(u64::from(CHUNK));
                let a = from + done as f64 * step;
                let b = from + (done + n) as f64 * step;
                for p in window(gpu, m, a, b, n as u32)? {
                    let row = rows
                        .entry((super::time_ms(p.t), gpu))
                        .or_insert((p.t, [None; Metric::ALL.len()]));
                    row.1[slot] = Some(p.mean);
                }
                done += n;
            }
        }
    }
    let mut time = Vec::with_capacity(rows.len());
    let mut gpu = Vec::with_capacity(rows.len());
    let mut values: Vec<Vec<Option<f64>>> = vec![Vec::with_capacity(rows.len()); Metric::ALL.len()];
    for ((_, g), (t, v)) in rows {
        time.push(t);
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
