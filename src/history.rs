//! History: every GPU's series by time, in a fixed memory budget.
//!
//! Each (GPU, metric) series keeps the recent minutes at full sample rate, then min/mean/max
//! buckets at coarser resolutions for hours and days. Every tier is a ring with a fixed
//! capacity, so memory is bounded no matter how long the daemon runs. A chart asks for a
//! window and a number of columns and gets at most that many points, each with the min, mean
//! and max of the samples it covers — a spike shorter than a column still shows in `max`.
//!
//! Absent values are never recorded as zeros: a metric the GPU did not report leaves a gap.

use crate::telemetry::{Snapshot, throttle};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

/// The per-GPU series gpupilot keeps (`util_gpu`, `memory_used`, … in the daemon protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    UtilGpu,
    UtilMem,
    MemoryUsed,
    Temperature,
    Power,
    PowerLimit,
    SmClock,
    Fan,
    PcieRx,
    PcieTx,
    /// 1 while the clock is held down by power (cap or brake), else 0: a bucket's mean is the
    /// share of its time spent power-limited.
    PowerLimited,
    /// 1 while the clock is held down by temperature, else 0.
    ThermalLimited,
}

impl Metric {
    pub const ALL: [Metric; 12] = [
        Metric::UtilGpu,
        Metric::UtilMem,
        Metric::MemoryUsed,
        Metric::Temperature,
        Metric::Power,
        Metric::PowerLimit,
        Metric::SmClock,
        Metric::Fan,
        Metric::PcieRx,
        Metric::PcieTx,
        Metric::PowerLimited,
        Metric::ThermalLimited,
    ];

    fn slot(self) -> usize {
        self as usize
    }
}

/// One chart point: the samples in `[t - width/2, t + width/2)` summarised.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Centre of the span the point covers, seconds since the epoch.
    pub t: f64,
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

/// The points of one series, oldest first: a daemon's history as a console takes it in.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesPoints {
    pub gpu: usize,
    pub metric: Metric,
    pub points: Vec<Point>,
}

/// Resolution and length of each tier.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryConfig {
    /// Full-rate samples kept per series (at 10 Hz, 6000 is ten minutes).
    pub raw_capacity: usize,
    /// (bucket width in seconds, buckets kept) for each coarser tier, finest first.
    pub tiers: Vec<(f64, usize)>,
}

impl HistoryConfig {
    /// The default rings for samples every `period_s` seconds, less each tier that the raw
    /// ring reaches further back than (by a tenth, for a period that jitters): a window is
    /// drawn from the finest level that reaches back to its start, so such a tier would be
    /// written at every sample and never read. At 1 Hz the raw ring holds 100 minutes and
    /// the 1 s tier one hour: 8 MiB less for 8 GPUs, and a quarter of each sample's writes.
    pub fn for_period(period_s: f64) -> HistoryConfig {
        let mut config = HistoryConfig::default();
        if period_s.is_finite() && period_s > 0.0 {
            let raw_span = config.raw_capacity as f64 * period_s;
            config
                .tiers
                .retain(|&(width, buckets)| width * (buckets as f64 + 1.0) * 1.1 > raw_span);
        }
        config
    }
}

impl Default for HistoryConfig {
    /// Ten minutes at 10 Hz; 1 s buckets for an hour; 15 s for a day; 2 min for a week.
    fn default() -> Self {
        HistoryConfig {
            raw_capacity: 6000,
            tiers: vec![(1.0, 3600), (15.0, 5760), (120.0, 5040)],
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    start: f64,
    min: f32,
    max: f32,
    mean: f32,
    count: u32,
}

impl Bucket {
    fn new(start: f64, v: f32) -> Bucket {
        Bucket {
            start,
            min: v,
            max: v,
            mean: v,
            count: 1,
        }
    }

    fn add(&mut self, v: f32) {
        self.count += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.mean += (v - self.mean) / self.count as f32;
    }
}

#[derive(Debug, Clone)]
struct Tier {
    width: f64,
    capacity: usize,
    done: VecDeque<Bucket>,
    open: Option<Bucket>,
}

impl Tier {
    fn push(&mut self, t: f64, v: f32) {
        let start = (t / self.width).floor() * self.width;
        match &mut self.open {
            Some(b) if b.start == start => b.add(v),
            // Time never runs backwards in a series (record() drops such samples), so a
            // different start means a newer bucket.
            open => {
                if let Some(b) = open.take() {
                    if self.done.len() == self.capacity {
                        self.done.pop_front();
                    }
                    self.done.push_back(b);
                }
                *open = Some(Bucket::new(start, v));
            }
        }
    }

    fn oldest(&self) -> Option<f64> {
        self.done.front().or(self.open.as_ref()).map(|b| b.start)
    }

    /// Buckets whose centre may fall in `[from, to)` (binary search; the caller filters the
    /// edges exactly).
    fn buckets_between(&self, from: f64, to: f64) -> impl Iterator<Item = &Bucket> {
        let lo = self.done.partition_point(|b| b.start + self.width <= from);
        let hi = self.done.partition_point(|b| b.start < to);
        self.done.range(lo..hi.max(lo)).chain(self.open.iter())
    }
}

/// The raw rings of one GPU's series in one buffer, interleaved: slot `k` of the series of
/// metric slot `m` is at `k * SERIES + m`. A GPU's series are pushed together, one reading at
/// a time, so they advance together: a snapshot writes a line or two of one page per GPU,
/// where a ring of its own per series wrote a line on a page of its own for each (96 pages a
/// second for 8 GPUs, every one of them out of the TLB and the caches a second later). The
/// buffers are zeroed by the allocator, so a page is resident only once a sample is written
/// to it.
#[derive(Debug, Clone)]
struct RawRows {
    capacity: usize,
    t: Vec<f64>,
    v: Vec<f32>,
}

/// Series a GPU has: one per [`Metric`].
const SERIES: usize = Metric::ALL.len();

impl RawRows {
    fn new(capacity: usize) -> RawRows {
        RawRows {
            capacity,
            t: vec![0.0; capacity * SERIES],
            v: vec![0.0; capacity * SERIES],
        }
    }

    fn bytes(capacity: usize) -> usize {
        capacity * SERIES * (std::mem::size_of::<f64>() + std::mem::size_of::<f32>())
    }
}

/// Where one series' raw ring lies in its GPU's [`RawRows`]: its oldest slot and how many.
#[derive(Debug, Clone, Copy, Default)]
struct Ring {
    head: usize,
    len: usize,
}

/// One series' raw ring, to read: samples `0..len`, oldest first.
#[derive(Clone, Copy)]
struct Raw<'a> {
    rows: &'a RawRows,
    slot: usize,
    ring: Ring,
}

impl<'a> Raw<'a> {
    fn len(&self) -> usize {
        self.ring.len
    }

