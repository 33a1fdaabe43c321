//! The session's window accounting against a known truth: a fake daemon whose GPU power steps
//! the moment a cap is set, whose throughput follows the power, whose energy counter is the
//! exact integral of that power, and whose snapshots come once a second, as the daemon's do at
//! its default rate. Every measured point must match the curve it was made from.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::AtomicBool;

use super::*;
use crate::control::tuner::live::{Outcome, drive};
use crate::training::MetricsReport;

/// Samples a step.
const BATCH: f64 = 32.0;
/// Between two reports of the trainer, seconds.
const REPORT_EVERY: f64 = 0.25;
/// What one request to the daemon takes, seconds.
const REQUEST_S: f64 = 0.001;

/// The GPU draws 600 W when nothing holds it, and what the cap allows below that.
fn power_w(cap: f64) -> f64 {
    cap.min(600.0)
}

/// Samples a second: the square root of the power, 400 at 600 W.
fn samples_per_s(cap: f64) -> f64 {
    400.0 * (power_w(cap) / 600.0).sqrt()
}

/// The truth at `cap`: energy and time per sample.
fn truth(cap: f64) -> (f64, f64) {
    (power_w(cap) / samples_per_s(cap), 1.0 / samples_per_s(cap))
}

/// The node and its run, on a clock the test moves.
struct Node {
    now: Cell<f64>,
    cap: Cell<f64>,
    energy_j: Cell<f64>,
    samples: Cell<f64>,
    next_report: Cell<f64>,
    next_snapshot: Cell<f64>,
    reports: RefCell<Vec<MetricsPoint>>,
    snapshot: RefCell<Option<Snapshot>>,
}

impl Node {
    fn new() -> Rc<Node> {
        Rc::new(Node {
            now: Cell::new(1000.0),
            cap: Cell::new(700.0),
            energy_j: Cell::new(5.0e6),
            samples: Cell::new(0.0),
            next_report: Cell::new(1000.0),
            // Snapshots half-way between the polls, as a sampler started apart from them is.
            next_snapshot: Cell::new(1000.5),
            reports: RefCell::new(Vec::new()),
            snapshot: RefCell::new(None),
        })
    }

    fn gpu(&self) -> GpuSample {
        GpuSample {
            index: 0,
            time_s: self.now.get(),
            energy_j: Some(self.energy_j.get()),
            ..Default::default()
        }
    }

    /// Run on to `now + dt`: the power and the throughput of the cap set, reports and
    /// snapshots at their times.
    fn advance(&self, dt: f64) {
        let until = self.now.get() + dt;
        loop {
            let next = self
                .next_report
                .get()
                .min(self.next_snapshot.get())
                .min(until);
            let span = next - self.now.get();
            let cap = self.cap.get();
            self.energy_j.set(self.energy_j.get() + power_w(cap) * span);
            self.samples
                .set(self.samples.get() + samples_per_s(cap) * span);
            self.now.set(next);
            if next == self.next_report.get() {
                let mut reports = self.reports.borrow_mut();
                let samples = self.samples.get();
                let n = reports.len() as u64;
                reports.push(MetricsPoint {
                    n,
                    t: next,
                    from: "trainer".into(),
                    rank: None,
                    report: MetricsReport {
                        step: Some((samples / BATCH) as u64),
                        samples: Some(samples as u64),
                        batch_size: Some(BATCH as i64),
                        ..Default::default()
                    },
                });
                self.next_report.set(next + REPORT_EVERY);
            }
            if next == self.next_snapshot.get() {
                *self.snapshot.borrow_mut() = Some(Snapshot {
                    time_s: next,
                    gpus: vec![self.gpu()],
                    ..Default::default()
                });
                self.next_snapshot.set(next + 1.0);
            }
            if next >= until {
                return;
            }
        }
    }
}

/// The daemon over [`Node`]: reads on demand (`on_demand`), or only its 1 Hz snapshots.
struct Daemon {
    node: Rc<Node>,
    on_demand: bool,
}

