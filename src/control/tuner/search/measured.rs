//! The search on measured power-limit curves of real GPUs (`tests/data/zeus_power_curves.csv`,
//! from the Zeus project's NSDI '23 traces): per curve and eta, with ±2% noise on every step's
//! time and power, the chosen cap must cost within 3% of the grid's optimum and the claimed
//! saving must be within 3 points of the curve's own.

use super::*;

/// The data file: `gpu,dataset,network,batch_size,power_limit_w,time_per_epoch_s,avg_power_w`
/// after `#` comment lines.
const DATA: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/zeus_power_curves.csv"
));

/// One measured curve: (limit W, seconds per epoch, average W), limits ascending.
#[derive(Debug, Clone)]
pub(super) struct MeasuredCurve {
    pub name: String,
    pub points: Vec<(f64, f64, f64)>,
    /// The same points as gpusim's curve, which interpolates between them.
    measured: gpusim::MeasuredCurve,
}

impl MeasuredCurve {
    /// Seconds per epoch and average watts at `cap`: the measured row at a measured limit,
    /// linear between two.
    pub fn at(&self, cap: f64) -> (f64, f64) {
        self.measured.at(cap)
    }

    pub fn min_w(&self) -> f64 {
        self.points[0].0
    }

    pub fn max_w(&self) -> f64 {
        self.points[self.points.len() - 1].0
    }

    /// The highest limit on the 25 W lattice of the lowest: the search's maximum and default
    /// cap, so that every cap of its plan is a measured limit (the RTX 6000's 260 W would put
    /// the plan between them: 235, 210, …).
    pub fn top_w(&self) -> f64 {
        let min = self.min_w();
        self.points
            .iter()
            .rev()
            .map(|p| p.0)
            .find(|w| ((w - min) / 25.0).fract() == 0.0)
            .unwrap_or(min)
    }

    /// Zeus's cost of one epoch at `cap` (one epoch is a fixed number of samples, so costs per
    /// epoch rank and compare as costs per sample do).
    pub fn cost(&self, eta: f64, cap: f64) -> f64 {
        let (t, w) = self.at(cap);
        zeus_cost(eta, self.top_w(), w * t, t)
    }
}

/// Every curve in the data file, in file order.
/// One row of a curve: (limit W, seconds per epoch, average W).
type Row = (f64, f64, f64);

pub(super) fn curves() -> Vec<MeasuredCurve> {
    let mut out: Vec<(String, Vec<Row>)> = Vec::new();
    for line in DATA.lines().filter(|l| !l.starts_with('#')).skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), 7, "{line}");
        let name = format!("{} {} {} (batch {})", f[0], f[2], f[1], f[3]);
        let num = |i: usize| {
            f[i].parse::<f64>()
                .unwrap_or_else(|e| panic!("{line}: {e}"))
        };
        let point = (num(4), num(5), num(6));
        match out.last_mut() {
            Some((n, points)) if *n == name => points.push(point),
            _ => out.push((name, vec![point])),
        }
    }
    out.into_iter()
        .map(|(name, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let rows: Vec<[f64; 3]> = points.iter().map(|p| [p.0, p.1, p.2]).collect();
            let measured =
                gpusim::MeasuredCurve::new(&rows).unwrap_or_else(|e| panic!("{name}: {e}"));
            MeasuredCurve {
                name,
                points,
                measured,
            }
        })
        .collect()
}

/// A run on `curve` with every step's time and power off by up to ±`noise` (uniform, seeded).
struct NoisyRun<'a> {
    curve: &'a MeasuredCurve,
    obs: Observation,
    cap: f64,
    rng: u64,
    noise: f64,
}

/// Samples in one epoch (any fixed number: only ratios of costs are asserted) and per step.
const EPOCH: f64 = 10_000.0;
const BATCH: f64 = 16.0;

impl NoisyRun<'_> {
    fn uniform(&mut self) -> f64 {
        // xorshift64*: reproducible without a dependency.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let x = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        2.0 * (x as f64 / (1u64 << 53) as f64) - 1.0
    }

    fn step(&mut self) -> Observation {
        let (t, w) = self.curve.at(self.cap);
        let dt = t / EPOCH * BATCH * (1.0 + self.noise * self.uniform());
        let w = w * (1.0 + self.noise * self.uniform());
        self.obs.time_s += dt;
        self.obs.energy_j += w * dt;
        self.obs.samples += BATCH;
        self.obs.steps = self.obs.steps.map(|n| n + 1.0);
        self.obs
    }
}