    fn index(&self, i: usize) -> usize {
        let k = self.ring.head + i;
        let k = if k >= self.rows.capacity {
            k - self.rows.capacity
        } else {
            k
        };
        k * SERIES + self.slot
    }

    fn time(&self, i: usize) -> f64 {
        self.rows.t[self.index(i)]
    }

    fn get(&self, i: usize) -> (f64, f32) {
        let j = self.index(i);
        (self.rows.t[j], self.rows.v[j])
    }

    fn front(&self) -> Option<(f64, f32)> {
        (self.ring.len > 0).then(|| self.get(0))
    }

    fn back(&self) -> Option<(f64, f32)> {
        (self.ring.len > 0).then(|| self.get(self.ring.len - 1))
    }

    /// The first sample whose time fails `before` (the times are sorted).
    fn partition_point(&self, before: impl Fn(f64) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.ring.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if before(self.time(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn range(self, lo: usize, hi: usize) -> impl Iterator<Item = (f64, f32)> + 'a {
        (lo..hi.max(lo)).map(move |i| self.get(i))
    }
}

#[derive(Debug, Clone)]
struct Series {
    /// In the GPU's [`RawRows`], at this series' metric slot.
    ring: Ring,
    tiers: Vec<Tier>,
}

impl Series {
    fn new(config: &HistoryConfig) -> Series {
        // Each tier ring is allocated at its full capacity once, so it never reallocates (a
        // growing VecDeque doubles: up to twice the budget). Pages the rings have not written
        // yet are not resident, so a young series costs little real memory.
        Series {
            ring: Ring::default(),
            tiers: config
                .tiers
                .iter()
                .map(|&(width, capacity)| Tier {
                    width,
                    capacity,
                    done: VecDeque::with_capacity(capacity),
                    open: None,
                })
                .collect(),
        }
    }

    /// Empty, keeping its memory (the rings' slots are written over).
    fn clear(&mut self) {
        self.ring = Ring::default();
        for t in &mut self.tiers {
            t.done.clear();
            t.open = None;
        }
    }

    fn raw<'a>(&self, rows: &'a RawRows, slot: usize) -> Raw<'a> {
        Raw {
            rows,
            slot,
            ring: self.ring,
        }
    }

    fn push(&mut self, rows: &mut RawRows, slot: usize, t: f64, v: f32) {
        // A reading already recorded (a snapshot that repeats a GPU's last reading) or an older
        // one adds nothing: counting it twice would weigh it double in bucket means.
        if self
            .raw(rows, slot)
            .back()
            .is_some_and(|(last, _)| t <= last)
        {
            return;
        }
        let capacity = rows.capacity;
        if capacity == 0 {
            return;
        }
        let at = if self.ring.len == capacity {
            // Full: the newest takes the oldest's slot.
            let at = self.raw(rows, slot).index(0);
            self.ring.head = (self.ring.head + 1) % capacity;
            at
        } else {
            self.ring.len += 1;
            self.raw(rows, slot).index(self.ring.len - 1)
        };
        rows.t[at] = t;
        rows.v[at] = v;
        for tier in &mut self.tiers {
            tier.push(t, v);
        }
    }

    /// Fixed-capacity memory of this series' tiers once their rings are full, in bytes (the
    /// raw ring is its GPU's: [`RawRows::bytes`]).
    fn budget_bytes(&self) -> usize {
        self.tiers
            .iter()
            .map(|t| (t.capacity + 1) * std::mem::size_of::<Bucket>())
            .sum::<usize>()
    }

    fn allocated_bytes(&self) -> usize {
        self.tiers
            .iter()
            .map(|t| t.done.capacity() * std::mem::size_of::<Bucket>())
            .sum::<usize>()
            + std::mem::size_of::<Series>()
    }

    /// Whether a window from `from` is drawn from the raw ring: it reaches back that far, or
    /// it holds the whole series, however young (a coarse tier would place its one open
    /// bucket at a centre that may lie past the window's end), or there is no tier.
    fn raw_covers(&self, raw: Raw<'_>, from: f64) -> bool {
        raw.len() < raw.rows.capacity
            || self.tiers.is_empty()
            || raw.front().is_some_and(|(o, _)| o <= from)
    }

