//! The columns of the console's trends, kept from frame to frame (see [`Trends`]).

use crate::history::{History, Metric, merged_mean};
use std::cell::RefCell;

/// The columns of a trend: `width` spans of `period` seconds from `from`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    pub from: f64,
    pub period: f64,
    pub width: usize,
}

impl Grid {
    /// The column a time falls in; None before the first. (A time at the end or past it is
    /// in the last: the trend never asks for one.) It never decreases as `t` grows, which is
    /// what lets [`Trends`] check a whole column by its oldest and newest sample.
    pub fn column(&self, t: f64) -> Option<usize> {
        // Truncation is the floor here: nothing lies before `from`.
        (t >= self.from)
            .then(|| (((t - self.from) / self.period) as usize).min(self.width.saturating_sub(1)))
    }
}

/// The raw samples of one column: their mean (as the history merges them, in f32, oldest
/// first) and the times of the first and last.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Column {
    mean: f32,
    count: u32,
    first_t: f64,
    last_t: f64,
}

impl Column {
    fn new(t: f64, v: f32) -> Column {
        Column {
            mean: v,
            count: 1,
            first_t: t,
            last_t: t,
        }
    }

    /// One more sample, newer than the others (merged as [`History::window`] merges a
    /// bucket of one).
    fn add(&mut self, t: f64, v: f32) {
        self.mean = merged_mean(self.mean, self.count, v, 1);
        self.count += 1;
        self.last_t = t;
    }
}

/// What one series' trend was made of last time.
#[derive(Debug, Clone)]
struct Binned {
    history: u64,
    grid: Grid,
    /// The newest sample taken in.
    last_t: f64,
    columns: Vec<Option<Column>>,
}

/// The raw columns of the trends drawn last, by GPU and metric, so that the next frame
/// reads only the samples that came since instead of every sample of every window.
///
/// A trend's grid moves with its newest sample, a period and a little (the sampler's tick
/// jitters), so the columns of the last frame are not always those of this one shifted. They
/// are taken over only where they are: each column kept must fall, by its oldest and its
/// newest sample, in the column it moves to (every sample between falls there too, as
/// [`Grid::column`] never decreases), and each column dropped must fall before the new grid.
/// Anything else (another grid, a history replaced, coarse buckets) is binned again from the
/// samples. So a trend is the same either way: the tests check that on jittering series,
/// against the history's windows too.
#[derive(Debug, Default)]
pub struct Trends {
    /// By GPU, then by metric (see `slot`).
    binned: RefCell<Vec<Option<Binned>>>,
    /// Trends made from what was kept, and binned again.
    #[cfg(test)]
    counts: std::cell::Cell<(u64, u64)>,
}

impl Clone for Trends {
    /// A copy starts empty: what it keeps is only a shortcut.
    fn clone(&self) -> Trends {
        Trends::default()
    }
}

impl Trends {
    /// The means of `grid`'s columns from `skip` on, into `values`, from the raw samples of
    /// `gpu`'s `metric` whose newest is at `last_t`; false (nothing written) where the history
    /// answers from coarse buckets instead. The columns before `skip` (a history younger than
    /// the grid) are binned and kept all the same, so that the grid moves on from frame to
    /// frame as it fills; they are left out of `values`.
    #[allow(clippy::too_many_arguments)]
    pub fn columns(
        &self,
        history: &History,
        gpu: usize,
        metric: Metric,
        grid: Grid,
        skip: usize,
        last_t: f64,
        values: &mut [Option<f64>],
    ) -> bool {
        let from_q = grid.from + skip as f64 * grid.period;
        let mut binned = self.binned.borrow_mut();
        let i = slot(gpu, metric);
        if binned.len() <= i {
            binned.resize_with(i + 1, || None);
        }
        let entry = &mut binned[i];
        if !history.raw_covers(gpu, metric, from_q) {
            *entry = None;
            return false;
        }
        let kept = entry
            .as_mut()
            .is_some_and(|b| b.take_new(history, gpu, metric, grid, last_t));
        #[cfg(test)]
        {
            let (k, r) = self.counts.get();
            self.counts.set((k + u64::from(kept), r + u64::from(!kept)));
        }
        let b = match entry {
            Some(b) if kept => b,
            _ => {
                let mut columns = vec![None; grid.width];
                let to = grid.from + grid.width as f64 * grid.period;
                history.raw_each(gpu, metric, grid.from, to, |t, v| {
                    put(&mut columns, grid, t, v)
                });
                entry.insert(Binned {
                    history: history.id(),
                    grid,
                    last_t,
                    columns,
                })
            }
        };
        for (v, c) in values.iter_mut().zip(&b.columns).skip(skip) {
            *v = c.map(|c| f64::from(c.mean));
        }
        true
    }

    /// How many trends were made from kept columns, and how many were binned again.
    #[cfg(test)]
    pub fn counts(&self) -> (u64, u64) {
        self.counts.get()
    }
}

/// Where `gpu`'s `metric` is kept in [`Trends`].
fn slot(gpu: usize, metric: Metric) -> usize {
    gpu * Metric::ALL.len() + metric as usize
}

/// Put the sample `(t, v)` into its column of `grid` (samples come oldest first).
fn put(columns: &mut [Option<Column>], grid: Grid, t: f64, v: f32) {
    if let Some(i) = grid.column(t) {
        match &mut columns[i] {
            Some(c) => c.add(t, v),
            slot => *slot = Some(Column::new(t, v)),
        }
    }
}

impl Binned {
    /// Move to `grid`, taking in the samples newer than the last taken in (the newest at
    /// `last_t`); false, with nothing changed, where the columns kept would not be the ones
    /// binned from the samples (see [`Trends`]).
    fn take_new(
        &mut self,
        history: &History,
        gpu: usize,
        metric: Metric,
        grid: Grid,
        last_t: f64,
    ) -> bool {
        let was = self.grid;
        if self.history != history.id()
            || (grid.period, grid.width) != (was.period, was.width)
            || grid.from < was.from
            || last_t < self.last_t
        {
            return false;
        }
        let shift = ((grid.from - was.from) / grid.period).round();
        if shift.is_nan() || shift < 0.0 {
            return false;
        }
        let shift = (shift as usize).min(grid.width);
        let fits = self.columns.iter().enumerate().all(|(i, c)| match c {
            None => true,
            Some(c) if i < shift => c.last_t < grid.from,
            Some(c) => {
                let to = Some(i - shift);
                grid.column(c.first_t) == to && (c.count == 1 || grid.column(c.last_t) == to)
            }
        });
        if !fits {
            return false;
        }
        self.columns.copy_within(shift.., 0);
        let width = self.columns.len();
        self.columns[width - shift..].fill(None);
        let to = grid.from + grid.width as f64 * grid.period;
        let last = self.last_t;
        history.raw_each(gpu, metric, last.max(grid.from), to, |t, v| {
            if t > last {
                put(&mut self.columns, grid, t, v)
            }
        });
        self.grid = grid;
        self.last_t = last_t;
        true
    }
}
