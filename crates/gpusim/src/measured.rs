//! A measured power-limit curve of a real GPU training a real model: at each power limit, the
//! time one unit of work took (an epoch, a step: only ratios are used) and the GPU's average
//! power. A GPU given one ([`crate::Gpu::set_measured`]) draws the curve's power at its current
//! limit, not the model's, while it trains; a trainer paced by the same curve
//! (`gpupilot synthetic-train --curve`) makes the pair a replay of the measurement, the energy
//! tuner's test against curves it did not write.
//!
//! Between two measured limits both figures are linear; outside the measured range they are
//! the nearest end's.

use serde::{Deserialize, Serialize};

/// Most points a curve may hold (a curve comes from a file or a scenario: bounded).
pub const MAX_POINTS: usize = 256;

/// One measured limit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    pub limit_w: f64,
    /// Time for one unit of work at this limit, seconds (any unit of work, the same at every
    /// limit).
    pub seconds: f64,
    /// The GPU's average power at this limit, watts.
    pub power_w: f64,
}

/// A curve, limits ascending (see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredCurve {
    points: Vec<CurvePoint>,
}

impl MeasuredCurve {
    /// A curve from `(limit W, seconds, watts)` points in any order; at least two distinct
    /// limits, every figure positive and finite.
    pub fn new(points: &[[f64; 3]]) -> Result<MeasuredCurve, String> {
        if points.len() > MAX_POINTS {
            return Err(format!(
                "a measured curve holds at most {MAX_POINTS} points"
            ));
        }
        let mut p: Vec<CurvePoint> = points
            .iter()
            .map(|[limit_w, seconds, power_w]| CurvePoint {
                limit_w: *limit_w,
                seconds: *seconds,
                power_w: *power_w,
            })
            .collect();
        if let Some(bad) = p.iter().find(|c| {
            ![c.limit_w, c.seconds, c.power_w]
                .iter()
                .all(|x| x.is_finite() && *x > 0.0)
        }) {
            return Err(format!(
                "measured curve point {} W: every figure must be a positive number",
                bad.limit_w
            ));
        }
        p.sort_by(|a, b| a.limit_w.total_cmp(&b.limit_w));
        if p.windows(2).any(|w| w[0].limit_w == w[1].limit_w) {
            return Err("a measured curve names a limit twice".into());
        }
        if p.len() < 2 {
            return Err("a measured curve needs at least two limits".into());
        }
        Ok(MeasuredCurve { points: p })
    }

    /// A curve from CSV text: a `limit_w,seconds,power_w` header (after `#` comment lines),
    /// then one point a line.
    pub fn from_csv(text: &str) -> Result<MeasuredCurve, String> {
        let mut lines = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'));
        match lines.next() {
            Some("limit_w,seconds,power_w") => {}
            other => {
                return Err(format!(
                    "a measured curve's header is `limit_w,seconds,power_w`, not {other:?}"
                ));
            }
        }
        let mut points = Vec::new();
        for (n, line) in lines.enumerate() {
            if points.len() >= MAX_POINTS {
                return Err(format!(
                    "a measured curve holds at most {MAX_POINTS} points"
                ));
            }
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            let num = |i: usize| -> Result<f64, String> {
                f.get(i)
                    .ok_or(format!("row {}: three figures expected", n + 1))?
                    .parse::<f64>()
                    .map_err(|e| format!("row {}: {e}", n + 1))
            };
            if f.len() != 3 {
                return Err(format!("row {}: three figures expected: {line}", n + 1));
            }
            points.push([num(0)?, num(1)?, num(2)?]);
        }
        MeasuredCurve::new(&points)
    }

    pub fn points(&self) -> &[CurvePoint] {
        &self.points
    }

    /// The measured range of limits, watts.
    pub fn range_w(&self) -> (f64, f64) {
        (
            self.points[0].limit_w,
            self.points[self.points.len() - 1].limit_w,
        )
    }

    /// Seconds per unit of work and average watts at `limit_w`.
    pub fn at(&self, limit_w: f64) -> (f64, f64) {
        let p = &self.points;
        let i = p
            .windows(2)
            .position(|w| limit_w <= w[1].limit_w)
            .unwrap_or(p.len() - 2);
        let (a, b) = (p[i], p[i + 1]);
        let f = ((limit_w - a.limit_w) / (b.limit_w - a.limit_w)).clamp(0.0, 1.0);
        (
            a.seconds + f * (b.seconds - a.seconds),
            a.power_w + f * (b.power_w - a.power_w),
        )
    }

    /// Time per unit of work at `limit_w` over that at the highest measured limit.
    pub fn slowdown(&self, limit_w: f64) -> f64 {
        self.at(limit_w).0 / self.at(self.range_w().1).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_curve_is_linear_between_points_and_flat_outside() {
        let c = MeasuredCurve::new(&[[200.0, 10.0, 190.0], [100.0, 20.0, 99.0]]).unwrap();
        assert_eq!(c.range_w(), (100.0, 200.0));
        assert_eq!(c.at(150.0), (15.0, 144.5));
        assert_eq!(c.at(50.0), (20.0, 99.0));
        assert_eq!(c.at(300.0), (10.0, 190.0));
        assert_eq!(c.slowdown(100.0), 2.0);
    }

    #[test]
    fn bad_curves_are_refused_with_the_reason() {
        for (csv, says) in [
            ("limit,s,w\n100,1,1\n", "header"),
            ("limit_w,seconds,power_w\n100,1,1\n", "at least two"),
            ("limit_w,seconds,power_w\n100,1,1\n100,2,2\n", "twice"),
            ("limit_w,seconds,power_w\n100,1,1\n200,-2,2\n", "positive"),
            ("limit_w,seconds,power_w\n100,1\n", "three figures"),
            ("limit_w,seconds,power_w\n100,x,1\n200,1,1\n", "row 1"),
        ] {
            let e = MeasuredCurve::from_csv(csv).unwrap_err();
            assert!(e.contains(says), "{csv:?}: {e}");
        }
        let long: String = std::iter::once("limit_w,seconds,power_w\n".to_string())
            .chain((1..=300).map(|i| format!("{i},1,1\n")))
            .collect();
        assert!(
            MeasuredCurve::from_csv(&long)
                .unwrap_err()
                .contains("at most")
        );
        let ok =
            MeasuredCurve::from_csv("# a comment\nlimit_w,seconds,power_w\n100,2,90\n200,1,180\n");
        assert_eq!(ok.unwrap().points().len(), 2);
    }
}