    /// Each point of [`History::window`] on this series, oldest first, to `f`.
    fn window_each(
        &self,
        raw: Raw<'_>,
        from: f64,
        to: f64,
        max_points: usize,
        f: impl FnMut(Point),
    ) {
        thread_local! {
            /// Bins kept between windows: the console asks for dozens every frame.
            static BINS: RefCell<Vec<Option<Bucket>>> = const { RefCell::new(Vec::new()) };
        }
        BINS.with(|bins| match bins.try_borrow_mut() {
            Ok(mut bins) => self.window_in(raw, from, to, max_points, &mut bins, f),
            // A window asked for while visiting another's points.
            Err(_) => self.window_in(raw, from, to, max_points, &mut Vec::new(), f),
        });
    }

    /// [`Series::window_each`] with `bins` to work in.
    fn window_in(
        &self,
        raw: Raw<'_>,
        from: f64,
        to: f64,
        max_points: usize,
        bins: &mut Vec<Option<Bucket>>,
        mut f: impl FnMut(Point),
    ) {
        if max_points == 0 || to <= from {
            return;
        }
        let width = (to - from) / max_points as f64;
        bins.clear();
        bins.resize(max_points, None);
        let put = |bins: &mut Vec<Option<Bucket>>, t: f64, b: Bucket| {
            if t < from || t >= to {
                return;
            }
            let i = (((t - from) / width) as usize).min(max_points - 1);
            match &mut bins[i] {
                Some(acc) => {
                    acc.mean = merged_mean(acc.mean, acc.count, b.mean, b.count);
                    acc.min = acc.min.min(b.min);
                    acc.max = acc.max.max(b.max);
                    acc.count += b.count;
                }
                slot => *slot = Some(b),
            }
        };
        // The finest level that still reaches back to `from`; else the one reaching furthest.
        let raw_oldest = || raw.front().map(|(t, _)| t);
        if self.raw_covers(raw, from) {
            for (t, v) in raw_between(raw, from, to) {
                put(bins, t, Bucket::new(t, v));
            }
        } else {
            let tier = self
                .tiers
                .iter()
                .find(|t| t.oldest().is_some_and(|o| o <= from))
                .or_else(|| self.tiers.last())
                .expect("tiers is not empty");
            for b in tier.buckets_between(from, to) {
                // A bucket counts at its centre.
                put(bins, b.start + tier.width / 2.0, *b);
            }
            // Samples newer than the tier's open bucket do not exist: raw and tiers are fed
            // together. But a tier bucket is coarse; where raw covers the recent part of the
            // window, prefer its detail so the right edge of a chart is sharp.
            if let Some(ro) = raw_oldest() {
                let cut = from + (((ro - from) / width).ceil() * width);
                for bin in bins
                    .iter_mut()
                    .skip((((cut - from) / width) as usize).min(max_points))
                {
                    *bin = None;
                }
                for (t, v) in raw_between(raw, cut, to) {
                    put(bins, t, Bucket::new(t, v));
                }
            }
        }
        for (i, b) in bins.iter().enumerate() {
            if let Some(b) = b {
                f(Point {
                    t: from + (i as f64 + 0.5) * width,
                    min: b.min as f64,
                    mean: b.mean as f64,
                    max: b.max as f64,
                });
            }
        }
    }
}

/// Raw samples with `from <= t < to`: the ring is sorted by time, and a chart asks for a
/// few hundred of its thousands of samples every frame. Most ask for the newest ones (the
/// console's sparklines, every second): those are found by walking back from the end,
/// over memory the newest samples share, where a binary search over the whole ring would
/// touch a line of memory per step (most of them cold by the next frame). Anything
/// further back is found by binary search.
fn raw_between(raw: Raw<'_>, from: f64, to: f64) -> impl Iterator<Item = (f64, f32)> + '_ {
    /// How many samples back from the end the walk goes before it searches instead.
    const WALK: usize = 128;
    let hi = if raw.back().is_none_or(|(t, _)| t < to) {
        raw.len()
    } else {
        raw.partition_point(|t| t < to)
    };
    let floor = hi.saturating_sub(WALK);
    let mut lo = hi;
    while lo > floor && raw.time(lo - 1) >= from {
        lo -= 1;
    }
    if lo == floor && lo > 0 && raw.time(lo - 1) >= from {
        lo = raw.partition_point(|t| t < from);
    }
    raw.range(lo, hi)
}

/// The mean of `count` values whose mean is `mean` and `more` values whose mean is
/// `more_mean`, in f32, as [`History::window`] merges the buckets of one column (the older
/// first): what else bins the same samples must merge them by it to show the same means.
pub fn merged_mean(mean: f32, count: u32, more_mean: f32, more: u32) -> f32 {
    (mean * count as f32 + more_mean * more as f32) / (count + more) as f32
}

/// All series of a node.
#[derive(Debug)]
pub struct History {
    config: HistoryConfig,
    /// By GPU index.
    gpus: Vec<GpuSeries>,
    /// This history's own number (see [`History::id`]).
    id: u64,
}

/// The number of the next history made (or cloned).
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl Clone for History {
    /// A copy is another history: it has a number of its own.
    fn clone(&self) -> History {
        History {
            config: self.config.clone(),
            gpus: self.gpus.clone(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// One GPU's series: their raw rings together, their tiers each its own.
#[derive(Debug, Clone, Default)]
struct GpuSeries {
    /// Made with the GPU's first sample.
    raw: Option<RawRows>,
    /// By [`Metric::slot`].
    series: [Option<Series>; SERIES],
}

impl GpuSeries {
    fn get(&self, metric: Metric) -> Option<(&Series, Raw<'_>)> {
        let s = self.series[metric.slot()].as_ref()?;
        Some((s, s.raw(self.raw.as_ref()?, metric.slot())))
    }
}

impl History {
    pub fn new(config: HistoryConfig) -> History {
        History {
            config,
            gpus: Vec::new(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A number no other history in this process has (a clone gets one of its own): what
    /// was read from a history stays true of it while samples are only appended, which is
    /// all [`History::push`] does (the rings drop the oldest, far behind any chart).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The rings' sizes it was made with.
    pub fn config(&self) -> &HistoryConfig {
        &self.config
    }

    /// No sample recorded yet.
    pub fn is_empty(&self) -> bool {
        self.all_series().next().is_none()
    }

    /// Append one value. A sample no newer than the series' newest is dropped (time only runs
    /// forward in a series, and a repeated reading must not count twice).
    pub fn push(&mut self, gpu: usize, metric: Metric, t: f64, value: f64) {
        if !value.is_finite() {
            return;
        }
        if self.gpus.len() <= gpu {
            self.gpus.resize_with(gpu + 1, GpuSeries::default);
        }
        let g = &mut self.gpus[gpu];
        let rows = g
            .raw
            .get_or_insert_with(|| RawRows::new(self.config.raw_capacity));
        g.series[metric.slot()]
            .get_or_insert_with(|| Series::new(&self.config))
            .push(rows, metric.slot(), t, value as f32);
    }

    /// Put `older` (points of some series, each series' oldest first) in front of what the
    /// history holds: how a console that drew its first frame before the daemon's history came
    /// takes that history in. Of each series, the points older than its oldest sample go in
    /// front; the others are dropped (the samples the history took stand). The series of each
    /// GPU in `older` are emptied (in place: their rings keep their memory) and filled again
    /// for that, with those points and then every sample they held, which is only done while
    /// they still hold each sample they took (no raw ring has wrapped, so no sample lives in a
    /// tier's buckets alone). Otherwise that GPU's points are pushed as they come, which keeps
    /// those newer than each series' newest sample. True when every GPU in `older` was filled
    /// again.
    pub fn prepend(&mut self, older: &[SeriesPoints]) -> bool {
        let mut gpus: Vec<usize> = older.iter().map(|s| s.gpu).collect();
        gpus.sort_unstable();
        gpus.dedup();
        let mut all = true;
        for gpu in gpus {
            let series = older.iter().filter(|s| s.gpu == gpu);
            let whole = Metric::ALL.iter().all(|&m| {
                self.last(gpu, m).is_none() || self.raw_covers(gpu, m, f64::NEG_INFINITY)
            });
            // What the GPU's series hold, taken out; the series emptied in place, so that
            // their rings' memory is written over rather than given back and taken again.
            let mut held: Vec<(Metric, Vec<(f64, f32)>)> = Vec::new();
            if let Some(g) = self.gpus.get_mut(gpu).filter(|_| whole) {
                for m in Metric::ALL {
                    if let Some((_, raw)) = g.get(m) {
                        held.push((
                            m,
                            raw_between(raw, f64::NEG_INFINITY, f64::INFINITY).collect(),
                        ));
                    }
                }
                g.series.iter_mut().flatten().for_each(Series::clear);
            }
            all &= whole;
            for s in series {
                let oldest = held
                    .iter()
                    .find(|(m, _)| *m == s.metric)
                    .and_then(|(_, v)| v.first())
                    .map(|&(t, _)| t);
                for p in s.points.iter().filter(|p| oldest.is_none_or(|o| p.t < o)) {
                    self.push(gpu, s.metric, p.t, p.mean);
                }
            }
            for (m, samples) in &held {
                for &(t, v) in samples {
                    self.push(gpu, *m, t, f64::from(v));
                }
            }
            if !held.is_empty() {
                // Not only appended to: what was read from it is no longer true of it.
                self.id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            }
        }
        all
    }

    /// Record every metric the snapshot has; absent metrics, lost and stale GPUs add nothing.
    pub fn record(&mut self, snap: &Snapshot) {
        for g in &snap.gpus {
            if g.lost || g.stale {
                continue;
            }
            let i = g.index as usize;
            let t = g.time_s;
            let values = [
                (Metric::UtilGpu, g.util_gpu_pct),
                (Metric::UtilMem, g.util_mem_pct),
                (Metric::MemoryUsed, g.memory_used_bytes.map(|b| b as f64)),
                (Metric::Temperature, g.temperature_c),
                (Metric::Power, g.power_w),
                (Metric::PowerLimit, g.power_limit_w),
                (Metric::SmClock, g.sm_clock_mhz.map(f64::from)),
                (Metric::Fan, g.fan_pct),
                (Metric::PcieRx, g.pcie_rx_kbps.map(|v| v as f64)),
                (Metric::PcieTx, g.pcie_tx_kbps.map(|v| v as f64)),
                (
                    Metric::PowerLimited,
                    g.throttle_reasons
                        .map(|b| f64::from(u8::from(throttle::power_limited(b)))),
                ),
                (
                    Metric::ThermalLimited,
                    g.throttle_reasons
                        .map(|b| f64::from(u8::from(throttle::thermal_limited(b)))),
                ),
            ];
            for (m, v) in values {
                if let Some(v) = v {
                    self.push(i, m, t, v);
                }
            }
        }
    }

    /// At most `max_points` points covering `[from, to)`, oldest first; spans with no samples
    /// are left out (a gap, not a zero).
    pub fn window(
        &self,
        gpu: usize,
        metric: Metric,
        from: f64,
        to: f64,
        max_points: usize,
    ) -> Vec<Point> {
        let mut points = Vec::new();
        self.window_each(gpu, metric, from, to, max_points, |p| points.push(p));
        points
    }

    /// The points of [`History::window`], oldest first, to `f` (without collecting them).
    pub fn window_each(
        &self,
        gpu: usize,
        metric: Metric,
        from: f64,
        to: f64,
        max_points: usize,
        f: impl FnMut(Point),
    ) {
        if let Some((s, raw)) = self.gpus.get(gpu).and_then(|g| g.get(metric)) {
            s.window_each(raw, from, to, max_points, f);
        }
    }

    /// Whether [`History::window`] answers `[from, …)` from raw samples: the raw ring reaches
    /// back to `from` (or holds every sample the series has had). Then [`History::raw_each`]
    /// gives those samples.
    pub fn raw_covers(&self, gpu: usize, metric: Metric, from: f64) -> bool {
        self.gpus
            .get(gpu)
            .and_then(|g| g.get(metric))
            .is_some_and(|(s, raw)| s.raw_covers(raw, from))
    }

    /// Each raw sample with `from <= t < to`, oldest first, to `f` (as time and value).
    pub fn raw_each(
        &self,
        gpu: usize,
        metric: Metric,
        from: f64,
        to: f64,
        mut f: impl FnMut(f64, f32),
    ) {
        if let Some((_, raw)) = self.gpus.get(gpu).and_then(|g| g.get(metric)) {
            for (t, v) in raw_between(raw, from, to) {
                f(t, v);
            }
        }
    }

    /// For a 0/1 series ([`Metric::PowerLimited`], [`Metric::ThermalLimited`]): seconds spent
    /// at 1 within `[from, to)` and seconds the series covers there, estimated over `bins`
    /// equal spans (a span with no samples counts as neither). None without samples.
    pub fn time_at_one(
        &self,
        gpu: usize,
        metric: Metric,
        from: f64,
        to: f64,
        bins: usize,
    ) -> Option<(f64, f64)> {
        let bins = bins.max(1);
        let width = (to - from) / bins as f64;
        let points = self.window(gpu, metric, from, to, bins);
        if points.is_empty() {
            return None;
        }
        let on: f64 = points.iter().map(|p| p.mean.clamp(0.0, 1.0) * width).sum();
        Some((on, points.len() as f64 * width))
    }

    /// The newest value of a series and its time.
    pub fn last(&self, gpu: usize, metric: Metric) -> Option<(f64, f64)> {
        let (_, raw) = self.gpus.get(gpu)?.get(metric)?;
        raw.back().map(|(t, v)| (t, f64::from(v)))
    }

    /// Memory the series would hold with every ring full: the fixed budget.
    pub fn budget_bytes(&self) -> usize {
        self.gpus
            .iter()
            .filter_map(|g| g.raw.as_ref())
            .map(|r| RawRows::bytes(r.capacity))
            .sum::<usize>()
            + self.all_series().map(Series::budget_bytes).sum::<usize>()
    }

    /// Memory the series hold now (ring buffers as allocated).
    pub fn allocated_bytes(&self) -> usize {
        self.gpus
            .iter()
            .filter_map(|g| g.raw.as_ref())
            .map(|r| {
                r.t.capacity() * std::mem::size_of::<f64>()
                    + r.v.capacity() * std::mem::size_of::<f32>()
            })
            .sum::<usize>()
            + self
                .all_series()
                .map(Series::allocated_bytes)
                .sum::<usize>()
    }

    fn all_series(&self) -> impl Iterator<Item = &Series> {
        self.gpus.iter().flat_map(|g| g.series.iter().flatten())
    }
}

impl Default for History {
    fn default() -> Self {
        History::new(HistoryConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_samples_between_two_times_are_those_a_search_finds() {
        let mut h = History::new(HistoryConfig {
            raw_capacity: 400,
            tiers: Vec::new(),
        });
        // A full ring that has wrapped: its oldest sample is not in slot 0.
        for i in 0..500 {
            h.push(3, Metric::Power, 1000.0 + i as f64 * 0.5, i as f64);
        }
        let (_, raw) = h.gpus[3].get(Metric::Power).unwrap();
        assert_eq!(raw.len(), 400);
        let all: Vec<(f64, f32)> = (0..500)
            .map(|i| (1000.0 + i as f64 * 0.5, i as f32))
            .skip(100)
            .collect();
        let search = |from: f64, to: f64| -> Vec<(f64, f32)> {
            all.iter()
                .copied()
                .filter(|&(t, _)| t >= from && t < to)
                .collect()
        };
        // Windows at the end (walked), far back (searched), across the walk's reach, empty,
        // reversed, before and after every sample.
        for (from, to) in [
            (1240.0, 1250.0),
            (1200.0, 1300.0),
            (1000.0, 1010.3),
            (1040.0, 1070.0),
            (1050.0, 1050.5),
            (1100.0, 1240.0),
            (1185.75, 1249.6),
            (1300.0, 1310.0),
            (900.0, 1000.0),
            (1200.0, 1100.0),
            (0.0, 1e12),
            (1249.5, 1249.5),
        ] {
            let got: Vec<_> = raw_between(raw, from, to).collect();
            assert_eq!(got, search(from, to), "[{from}, {to})");
        }
    }

    /// A GPU's series share their raw buffer, slot by slot, yet each is a ring of its own: one
    /// pushed at other times, less often, or first filled with an older stretch (a console's
    /// backfill from the daemon) keeps exactly its own samples.
    #[test]
    fn a_gpus_series_keep_their_own_samples_in_the_shared_rows() {
        let mut h = History::new(HistoryConfig {
            raw_capacity: 10,
            tiers: vec![(5.0, 4)],
        });
        for i in 0..25 {
            let t = 100.0 + f64::from(i);
            h.push(0, Metric::Power, t, f64::from(i));
            if i % 3 == 0 {
                h.push(0, Metric::Temperature, t + 0.5, f64::from(-i));
            }
        }
        // Backfill of another series, older than all the others.
        for i in 0..4 {
            h.push(
                0,
                Metric::SmClock,
                50.0 + f64::from(i),
                1000.0 + f64::from(i),
            );
        }
        h.push(1, Metric::Power, 7.0, 1.0);
        let raw = |m| -> Vec<(f64, f32)> {
            let (_, r) = h.gpus[0].get(m).unwrap();
            r.range(0, r.len()).collect()
        };
        let power: Vec<(f64, f32)> = (15..25).map(|i| (100.0 + i as f64, i as f32)).collect();
        assert_eq!(raw(Metric::Power), power);
        let temp: Vec<(f64, f32)> = (0..25)
            .filter(|i| i % 3 == 0)
            .map(|i| (100.5 + i as f64, -i as f32))
            .collect();
        assert_eq!(raw(Metric::Temperature), temp);
        assert_eq!(raw(Metric::SmClock).len(), 4);
        assert_eq!(h.last(0, Metric::SmClock), Some((53.0, 1003.0)));
        assert_eq!(h.last(1, Metric::Power), Some((7.0, 1.0)));
        assert_eq!(h.last(0, Metric::Fan), None);
        assert_eq!(h.last(2, Metric::Power), None);
        // A window holds its own series' samples only.
        let old = h.window(0, Metric::Temperature, 100.0, 110.0, 2);
        assert_eq!(old.len(), 2, "{old:?}");
        assert_eq!((old[0].max, old[0].min), (0.0, -3.0));
    }

    /// A history that still holds every sample is filled again with the points older than its
    /// own in front (a GPU not among them is left as it was); one whose raw ring has wrapped
    /// (samples live in a tier alone) is not, and keeps only the points newer than it holds.
    #[test]
    fn older_points_go_in_front_only_of_a_history_that_holds_every_sample() {
        let config = HistoryConfig {
            raw_capacity: 4,
            tiers: vec![(10.0, 10)],
        };
        let point = |t: f64| Point {
            t,
            min: t,
            mean: t,
            max: t,
        };
        // The last point is not older than what either history holds.
        let older = [SeriesPoints {
            gpu: 1,
            metric: Metric::Power,
            points: vec![point(50.0), point(51.0), point(52.0)],
        }];
        let raw = |h: &History, gpu| {
            let mut v = Vec::new();
            h.raw_each(
                gpu,
                Metric::Power,
                f64::NEG_INFINITY,
                f64::INFINITY,
                |t, _| v.push(t),
            );
            v
        };

        let mut young = History::new(config.clone());
        young.push(1, Metric::Power, 52.0, 1.0);
        young.push(0, Metric::Fan, 52.0, 40.0);
        assert!(young.prepend(&older));
        assert_eq!(raw(&young, 1), [50.0, 51.0, 52.0]);
        assert_eq!(
            young.last(1, Metric::Power),
            Some((52.0, 1.0)),
            "its own sample stands"
        );
        assert_eq!(young.last(0, Metric::Fan), Some((52.0, 40.0)));
        assert_eq!(young.window(1, Metric::Power, 40.0, 60.0, 1)[0].mean, 34.0);

        let mut old = History::new(config);
        for t in 52..58 {
            old.push(1, Metric::Power, f64::from(t), 1.0);
        }
        assert!(!old.prepend(&older));
        assert_eq!(
            raw(&old, 1),
            [54.0, 55.0, 56.0, 57.0],
            "older points dropped"
        );
    }

    #[test]
    fn time_limited_is_the_share_of_samples_at_one() {
        let mut h = History::default();
        // 60 s at 1 Hz: power-limited for the last 15 s only.
        for i in 0..60 {
            let v = if i >= 45 { 1.0 } else { 0.0 };
            h.push(0, Metric::PowerLimited, 1000.0 + i as f64, v);
        }
        let (on, covered) = h
            .time_at_one(0, Metric::PowerLimited, 1000.0, 1060.0, 60)
            .unwrap();
        assert!((on - 15.0).abs() < 1e-6, "{on}");
        assert!((covered - 60.0).abs() < 1e-6, "{covered}");
        // Coarser bins give the same total.
        let (on, _) = h
            .time_at_one(0, Metric::PowerLimited, 1000.0, 1060.0, 4)
            .unwrap();
        assert!((on - 15.0).abs() < 1e-3, "{on}");
        assert_eq!(
            h.time_at_one(0, Metric::ThermalLimited, 1000.0, 1060.0, 4),
            None
        );
    }
    use proptest::prelude::*;

    fn small() -> HistoryConfig {
        HistoryConfig {
            raw_capacity: 50,
            tiers: vec![(1.0, 30), (10.0, 30)],
        }
    }

    #[test]
    fn recent_window_uses_raw_samples() {
        let mut h = History::new(small());
        for i in 0..20 {
            h.push(0, Metric::Power, 100.0 + i as f64 * 0.1, i as f64);
        }
        let pts = h.window(0, Metric::Power, 100.0, 102.0, 100);
        assert_eq!(
            pts.len(),
            20,
            "one point per sample when columns outnumber samples"
        );
        assert_eq!(pts[0].mean, 0.0);
        assert_eq!(pts[19].mean, 19.0);
        assert_eq!(h.last(0, Metric::Power), Some((101.9, 19.0)));
    }

    #[test]
    fn raw_samples_are_given_where_the_ring_reaches() {
        let mut h = History::new(small());
        for i in 0..80 {
            h.push(0, Metric::Power, 100.0 + f64::from(i), f64::from(i));
        }
        // The ring (50) holds 130..=179; windows from before it come from the tiers.
        let mut seen = Vec::new();
        h.raw_each(0, Metric::Power, 170.0, 173.5, |t, v| seen.push((t, v)));
        assert_eq!(
            seen,
            [(170.0, 70.0), (171.0, 71.0), (172.0, 72.0), (173.0, 73.0)]
        );
        assert!(h.raw_covers(0, Metric::Power, 130.0));
        assert!(!h.raw_covers(0, Metric::Power, 129.5));
        assert!(!h.raw_covers(1, Metric::Power, 170.0), "no such GPU");
        assert!(!h.raw_covers(0, Metric::Fan, 170.0), "no such series");
        // A young series' ring holds all of it: any window is raw.
        let mut young = History::new(small());
        young.push(0, Metric::Power, 100.0, 1.0);
        assert!(young.raw_covers(0, Metric::Power, 0.0));
        // A copy is another history.
        assert_ne!(h.clone().id(), h.id());
        assert_ne!(History::new(small()).id(), h.id());
    }

    #[test]
    fn a_young_series_shows_in_a_wide_window() {
        // Two seconds of samples, asked for as two columns of a minute: both land in the last
        // column rather than in a coarse bucket centred in the future.
        let mut h = History::new(small());
        for i in 0..20 {
            h.push(0, Metric::Power, 1000.0 + i as f64 * 0.1, 5.0);
        }
        let pts = h.window(0, Metric::Power, 1002.0 - 60.0, 1003.0, 2);
        assert_eq!(pts.len(), 1, "{pts:?}");
        assert_eq!((pts[0].min, pts[0].max), (5.0, 5.0));
    }

    #[test]
    fn a_repeated_reading_counts_once() {
        let mut h = History::new(small());
        h.push(0, Metric::Power, 10.0, 100.0);
        h.push(0, Metric::Power, 10.0, 100.0);
        h.push(0, Metric::Power, 10.5, 300.0);
        h.push(0, Metric::Power, 10.2, 999.0);
        let pts = h.window(0, Metric::Power, 10.0, 11.0, 1);
        assert_eq!(pts.len(), 1);
        assert_eq!((pts[0].min, pts[0].max), (100.0, 300.0));
        assert!((pts[0].mean - 200.0).abs() < 1e-6, "{:?}", pts[0]);
    }

    #[test]
    fn downsampling_keeps_min_mean_max() {
        let mut h = History::new(small());
        // 10 samples in one second: 0..9
        for i in 0..10 {
            h.push(1, Metric::Temperature, 10.0 + i as f64 * 0.1, i as f64);
        }
        let pts = h.window(1, Metric::Temperature, 10.0, 11.0, 1);
        assert_eq!(pts.len(), 1);
        assert_eq!((pts[0].min, pts[0].max), (0.0, 9.0));
        assert!((pts[0].mean - 4.5).abs() < 1e-6);
        assert!((pts[0].t - 10.5).abs() < 1e-9);
    }

    #[test]
    fn old_windows_come_from_coarse_tiers_and_memory_is_bounded() {
        let mut h = History::new(small());
        // 1000 s at 1 Hz: raw keeps 50 s, 1 s tier keeps 30 s, 10 s tier keeps 300 s.
        for i in 0..1000 {
            h.push(0, Metric::UtilGpu, i as f64, (i % 10) as f64);
        }
        let pts = h.window(0, Metric::UtilGpu, 800.0, 1000.0, 20);
        assert!(!pts.is_empty());
        // 10 s buckets of 0..9 all have min 0, max 9, mean 4.5.
        let old: Vec<_> = pts.iter().filter(|p| p.t < 940.0).collect();
        assert!(!old.is_empty());
        for p in old {
            assert_eq!((p.min, p.max), (0.0, 9.0), "{p:?}");
            assert!((p.mean - 4.5).abs() < 1e-4);
        }
        // Nothing older than the coarsest tier's reach.
        assert!(
            h.window(0, Metric::UtilGpu, 0.0, 600.0, 10)
                .iter()
                .all(|p| p.t >= 600.0 - 300.0 - 10.0)
        );
        let before = h.allocated_bytes();
        for i in 1000..3000 {
            h.push(0, Metric::UtilGpu, i as f64, 1.0);
        }
        assert_eq!(h.allocated_bytes(), before, "full rings never reallocate");
        assert!(h.allocated_bytes() <= h.budget_bytes() + 1024);
    }

    #[test]
    fn absent_and_lost_are_gaps_not_zeros() {
        use crate::telemetry::{GpuSample, Snapshot};
        let mut h = History::default();
        let snap = Snapshot {
            time_s: 5.0,
            gpus: vec![
                GpuSample {
                    index: 0,
                    time_s: 5.0,
                    power_w: Some(300.0),
                    ..Default::default()
                },
                GpuSample {
                    index: 1,
                    time_s: 5.0,
                    lost: true,
                    power_w: Some(1.0),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        h.record(&snap);
        assert_eq!(h.last(0, Metric::Power), Some((5.0, 300.0)));
        assert_eq!(h.last(0, Metric::Temperature), None);
        assert_eq!(h.last(1, Metric::Power), None);
    }

    #[test]
    fn a_tier_the_raw_ring_outreaches_is_not_kept() {
        let tiers = |hz: f64| HistoryConfig::for_period(1.0 / hz).tiers;
        assert_eq!(
            tiers(10.0),
            HistoryConfig::default().tiers,
            "10 min raw: every tier"
        );
        assert_eq!(
            tiers(1.0),
            vec![(15.0, 5760), (120.0, 5040)],
            "100 min raw, 1 h tier"
        );
        assert_eq!(
            tiers(0.05),
            vec![(120.0, 5040)],
            "33 h raw outreaches the 15 s day too"
        );
        // What a window shows does not change: at 1 Hz a window that starts further back
        // than the raw ring comes from the 15 s tier (plus raw detail), with or without
        // the 1 s one.
        let (mut full, mut lean) = (
            History::new(HistoryConfig::default()),
            History::new(HistoryConfig::for_period(1.0)),
        );
        for i in 0..8000 {
            let (t, v) = (1_000_000.0 + f64::from(i), f64::from(i % 97));
            full.push(0, Metric::Power, t, v);
            lean.push(0, Metric::Power, t, v);
        }
        for (from, to) in [(1_007_000.0, 1_008_000.0), (1_000_500.0, 1_008_000.0)] {
            assert_eq!(
                full.window(0, Metric::Power, from, to, 120),
                lean.window(0, Metric::Power, from, to, 120),
                "window {from}..{to}"
            );
        }
        assert!(lean.budget_bytes() < full.budget_bytes());
    }

    #[test]
    fn default_budget_for_eight_gpus_a_week_fits_64_mb() {
        let mut h = History::default();
        for g in 0..8 {
            for m in Metric::ALL {
                h.push(g, m, 0.0, 1.0);
            }
        }
        let budget = h.budget_bytes();
        assert!(budget < 64 << 20, "budget {budget} bytes");
        let week = 7.0 * 86400.0;
        let (width, n) = *HistoryConfig::default().tiers.last().unwrap();
        assert!(
            width * n as f64 >= week,
            "coarsest tier must reach a week back"
        );
    }

    proptest! {
        #[test]
        fn window_points_are_bounded_ordered_and_consistent(
            values in proptest::collection::vec(0.0f64..1000.0, 1..400),
            step in 0.05f64..20.0,
            cols in 1usize..80,
            lo in 0.0f64..1.0,
            span in 0.01f64..1.0,
        ) {
            let mut h = History::new(small());
            for (i, v) in values.iter().enumerate() {
                h.push(0, Metric::Power, i as f64 * step, *v);
            }
            let end = values.len() as f64 * step;
            let from = lo * end;
            let to = from + span * end + 1e-9;
            let pts = h.window(0, Metric::Power, from, to, cols);
            prop_assert!(pts.len() <= cols);
            let vmin = values.iter().cloned().fold(f64::INFINITY, f64::min);
            let vmax = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            for w in pts.windows(2) {
                prop_assert!(w[0].t < w[1].t);
            }
            for p in &pts {
                prop_assert!(p.min <= p.mean + 1e-3 && p.mean <= p.max + 1e-3, "{:?}", p);
                prop_assert!(p.min >= vmin - 1e-3 && p.max <= vmax + 1e-3);
                prop_assert!(p.t >= from && p.t < to);
            }
        }

        #[test]
        fn window_matches_a_naive_reference(
            times in proptest::collection::vec(0.0f64..100.0, 1..300),
            from in 0.0f64..100.0,
            span in 0.1f64..100.0,
            cols in 1usize..50,
        ) {
            let mut times = times;
            times.sort_by(f64::total_cmp);
            times.dedup();
            let mut h = History::new(HistoryConfig { raw_capacity: 1000, tiers: vec![(1.0, 10)] });
            for (i, t) in times.iter().enumerate() {
                h.push(0, Metric::Power, *t, i as f64);
            }
            let to = from + span;
            let width = span / cols as f64;
            let mut naive: Vec<Vec<f64>> = vec![Vec::new(); cols];
            for (i, t) in times.iter().enumerate() {
                if *t >= from && *t < to {
                    naive[(((t - from) / width) as usize).min(cols - 1)].push(i as f64);
                }
            }
            let want: Vec<(f64, f64)> = naive.iter().filter(|b| !b.is_empty())
                .map(|b| (b[0], *b.last().unwrap())).collect();
            let got: Vec<(f64, f64)> = h.window(0, Metric::Power, from, to, cols)
                .iter().map(|p| (p.min, p.max)).collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn memory_never_exceeds_budget(n in 1usize..5000, step in 0.01f64..100.0) {
            let mut h = History::new(small());
            for i in 0..n {
                h.push(0, Metric::Fan, i as f64 * step, 1.0);
            }
            let (s, raw) = h.gpus[0].get(Metric::Fan).unwrap();
            prop_assert!(raw.len() <= 50);
            prop_assert!(s.tiers.iter().all(|t| t.done.len() <= t.capacity));
        }
    }
}