/// What one search on a measured curve found, against the curve's truth on the grid.
#[derive(Debug)]
pub(super) struct Outcome {
    pub optimum_w: f64,
    pub chosen_w: f64,
    /// The chosen cap's true cost over the optimum's, minus one, percent.
    pub gap_pct: f64,
    pub claimed_saving_pct: f64,
    pub true_saving_pct: f64,
    pub caps: usize,
    pub planned: usize,
}

/// The default golden search on `curve` at `eta`, from the highest limit (the default cap).
pub(super) fn search(curve: &MeasuredCurve, eta: f64, noise: f64, seed: u64) -> Outcome {
    let (min, max) = (curve.min_w(), curve.top_w());
    let mut cfg = TunerConfig::new(min, max, max, max, 1);
    cfg.eta = eta;
    let mut t = Tuner::new(cfg).expect("a valid config");
    let mut run = NoisyRun {
        curve,
        obs: Observation {
            time_s: 0.0,
            steps: Some(0.0),
            energy_j: 0.0,
            samples: 0.0,
            batch: None,
            oom: false,
        },
        cap: max,
        rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        noise,
    };
    let SearchStep::SetCap(first) = t.start(&run.obs) else {
        panic!("start sets a cap")
    };
    run.cap = first;
    let result = loop {
        let obs = run.step();
        match t.observe(&obs) {
            Some(SearchStep::SetCap(w)) => run.cap = w,
            Some(SearchStep::Finish { result, .. }) => break result,
            Some(other) => panic!("{other:?}"),
            None => {}
        }
        assert!(obs.steps.unwrap_or(0.0) < 1e5, "the search never ended");
    };
    let plan = t.plan().to_vec();
    assert!(
        plan.iter().all(|w| curve.points.iter().any(|p| p.0 == *w)),
        "{plan:?}"
    );
    let optimum_w = plan
        .iter()
        .copied()
        .min_by(|a, b| curve.cost(eta, *a).total_cmp(&curve.cost(eta, *b)))
        .expect("a plan");
    let opt = curve.cost(eta, optimum_w);
    let def = curve.cost(eta, max);
    Outcome {
        optimum_w,
        chosen_w: result.best.cap_w,
        gap_pct: 100.0 * (curve.cost(eta, result.best.cap_w) / opt - 1.0),
        claimed_saving_pct: result.cost_saving_pct.expect("the default was measured"),
        true_saving_pct: 100.0 * (def - opt) / def,
        caps: result.curve.len(),
        planned: plan.len(),
    }
}

#[test]
fn the_data_file_holds_the_curves_it_names() {
    let cs = curves();
    assert_eq!(cs.len(), 8);
    let rtx = &cs[0];
    assert_eq!(rtx.name, "rtx6000 resnet50 imagenet (batch 8)");
    assert_eq!(
        (rtx.min_w(), rtx.max_w(), rtx.points.len()),
        (100.0, 260.0, 8)
    );
    // The source's row at 200 W, and a point between two limits.
    assert_eq!(rtx.at(200.0), (8810.635, 190.94669357033436));
    let (t, _) = rtx.at(210.0);
    assert!(
        (t - (8810.635 + 0.4 * (8940.22 - 8810.635))).abs() < 1e-9,
        "{t}"
    );
    // Its two dips at eta 0.5: 125 W and 200 W, each below both measured neighbours.
    let c = |w: f64| rtx.cost(0.5, w);
    assert!(c(125.0) < c(100.0) && c(125.0) < c(150.0));
    assert!(c(200.0) < c(175.0) && c(200.0) < c(225.0));
    assert!(
        cs.iter()
            .all(|c| c.points.windows(2).all(|w| w[0].0 < w[1].0))
    );
}

/// Seeds per case: each a different noise sequence.
const SEEDS: u64 = 5;

#[test]
fn the_search_on_measured_curves_is_within_3_pct_of_the_optimum() {
    let mut failures = Vec::new();
    for curve in curves() {
        for eta in [0.5, 1.0] {
            for seed in 1..=SEEDS {
                let o = search(&curve, eta, 0.02, seed);
                eprintln!(
                    "{} eta {eta}: optimum {} W, chosen {} W, gap {:.2}%, saving claimed \
                     {:.1}% / true {:.1}%, caps {} of {}",
                    curve.name,
                    o.optimum_w,
                    o.chosen_w,
                    o.gap_pct,
                    o.claimed_saving_pct,
                    o.true_saving_pct,
                    o.caps,
                    o.planned
                );
                if o.gap_pct > 3.0 || (o.claimed_saving_pct - o.true_saving_pct).abs() > 3.0 {
                    failures.push(format!("{} eta {eta} seed {seed}: {o:?}", curve.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
