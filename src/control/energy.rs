//! Energy: per GPU from NVML's total-energy counter, integrating power where the counter is
//! absent; per run, the energy of its GPUs while it lives, in joules, kWh, joules per sample and
//! money at a price per kWh.
//!
//! [`GpuMeter`] turns successive samples of one GPU into energy increments. With the counter
//! (millijoules since the driver loaded, read as joules) an increment is the counter's
//! difference, exact whatever the sample rate. Without it, or when the counter went backwards
//! (a driver reload resets it), the increment is the trapezoid of the two power readings over the
//! time between them. A gap longer than [`MAX_GAP_S`] with no counter is not bridged (nothing
//! is known about what the GPU drew meanwhile).
//!
//! A counter is believed only as far as physics allows: a GPU cannot draw more than its maximum
//! power limit (else [`RATED_MAX_W`]), so a difference above [`counter_bound_j`] for the time
//! between two samples (a wild reading, a wrap) is set aside like a counter that went back, and
//! the interval is integrated from power instead. The meter keeps a note of the first such
//! interval for the daemon to say once ([`GpuMeter::take_note`]).
//!
//! [`RunEnergy`] is what `ps --json`, `summary.json` and the Run view show. Samples come from
//! the trainer's metrics (`metrics.jsonl`) when the run reports them.
//!
//! Pure: no clock, no files; the daemon's control loop feeds it.

use serde::{Deserialize, Serialize};

use crate::training::{JobTally, MetricsPoint, MetricsReport};

pub use crate::profile::{MAX_GRID_CO2_G_PER_KWH, MAX_PUE, check_grid_co2, check_pue};

/// Joules in a kilowatt-hour.
pub const J_PER_KWH: f64 = 3.6e6;

/// Without a counter, power readings further apart than this are not integrated, seconds.
pub const MAX_GAP_S: f64 = 30.0;

/// The most any GPU board draws, watts: the bound on a counter's increments when a GPU's own
/// maximum power limit is unknown or does not read as a plausible number.
pub const RATED_MAX_W: f64 = 3_000.0;

/// A counter may run this much ahead of the GPU's maximum power times the time between two
/// samples: power excursions above the limit, and NVML reads that are not at the sample's
/// instant…
pub const COUNTER_MARGIN: f64 = 1.5;
/// … plus this many seconds at maximum power (a slow read shifts one reading by that much).
pub const COUNTER_SLACK_S: f64 = 1.0;

/// The most a counter may move in `dt_s` seconds on a GPU whose maximum power limit reads
/// `max_w` (None, or implausible: [`RATED_MAX_W`]), joules.
pub fn counter_bound_j(max_w: Option<f64>, dt_s: f64) -> f64 {
    let max = max_w
        .filter(|m| m.is_finite() && *m > 0.0 && *m <= RATED_MAX_W)
        .unwrap_or(RATED_MAX_W);
    max * (COUNTER_MARGIN * dt_s.max(0.0) + COUNTER_SLACK_S)
}

/// How an increment was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnergySource {
    /// NVML's total-energy counter.
    Counter,
    /// Power integrated over time.
    Power,
}

/// One GPU's energy since the meter started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuMeter {
    last: Option<Reading>,
    total_j: f64,
    /// Seconds covered by the counter and by integration, for saying which one measured.
    counter_s: f64,
    power_s: f64,
    /// What measured the last increment.
    last_source: Option<EnergySource>,
    /// The first counter difference set aside, in words, until taken.
    note: Option<String>,
    /// A difference was set aside already (it is said once).
    noted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Reading {
    time_s: f64,
    counter_j: Option<f64>,
    power_w: Option<f64>,
}

impl GpuMeter {
    pub fn new() -> GpuMeter {
        GpuMeter::default()
    }

