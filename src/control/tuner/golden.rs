//! Which cap to measure next in a golden-section search over the grid of caps.
//!
//! The cost per sample over caps is unimodal in practice (static power punishes low clocks,
//! the V² term high ones), so a golden-section search narrows a bracket of grid positions by
//! comparing two measured caps inside it, keeping the better one for the next comparison (one
//! new measurement per step, the interval shrinking by about 0.62 each time). Once the bracket
//! is three positions wide, the best measured cap's grid neighbours are measured too, and the
//! search ends when both cost more: the best is then a minimum of the grid, checked rather than
//! assumed. That walk also recovers from a bracket that started in the wrong place (a prior
//! from an older result) and from a comparison that noise got wrong near the bottom.
//!
//! Pure: positions are indices into the plan, `cost` says what each measured position cost.

/// 1/φ, the golden ratio's inverse.
const INV_PHI: f64 = 0.618_033_988_749_895;

/// The next position to measure, narrowing `bracket` (inclusive positions) as measurements
/// allow; `None` when the best measured position of the `n` has both its neighbours measured.
pub fn next_probe(
    bracket: &mut (usize, usize),
    n: usize,
    cost: &dyn Fn(usize) -> Option<f64>,
) -> Option<usize> {
    loop {
        let (lo, hi) = *bracket;
        if hi <= lo + 2 {
            break;
        }
        let inside = (lo + 1..hi)
            .filter_map(|i| cost(i).map(|c| (i, c)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i);
        let (x, y) = match inside {
            None => {
                let span = hi - lo;
                let mut d = (span as f64 * INV_PHI).round() as usize;
                if 2 * d <= span {
                    d = span / 2 + 1;
                }
                (hi - d, lo + d)
            }
            Some(e) => {
                // The mirror image of the kept point, so the bracket keeps its proportions.
                // At the middle the mirror is the point itself: take the neighbour on the
                // side where a parabola through the three best points puts the minimum.
                let mut m = lo + hi - e;
                if m == e {
                    let up = vertex(n, cost).map_or(e - lo <= 1, |v| v > e as f64);
                    m = if up { e + 1 } else { e - 1 };
                }
                (e.min(m), e.max(m))
            }
        };
        let (Some(cx), Some(cy)) = (cost(x), cost(y)) else {
            return Some(if cost(x).is_none() { x } else { y });
        };
        if cx <= cy {
            bracket.1 = y;
        } else {
            bracket.0 = x;
        }
    }
    let best = (0..n)
        .filter_map(|i| cost(i).map(|c| (i, c)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i);
    let Some(best) = best else {
        return Some((bracket.0 + bracket.1) / 2);
    };
    [best.checked_sub(1), Some(best + 1)]
        .into_iter()
        .flatten()
        .find(|&i| i < n && cost(i).is_none())
}

/// The vertex of the parabola through the three cheapest measured positions, where it opens
/// upwards.
fn vertex(n: usize, cost: &dyn Fn(usize) -> Option<f64>) -> Option<f64> {
    let mut pts: Vec<(f64, f64)> = (0..n)
        .filter_map(|i| cost(i).map(|c| (i as f64, c)))
        .collect();
    pts.sort_by(|a, b| a.1.total_cmp(&b.1));
    let [(x1, y1), (x2, y2), (x3, y3)] = pts.get(..3)? else {
        return None;
    };
    let denom = (x1 - x2) * (x1 - x3) * (x2 - x3);
    let a = (x3 * (y2 - y1) + x2 * (y1 - y3) + x1 * (y3 - y2)) / denom;
    let b = (x3 * x3 * (y1 - y2) + x2 * x2 * (y3 - y1) + x1 * x1 * (y2 - y3)) / denom;
    let v = -b / (2.0 * a);
    (a > 0.0 && v.is_finite()).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Run the search on `f` over `n` positions from `bracket`; the positions measured.
    fn search(n: usize, bracket: (usize, usize), f: impl Fn(usize) -> f64) -> Vec<usize> {
        let measured = RefCell::new(vec![None; n]);
        let mut b = bracket;
        let mut order = Vec::new();
        loop {
            let m = measured.borrow().clone();
            let Some(i) = next_probe(&mut b, n, &|i| m[i]) else {
                return order;
            };
            assert!(measured.borrow()[i].is_none(), "{i} measured twice");
            measured.borrow_mut()[i] = Some(f(i));
            order.push(i);
        }
    }

    fn best_of(order: &[usize], f: impl Fn(usize) -> f64) -> usize {
        *order
            .iter()
            .min_by(|a, b| f(**a).total_cmp(&f(**b)))
            .unwrap()
    }

    #[test]
    fn finds_the_minimum_of_every_bowl_in_few_probes() {
        for n in 1..=30 {
            for min in 0..n {
                let f = |i: usize| (i as f64 - min as f64).powi(2);
                let order = search(n, (0, n - 1), f);
                assert_eq!(best_of(&order, f), min, "n {n} min {min}: {order:?}");
                // log_φ(n) + a few, never the whole grid once it is large.
                if n >= 13 {
                    assert!(order.len() <= 10, "n {n} min {min}: {order:?}");
                }
            }
        }
    }

    #[test]
    fn a_bracket_in_the_wrong_place_walks_to_the_minimum() {
        let f = |i: usize| (i as f64 - 17.0).abs();
        let order = search(21, (2, 8), f);
        assert_eq!(best_of(&order, f), 17, "{order:?}");
    }

    #[test]
    fn measurements_already_made_are_reused() {
        // Seven caps, the first measured already (the default): five more at most.
        let f = |i: usize| (i as f64 - 2.0).powi(2);
        let measured = RefCell::new(vec![None; 7]);
        measured.borrow_mut()[0] = Some(f(0));
        let mut b = (0, 6);
        let mut probes = 0;
        loop {
            let m = measured.borrow().clone();
            let Some(i) = next_probe(&mut b, 7, &|i| m[i]) else {
                break;
            };
            assert_ne!(i, 0);
            measured.borrow_mut()[i] = Some(f(i));
            probes += 1;
        }
        assert!(probes <= 4, "{probes}");
    }
}