impl TunerDaemon for Daemon {
    fn run(&self, spec: &str) -> anyhow::Result<RunSeen> {
        Ok(RunSeen {
            id: spec.into(),
            name: "p".into(),
            dir: std::path::PathBuf::new(),
            gpus: "all".into(),
            running: true,
            restarting: false,
            attempt: 0,
        })
    }
    fn snapshot(&self) -> anyhow::Result<Option<Snapshot>> {
        self.node.advance(REQUEST_S);
        Ok(self.node.snapshot.borrow().clone())
    }
    fn read_gpus(&self, _: &[u32]) -> anyhow::Result<Option<Vec<GpuSample>>> {
        if !self.on_demand {
            return Ok(self.snapshot()?.map(|s| s.gpus));
        }
        self.node.advance(REQUEST_S);
        Ok(Some(vec![self.node.gpu()]))
    }
    fn reports(&self, _: &str, since: u64) -> anyhow::Result<Reports> {
        self.node.advance(REQUEST_S);
        let all = self.node.reports.borrow();
        Ok(Reports {
            points: all.iter().filter(|p| p.n >= since).cloned().collect(),
            next: all.len() as u64,
            trainer: TrainerInfo::default(),
        })
    }
    fn power_limits(&self) -> anyhow::Result<Vec<(u32, Option<PowerLimits>)>> {
        let l = PowerLimits {
            current_w: self.node.cap.get(),
            enforced_w: None,
            default_w: 700.0,
            min_w: 200.0,
            max_w: 700.0,
        };
        Ok(vec![(0, Some(l))])
    }
    fn set_cap(&self, _: Vec<u32>, watts: f64, _: &str) -> anyhow::Result<()> {
        // The power steps once the request lands.
        self.node.advance(REQUEST_S);
        self.node.cap.set(watts);
        Ok(())
    }
    fn loops(&self) -> anyhow::Result<ControlStatus> {
        Ok(ControlStatus::default())
    }
    fn set_batch(&self, _: &str, _: u32, _: &str) -> anyhow::Result<bool> {
        Ok(true)
    }
}

/// The default search on the node, polled once a second: its result.
fn searched(on_demand: bool) -> TuneResult {
    let node = Node::new();
    node.advance(0.9);
    let daemon = Daemon {
        node: Rc::clone(&node),
        on_demand,
    };
    // Energy alone: the energy per sample falls with the power, so the best cap binds.
    let settings = TuneSettings {
        eta: 1.0,
        ..TuneSettings::default()
    };
    let (mut run, mut tuner) = prepare(daemon, "r1", &settings).unwrap();
    let stop = AtomicBool::new(false);
    let out = drive(&mut tuner, &mut run, &stop, || node.advance(1.0), |_| {}).unwrap();
    let Outcome::Done(result) = out else {
        panic!("{out:?}")
    };
    *result
}

/// Every point within 1% of the truth at its cap, and the saving within half a point.
fn assert_true_to_the_curve(r: &TuneResult) {
    assert!(r.curve.len() >= 3, "{r:?}");
    for p in &r.curve {
        let (e, t) = truth(p.cap_w);
        let off_e = p.energy_per_sample_j / e - 1.0;
        let off_t = p.time_per_sample_s / t - 1.0;
        assert!(
            off_e.abs() < 0.01 && off_t.abs() < 0.01,
            "{:.0} W: {:.4} J/sample ({:+.1}%), {:.6} s/sample ({:+.1}%) against the truth \
             {e:.4} J, {t:.6} s",
            p.cap_w,
            p.energy_per_sample_j,
            100.0 * off_e,
            p.time_per_sample_s,
            100.0 * off_t
        );
        assert!(p.seconds >= 2.0, "a window of {} s", p.seconds);
    }
    let default = r.default.expect("the default cap is measured");
    assert_eq!(default.cap_w, 700.0);
    let (e_default, _) = truth(700.0);
    let (e_best, _) = truth(r.best.cap_w);
    let saving = 100.0 * (e_default - e_best) / e_default;
    let claimed = r.energy_saving_pct.unwrap();
    assert!(
        (claimed - saving).abs() < 0.5,
        "claimed {claimed:.1}% at {:.0} W, the curve gives {saving:.1}%",
        r.best.cap_w
    );
    assert!(r.best.cap_w < 600.0, "a cap that binds is found: {r:?}");
}

#[test]
fn windows_read_at_their_edges_match_the_curve_at_every_cap() {
    assert_true_to_the_curve(&searched(true));
}

#[test]
fn windows_match_the_curve_from_snapshots_once_a_second_too() {
    // A daemon that cannot read on demand: each edge lies between two snapshots a second
    // apart, and one that holds a cap change is never an edge.
    assert_true_to_the_curve(&searched(false));
}