    /// Take a sample at `time_s` (seconds; only differences matter) of a GPU whose maximum power
    /// limit reads `max_w`; returns the joules since the previous sample (0 for the first, or
    /// for a sample that does not move time forward).
    pub fn update(
        &mut self,
        time_s: f64,
        counter_j: Option<f64>,
        power_w: Option<f64>,
        max_w: Option<f64>,
    ) -> f64 {
        let now = Reading {
            time_s,
            counter_j: counter_j.filter(|c| c.is_finite() && *c >= 0.0),
            power_w: power_w.filter(|p| p.is_finite() && *p >= 0.0),
        };
        let Some(prev) = self.last else {
            self.last = Some(now);
            return 0.0;
        };
        let dt = time_s - prev.time_s;
        if dt <= 0.0 {
            // A repeated (or older) sample: keep the newest counter, add nothing.
            return 0.0;
        }
        self.last = Some(now);
        let bound = counter_bound_j(max_w, dt);
        self.last_source = None;
        let delta = match (prev.counter_j, now.counter_j) {
            (Some(a), Some(b)) if b >= a && b - a <= bound => {
                self.counter_s += dt;
                self.last_source = Some(EnergySource::Counter);
                b - a
            }
            counters => {
                if let (Some(a), Some(b)) = counters {
                    self.set_aside(a, b, dt, bound);
                }
                match (prev.power_w, now.power_w) {
                    _ if dt > MAX_GAP_S => 0.0,
                    (Some(a), Some(b)) => {
                        self.power_s += dt;
                        self.last_source = Some(EnergySource::Power);
                        (a + b) / 2.0 * dt
                    }
                    (None, Some(p)) | (Some(p), None) => {
                        self.power_s += dt;
                        self.last_source = Some(EnergySource::Power);
                        p * dt
                    }
                    (None, None) => 0.0,
                }
            }
        };
        self.total_j += delta;
        delta
    }

    /// The counter moved from `a` to `b` joules in `dt` seconds, back or beyond `bound`: the
    /// first time, in words for the event log.
    fn set_aside(&mut self, a: f64, b: f64, dt: f64, bound: f64) {
        if self.noted {
            return;
        }
        self.noted = true;
        let moved = if b < a {
            format!("went back by {:.3e} J", a - b)
        } else {
            format!("jumped by {:.3e} J", b - a)
        };
        self.note = Some(format!(
            "its energy counter {moved} in {dt:.1} s (at most {bound:.0} J is possible at its \
             maximum power): such an interval is counted from power × time instead; said once"
        ));
    }

    /// The first counter difference set aside, in words, once (None afterwards, and before).
    pub fn take_note(&mut self) -> Option<String> {
        self.note.take()
    }

    /// What measured the last increment (None: nothing was added).
    pub fn last_source(&self) -> Option<EnergySource> {
        self.last_source
    }

    pub fn total_j(&self) -> f64 {
        self.total_j
    }

    /// What measured most of the time covered so far (None before two samples).
    pub fn source(&self) -> Option<EnergySource> {
        if self.counter_s == 0.0 && self.power_s == 0.0 {
            None
        } else if self.counter_s >= self.power_s {
            Some(EnergySource::Counter)
        } else {
            Some(EnergySource::Power)
        }
    }
}

/// The price of energy: money per kWh, in a currency named for display.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Price {
    pub per_kwh: f64,
    /// `EUR`, `USD`, `$` … shown after the figure.
    #[serde(default)]
    pub currency: String,
}

/// A run's energy: `ps --json`'s `energy`, `summary.json`'s `energy_j` and `energy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEnergy {
    pub energy_j: f64,
    pub kwh: f64,
    /// Per GPU the run sees: `(index, joules)`.
    pub per_gpu: Vec<GpuEnergy>,
    /// Training samples the run reported, when it reports them.
    pub samples: Option<u64>,
    pub j_per_sample: Option<f64>,
    /// `kwh × price`, when a price is configured.
    pub cost: Option<f64>,
    pub currency: Option<String>,
    /// What measured it (counter, or power integrated where the counter is absent).
    pub source: Option<EnergySource>,
    /// `kwh × grid intensity`, grams of CO2, when an intensity is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub co2_g: Option<f64>,
    /// The facility's power usage effectiveness the figures below use, when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pue: Option<f64>,
    /// `kwh × PUE`: the GPUs' energy with the facility's share (cooling, power delivery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facility_kwh: Option<f64>,
    /// `facility_kwh × price`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facility_cost: Option<f64>,
    /// `facility_kwh × grid intensity`, grams of CO2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facility_co2_g: Option<f64>,
}

