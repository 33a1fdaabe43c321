//! The advisor pane's hints, for the daemon feed: while the pane is open
//! ([`Request::Advise`](crate::tui::feed::Request::Advise)), every
//! [`ADVISE_EVERY`] at most, the advisor's input is gathered from the daemon as
//! `gpupilot advise` gathers it (each GPU's history over the window, each live run's metrics
//! and knob ranges) and the hints are sent as [`Update::Advice`]: an [`Advice`], the message
//! this feed produces for the pane.

use super::{Done, Worker};
use crate::advisor::{self, AdvisorInput, Hint, Thresholds};
use crate::client::advise::gather;
use crate::tui::feed::Update;
use std::time::{Duration, Instant};

/// How often the feed computes the hints while the pane is open.
pub const ADVISE_EVERY: Duration = Duration::from_secs(5);

/// What the feed computed last.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// The daemon's time of the newest sample it looked at (seconds since the epoch).
    pub at: f64,
    /// How far back the evidence may come from, seconds.
    pub window_s: f64,
    pub hints: Vec<Hint>,
    /// Why there are no hints, for the pane (empty when there are).
    pub why_none: String,
}

impl Advice {
    /// The hints on `input`, and why there are none when there are none.
    pub fn compute(input: &AdvisorInput, th: &Thresholds) -> Advice {
        let hints = advisor::advise(input, th);
        let why_none = if hints.is_empty() {
            why_none(input, th)
        } else {
            String::new()
        };
        Advice {
            at: input.now,
            window_s: th.window_s,
            hints,
            why_none,
        }
    }

    /// No advice could be computed: `why` (the daemon has no telemetry, a request failed).
    pub fn unavailable(at: f64, why: String) -> Advice {
        Advice {
            at,
            window_s: Thresholds::default().window_s,
            hints: Vec::new(),
            why_none: why,
        }
    }
}

/// Why `input` yields no hint, in words for the pane.
pub fn why_none(input: &AdvisorInput, th: &Thresholds) -> String {
    let window = crate::tui::format::span(th.window_s);
    if input.gpus.is_empty() {
        return "the daemon reports no GPUs, so there is nothing to advise on".into();
    }
    let gpus = format!("the GPUs' last {window} show no throttling and no idle GPU drawing power");
    let from = input.now - th.window_s;
    if input.runs.is_empty() {
        return format!(
            "no live run (the data-stall, memory and throughput hints are about runs), and {gpus}"
        );
    }
    let reporting = input
        .runs
        .iter()
        .filter(|r| r.metrics.iter().any(|m| m.t >= from))
        .count();
    if reporting == 0 {
        return format!(
            "no run reports metrics (the gpupilot SDK, or lines the daemon parses: see \
             docs/profiles.md), so there is no evidence about data stalls, memory or \
             throughput; and {gpus}"
        );
    }
    format!("nothing in the last {window} of telemetry and metrics calls for a change")
}

/// Whether the pane wants hints, and when they were last computed.
#[derive(Debug, Default)]
pub(super) struct AdviseFeed {
    pub(super) on: bool,
    last: Option<Instant>,
}

impl Worker {
    /// The pane opened (compute at once) or closed (stop computing).
    pub(super) fn set_advise(&mut self, on: bool) -> Result<(), Done> {
        self.advise = AdviseFeed { on, last: None };
        self.advise_if_due()
    }

    /// Compute and send the hints if the pane is open and they are due.
    pub(super) fn advise_if_due(&mut self) -> Result<(), Done> {
        if !self.advise.on || self.advise.last.is_some_and(|t| t.elapsed() < ADVISE_EVERY) {
            return Ok(());
        }
        let Some(client) = &self.client else {
            return Ok(());
        };
        self.advise.last = Some(Instant::now());
        let th = Thresholds::default();
        let advice = match gather(client, &th) {
            Ok(input) => Advice::compute(&input, &th),
            Err(e) => Advice::unavailable(crate::telemetry::now_s(), format!("{e:#}")),
        };
        self.send(Update::Advice(Box::new(advice)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advisor::{GpuPoint, GpuSeries, RunWindow, StepPoint};

    /// A busy, cool GPU over the last minute: nothing to say about it.
    fn quiet_gpu(now: f64) -> GpuSeries {
        GpuSeries {
            index: 0,
            points: (0..60)
                .map(|i| GpuPoint {
                    t: now - 60.0 + f64::from(i),
                    util_pct: Some(99.0),
                    power_w: Some(600.0),
                    power_limit_w: Some(700.0),
                    power_default_w: Some(700.0),
                    temperature_c: Some(60.0),
                    temp_slowdown_c: Some(87.0),
                    ..GpuPoint::default()
                })
                .collect(),
            latest: None,
        }
    }

    #[test]
    fn without_hints_it_says_why() {
        let th = Thresholds::default();
        let now = 10_000.0;
        let mut input = AdvisorInput {
            now,
            ..AdvisorInput::default()
        };
        assert!(Advice::compute(&input, &th).why_none.contains("no GPUs"));
        input.gpus.push(quiet_gpu(now));
        let a = Advice::compute(&input, &th);
        assert!(a.hints.is_empty());
        assert!(a.why_none.starts_with("no live run"), "{}", a.why_none);
        assert!(a.why_none.contains("last 5m"), "{}", a.why_none);
        // A run whose only reports are older than the window.
        input.runs.push(RunWindow {
            run: "r".into(),
            metrics: vec![StepPoint {
                t: now - 900.0,
                ..StepPoint::default()
            }],
            ..RunWindow::default()
        });
        let a = Advice::compute(&input, &th);
        assert!(
            a.why_none.starts_with("no run reports metrics"),
            "{}",
            a.why_none
        );
        input.runs[0].metrics.push(StepPoint {
            t: now - 5.0,
            ..StepPoint::default()
        });
        let a = Advice::compute(&input, &th);
        assert!(
            a.why_none.starts_with("nothing in the last 5m"),
            "{}",
            a.why_none
        );
        assert_eq!(a.window_s, 300.0);
    }
}