/// What a kWh costs and emits, and what the facility adds to it: `[energy]` in control.toml
/// (the node) and in a run's profile (the run; its fields win one by one).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnergyRates {
    pub price: Option<Price>,
    /// Grid carbon intensity, grams of CO2 per kWh.
    pub grid_co2_g_per_kwh: Option<f64>,
    /// Power usage effectiveness: the facility's energy over its IT equipment's (≥ 1).
    pub pue: Option<f64>,
}

impl From<&crate::profile::EnergySettings> for EnergyRates {
    fn from(e: &crate::profile::EnergySettings) -> EnergyRates {
        EnergyRates {
            price: e.price_per_kwh.map(|per_kwh| Price {
                per_kwh,
                currency: e.currency.clone().unwrap_or_default(),
            }),
            grid_co2_g_per_kwh: e.grid_co2_g_per_kwh,
            pue: e.pue,
        }
    }
}

impl EnergyRates {
    /// These rates with `node`'s where these have none.
    pub fn over(&self, node: &EnergyRates) -> EnergyRates {
        EnergyRates {
            price: self.price.clone().or_else(|| node.price.clone()),
            grid_co2_g_per_kwh: self.grid_co2_g_per_kwh.or(node.grid_co2_g_per_kwh),
            pue: self.pue.or(node.pue),
        }
    }
}

/// One GPU's share of a run's energy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GpuEnergy {
    pub gpu: u32,
    pub energy_j: f64,
}

impl RunEnergy {
    /// The figures for `per_gpu` joules, `samples` reported, at `price`.
    pub fn new(
        per_gpu: Vec<GpuEnergy>,
        samples: Option<u64>,
        price: Option<&Price>,
        source: Option<EnergySource>,
    ) -> RunEnergy {
        // Folded from +0: `sum` of no `f64` is -0.0, which prints as `-0 Wh`.
        let energy_j: f64 = per_gpu.iter().map(|g| g.energy_j).fold(0.0, |a, b| a + b);
        let kwh = energy_j / J_PER_KWH;
        RunEnergy {
            energy_j,
            kwh,
            per_gpu,
            samples,
            j_per_sample: samples.filter(|&s| s > 0).map(|s| energy_j / s as f64),
            cost: price.map(|p| kwh * p.per_kwh),
            currency: price.map(|p| p.currency.clone()).filter(|c| !c.is_empty()),
            source,
            co2_g: None,
            pue: None,
            facility_kwh: None,
            facility_cost: None,
            facility_co2_g: None,
        }
    }

    /// The figures at `rates`: cost (replacing the one [`RunEnergy::new`] priced, where a
    /// price is given), CO2, and the facility's share through its PUE.
    pub fn with_rates(mut self, rates: &EnergyRates) -> RunEnergy {
        if let Some(p) = &rates.price {
            self.cost = Some(self.kwh * p.per_kwh);
            self.currency = Some(p.currency.clone()).filter(|c| !c.is_empty());
        }
        let grid = rates.grid_co2_g_per_kwh;
        self.co2_g = grid.map(|g| self.kwh * g);
        self.pue = rates.pue;
        self.facility_kwh = rates.pue.map(|p| self.kwh * p);
        // kWh × PUE × price is the cost × PUE; likewise the CO2.
        self.facility_cost = self.cost.zip(rates.pue).map(|(c, p)| c * p);
        self.facility_co2_g = self.co2_g.zip(rates.pue).map(|(g, p)| g * p);
        self
    }

    /// What the configured rates make of it, each part only where its rate is set: `0.09
    /// EUR`, `147 g CO2`, `facility 0.588 kWh (PUE 1.40)`. What a cost line adds after the energy
    /// (`ps`, the Run view, `describe`).
    pub fn rated(&self) -> Vec<String> {
        let mut parts = Vec::new();
        if let Some(c) = self.cost {
            parts.push(match &self.currency {
                Some(cur) => format!("{c:.2} {cur}"),
                None => format!("{c:.2}"),
            });
        }
        parts.extend(self.co2_g.map(co2_text));
        if let (Some(f), Some(p)) = (self.facility_kwh, self.pue) {
            parts.push(format!("facility {} (PUE {p:.2})", kwh_text(f)));
        }
        parts
    }

    /// One line for people: `1.23 kWh (4.43 MJ) · 2.1 J/sample · 0.18 EUR · 430 g CO2`.
    pub fn describe(&self) -> String {
        let mut s = format!("{} ({})", kwh_text(self.kwh), joules_text(self.energy_j));
        if let Some(j) = self.j_per_sample {
            s.push_str(&format!(" · {j:.3} J/sample"));
        }
        for part in self.rated() {
            s.push_str(" · ");
            s.push_str(&part);
        }
        s
    }
}

/// `147 g CO2`, `12.3 kg CO2`, `4.1 t CO2`.
pub fn co2_text(g: f64) -> String {
    match g {
        g if g >= 1e6 => format!("{:.1} t CO2", g / 1e6),
        g if g >= 1e3 => format!("{:.1} kg CO2", g / 1e3),
        g => format!("{g:.0} g CO2"),
    }
}

/// `0.042 kWh`, `12.3 kWh`.
pub fn kwh_text(kwh: f64) -> String {
    if kwh < 10.0 {
        format!("{kwh:.3} kWh")
    } else {
        format!("{kwh:.1} kWh")
    }
}

/// `812 J`, `4.43 MJ`.
pub fn joules_text(j: f64) -> String {
    match j {
        j if j >= 1e6 => format!("{:.2} MJ", j / 1e6),
        j if j >= 1e3 => format!("{:.1} kJ", j / 1e3),
        j => format!("{j:.0} J"),
    }
}

/// Counts training samples from a run's metrics lines (`metrics.jsonl`), fed line by line,
/// with the job's rules ([`JobTally`]): each rank counts its own (a cumulative `samples` or
/// `samples_seen`, else steps times the batch size, else `samples_per_s` integrated over the
/// time between its reports) and the job's are their sum, or the figures a report gives for
/// the whole job. A line's time is `t` (Unix seconds: the daemon stamps it on every report),
/// `time_s`, or `time` as RFC 3339.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleCounter {
    tally: JobTally,
    n: u64,
}

impl Default for SampleCounter {
    fn default() -> SampleCounter {
        SampleCounter::new()
    }
}

impl SampleCounter {
    /// A counter of a whole run, from its first line.
    pub fn new() -> SampleCounter {
        SampleCounter {
            tally: JobTally::whole_run(),
            n: 0,
        }
    }

    /// Take one metrics line (a JSON object); lines that are not are ignored.
    pub fn line(&mut self, line: &str) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            return;
        };
        if let Some(p) = self.point(v) {
            self.tally.absorb(&p);
            self.n += 1;
        }
    }

    /// A line as a report: the daemon's own form, or a line with the names above.
    fn point(&self, v: serde_json::Value) -> Option<MetricsPoint> {
        let time = ["t", "time_s"]
            .iter()
            .find_map(|k| v.get(*k).and_then(serde_json::Value::as_f64))
            .or_else(|| {
                let t = v.get("time")?.as_str()?;
                let t = crate::time::parse_rfc3339(t)?;
                Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
            });
        let seen = v.get("samples_seen").and_then(serde_json::Value::as_f64);
        let rank = v
            .get("rank")
            .and_then(serde_json::Value::as_u64)
            .and_then(|r| u32::try_from(r).ok());
        let mut report: MetricsReport = serde_json::from_value(v).unwrap_or_default();
        if report.samples.is_none() {
            report.samples = seen.filter(|n| *n >= 0.0).map(|n| n as u64);
        }
        if time.is_none() && report.samples.is_none() {
            return None;
        }
        Some(MetricsPoint {
            n: self.n,
            t: time.unwrap_or_default(),
            from: String::new(),
            rank,
            report,
        })
    }

    /// Samples so far (None when no line said anything about samples).
    pub fn samples(&self) -> Option<u64> {
        self.tally.count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusim::{Node, NodeConfig};

    /// Run a busy simulated node for `secs`, sampling every `every_s`, and meter GPU 0 with or
    /// without its counter. Returns (metered J, gpusim's own counter J over the same span).
    fn meter_sim(secs: f64, every_s: f64, with_counter: bool) -> (f64, f64) {
        let mut node = Node::new(&NodeConfig::default()).unwrap();
        node.advance_to(30.0);
        let counter = |n: &Node| n.gpu(0).unwrap().reading().energy_mj as f64 / 1000.0;
        let mut meter = GpuMeter::new();
        let start = counter(&node);
        let mut t = node.time_s();
        let t_end = t + secs;
        // Caps move during the span, so power is not constant.
        let mut k = 0;
        loop {
            let r = node.gpu(0).unwrap().reading();
            let c = with_counter.then_some(r.energy_mj as f64 / 1000.0);
            let max = node.gpu(0).unwrap().spec().power_max_w;
            meter.update(node.time_s(), c, Some(r.power_w), Some(max));
            if t >= t_end - 1e-9 {
                break;
            }
            t += every_s;
            node.advance_to(t);
            k += 1;
            if k % 20 == 0 {
                let cap = if k % 40 == 0 { 450.0 } else { 650.0 };
                node.gpu_mut(0).unwrap().set_power_limit_w(cap).unwrap();
            }
        }
        (meter.total_j(), counter(&node) - start)
    }

    #[test]
    fn the_counter_path_matches_gpusims_counter() {
        let (metered, truth) = meter_sim(600.0, 1.0, true);
        // Whole-mJ flooring only.
        assert!((metered - truth).abs() < 0.01, "{metered} vs {truth}");
    }

    #[test]
    fn integrating_power_at_1hz_is_within_1_percent_of_gpusims_counter() {
        let (metered, truth) = meter_sim(600.0, 1.0, false);
        let err = (metered - truth).abs() / truth;
        eprintln!(
            "integrated {metered:.0} J, counter {truth:.0} J, error {:.4}%",
            100.0 * err
        );
        assert!(err < 0.01, "{metered} vs {truth}: {:.3}%", 100.0 * err);
        let (metered, truth) = meter_sim(600.0, 0.5, false);
        assert!((metered - truth).abs() / truth < 0.01);
    }

    #[test]
    fn a_counter_reset_is_bridged_by_power() {
        let mut m = GpuMeter::new();
        assert_eq!(m.update(0.0, Some(1000.0), Some(100.0), Some(700.0)), 0.0);
        assert_eq!(m.update(1.0, Some(1100.0), Some(100.0), Some(700.0)), 100.0);
        // The driver reloaded: the counter restarts near zero.
        assert_eq!(m.update(2.0, Some(5.0), Some(300.0), Some(700.0)), 200.0);
        assert_eq!(m.update(3.0, Some(305.0), Some(300.0), Some(700.0)), 300.0);
        assert_eq!(m.total_j(), 600.0);
        assert_eq!(m.source(), Some(EnergySource::Counter));
        // No counter at all, and a gap too long to bridge.
        let mut m = GpuMeter::new();
        m.update(0.0, None, Some(200.0), Some(700.0));
        assert_eq!(m.update(2.0, None, Some(300.0), Some(700.0)), 500.0);
        assert_eq!(m.update(100.0, None, Some(300.0), Some(700.0)), 0.0);
        assert_eq!(m.update(100.0, None, Some(300.0), Some(700.0)), 0.0);
        assert_eq!(m.source(), Some(EnergySource::Power));
    }

    /// Observed: a counter that jumped by 1e15 mJ made a run's energy 1.0e12 J. A jump beyond
    /// what the GPU's maximum power allows, a wrap and a counter that goes back are each
    /// counted from power × time for their interval, and said once.
    #[test]
    fn a_counter_that_jumps_beyond_the_gpus_maximum_power_is_not_believed() {
        let mut m = GpuMeter::new();
        let max = Some(700.0);
        m.update(0.0, Some(1000.0), Some(300.0), max);
        assert_eq!(m.update(1.0, Some(1300.0), Some(300.0), max), 300.0);
        assert_eq!(m.take_note(), None);
        // 1e15 mJ in one second: 1e12 J against at most 700 × (1.5 + 1) = 1750 J.
        assert_eq!(m.update(2.0, Some(1300.0 + 1e12), Some(400.0), max), 350.0);
        assert_eq!(m.last_source(), Some(EnergySource::Power));
        let note = m.take_note().expect("said");
        assert!(
            note.contains("jumped by 1.000e12 J") && note.contains("1750 J"),
            "{note}"
        );
        assert_eq!(m.take_note(), None, "taken once");
        // From the jumped value on, the counter's differences are plausible again.
        assert_eq!(m.update(3.0, Some(1700.0 + 1e12), Some(400.0), max), 400.0);
        assert_eq!(m.last_source(), Some(EnergySource::Counter));
        // Wrapped to near zero: power again, and nothing said a second time.
        assert_eq!(m.update(4.0, Some(3.0), Some(200.0), max), 300.0);
        assert_eq!(m.take_note(), None);
        assert_eq!(m.total_j(), 300.0 + 350.0 + 400.0 + 300.0);
        // A difference just within the bound is believed: 1750 J in 1 s at 700 W.
        let mut m = GpuMeter::new();
        m.update(0.0, Some(0.0), Some(700.0), max);
        assert_eq!(m.update(1.0, Some(1750.0), Some(700.0), max), 1750.0);
        assert_eq!(m.update(2.0, Some(3501.0), Some(700.0), max), 700.0);
        // No maximum known (or a wild one): the rated maximum of any GPU bounds it.
        let mut m = GpuMeter::new();
        m.update(0.0, Some(0.0), Some(100.0), Some(4_294_967.0));
        assert_eq!(counter_bound_j(Some(4_294_967.0), 1.0), 7_500.0);
        assert_eq!(m.update(1.0, Some(7_000.0), Some(100.0), None), 7_000.0);
        assert_eq!(
            m.update(2.0, Some(1e15), Some(100.0), Some(f64::NAN)),
            100.0
        );
    }

    #[test]
    fn run_figures_and_words() {
        let e = RunEnergy::new(
            vec![
                GpuEnergy {
                    gpu: 0,
                    energy_j: 2.0e6,
                },
                GpuEnergy {
                    gpu: 1,
                    energy_j: 1.6e6,
                },
            ],
            Some(1_000_000),
            Some(&Price {
                per_kwh: 0.25,
                currency: "EUR".into(),
            }),
            Some(EnergySource::Counter),
        );
        assert!((e.kwh - 1.0).abs() < 1e-12);
        assert_eq!(e.j_per_sample, Some(3.6));
        assert_eq!(e.cost, Some(0.25));
        assert_eq!(
            e.describe(),
            "1.000 kWh (3.60 MJ) · 3.600 J/sample · 0.25 EUR"
        );
        let e = RunEnergy::new(vec![], Some(0), None, None);
        assert_eq!((e.j_per_sample, e.cost), (None, None));
    }

    #[test]
    fn co2_and_the_facilitys_share_through_its_pue() {
        let one_kwh = vec![GpuEnergy {
            gpu: 0,
            energy_j: J_PER_KWH,
        }];
        let node = EnergyRates {
            price: Some(Price {
                per_kwh: 0.20,
                currency: "EUR".into(),
            }),
            grid_co2_g_per_kwh: Some(400.0),
            pue: Some(1.5),
        };
        let run = EnergyRates {
            grid_co2_g_per_kwh: Some(50.0),
            ..EnergyRates::default()
        };
        let rates = run.over(&node);
        assert_eq!(rates.grid_co2_g_per_kwh, Some(50.0), "the run's wins");
        assert_eq!(rates.pue, Some(1.5), "the node's where the run has none");
        let e = RunEnergy::new(one_kwh.clone(), None, None, None).with_rates(&rates);
        assert!((e.cost.unwrap() - 0.20).abs() < 1e-12);
        assert!((e.co2_g.unwrap() - 50.0).abs() < 1e-9);
        assert!((e.facility_kwh.unwrap() - 1.5).abs() < 1e-12);
        assert!((e.facility_cost.unwrap() - 0.30).abs() < 1e-12);
        assert!((e.facility_co2_g.unwrap() - 75.0).abs() < 1e-9);
        assert_eq!(
            e.rated(),
            ["0.20 EUR", "50 g CO2", "facility 1.500 kWh (PUE 1.50)"]
        );
        assert!(
            e.describe()
                .ends_with("· 0.20 EUR · 50 g CO2 · facility 1.500 kWh (PUE 1.50)"),
            "{}",
            e.describe()
        );
        // Nothing configured: nothing invented, and no key in the JSON.
        let e = RunEnergy::new(one_kwh, None, None, None).with_rates(&EnergyRates::default());
        assert_eq!((e.cost, e.co2_g, e.facility_kwh), (None, None, None));
        assert!(e.rated().is_empty());
        let json = serde_json::to_string(&e).unwrap();
        assert!(!json.contains("co2") && !json.contains("pue"), "{json}");
        assert_eq!(co2_text(12_300.0), "12.3 kg CO2");
        assert!(check_pue(0.9).is_err() && check_pue(f64::NAN).is_err() && check_pue(6.0).is_err());
        assert_eq!(check_pue(1.0), Ok(1.0));
        assert!(check_grid_co2(-1.0).is_err() && check_grid_co2(f64::INFINITY).is_err());
        assert_eq!(check_grid_co2(0.0), Ok(0.0));
    }

    #[test]
    fn samples_from_metrics_lines() {
        let mut c = SampleCounter::default();
        assert_eq!(c.samples(), None);
        c.line(r#"{"time_s":100.0,"samples_per_s":1000.0}"#);
        c.line(r#"{"t":110.0,"samples_per_s":1000.0}"#);
        c.line("not json");
        c.line(r#"{"time":"2026-11-30T03:15:00.000Z","loss":1.0}"#);
        assert_eq!(c.samples(), Some(10_000));
        c.line(r#"{"samples":123456}"#);
        assert_eq!(c.samples(), Some(123_456));
    }

    /// A job's `metrics.jsonl` as the daemon writes it: four ranks' reports interleaved,
    /// 150 steps of 32 samples each. The count is every rank's, not one rank's.
    #[test]
    fn a_jobs_samples_are_every_ranks() {
        let mut c = SampleCounter::default();
        let mut n = 0;
        for step in 0..150u64 {
            for rank in [3u32, 1, 0, 2] {
                let p = MetricsPoint {
                    n,
                    t: 1000.0 + step as f64 * 0.05 + f64::from(rank) * 1e-3,
                    from: "trainer".into(),
                    rank: Some(rank),
                    report: MetricsReport {
                        step: Some(step),
                        batch_size: Some(32),
                        samples_per_s: Some(640.0),
                        ..MetricsReport::default()
                    },
                };
                c.line(&serde_json::to_string(&p).unwrap());
                n += 1;
            }
        }
        assert_eq!(c.samples(), Some(19_200));
    }
}
