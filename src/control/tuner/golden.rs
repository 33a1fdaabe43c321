//! Which cap to measure next in a golden-section search over the grid of caps.
//!
//! A golden-section search ([`next_probe`]) narrows a bracket of grid positions by comparing
//! two measured caps inside it, keeping the better one for the next comparison (one new
//! measurement per step, the interval shrinking by about 0.62 each time). Once the bracket is
//! three positions wide, the best measured cap's grid neighbours are measured too, and the
//! search ends when both cost more: the best is then a minimum of the grid, checked rather
//! than assumed. That walk also recovers from a bracket that started in the wrong place (a
//! prior from an older result) and from a comparison that noise got wrong near the bottom.
//!
//! Measured curves are not always unimodal: a curve may have a plateau or two dips (Zeus's
//! profile of an RTX 6000 training ResNet-50 at batch 8 dips at 125 W and again at 200 W), and
//! a bracket over the whole range can close on one dip without ever measuring near the other.
//! So a search over the whole range then covers it ([`next_gap_probe`]): every run of
//! [`cover_step`] unmeasured positions between measured ones gets a probe at its middle, and
//! so does an unmeasured end of the range towards which the cost still falls (or twice as
//! long); a probe cheaper than the best moves the walk there, which descends into the new dip
//! and checks its minimum as before.
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

/// The widest gap, in grid positions, a search of the whole range leaves unmeasured is under
/// `span / COVER_INTERVALS` positions (at least two).
const COVER_INTERVALS: f64 = 4.0;

/// Runs of this many unmeasured positions or more are probed ([`next_gap_probe`]) over a range
/// of `span` positions; below 2 nothing is (the walk measures single gaps next to the best).
pub fn cover_step(span: usize) -> usize {
    (span as f64 / COVER_INTERVALS).ceil() as usize
}

/// Once the bracket and the walk are done ([`next_probe`] says `None`): the middle of the
/// longest run of unmeasured positions of the `n` that is `step` long or more between two
/// measured ones, or that lies at an end of the range where the cost still falls towards it
/// (the two measured positions nearest that end) or is `2 · step` long. `None` once the
/// measured positions cover the range that closely.
pub fn next_gap_probe(n: usize, step: usize, cost: &dyn Fn(usize) -> Option<f64>) -> Option<usize> {
    if step < 2 {
        return None;
    }
    let measured: Vec<usize> = (0..n).filter(|&i| cost(i).is_some()).collect();
    let falls = |edge: Option<&usize>, inner: Option<&usize>| match (edge, inner) {
        (Some(&a), Some(&b)) => cost(a) < cost(b),
        _ => false,
    };
    let mut best: Option<(usize, usize)> = None;
    let mut i = 0;
    while i < n {
        if cost(i).is_some() {
            i += 1;
            continue;
        }
        let start = i;
        while i < n && cost(i).is_none() {
            i += 1;
        }
        let len = i - start;
        // An end of the range: a dip can hide there only where the cost still falls towards
        // it (a curve rising towards its lowest cap, as most do, is left alone) or where the
        // run is long.
        let wanted = match (start == 0, i == n) {
            (true, _) => falls(measured.first(), measured.get(1)) || len >= 2 * step,
            (_, true) => falls(measured.last(), measured.iter().rev().nth(1)) || len >= 2 * step,
            _ => len >= step,
        };
        if wanted && best.is_none_or(|(_, l)| len > l) {
            best = Some((start, len));
        }
    }
    best.map(|(start, len)| start + (len - 1) / 2)
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

    /// Like `search` over the whole range, then covered as [`next_gap_probe`] asks.
    fn search_covered(n: usize, f: impl Fn(usize) -> f64) -> Vec<usize> {
        let measured = RefCell::new(vec![None; n]);
        let mut b = (0, n - 1);
        let mut order = Vec::new();
        loop {
            let m = measured.borrow().clone();
            let next = next_probe(&mut b, n, &|i| m[i])
                .or_else(|| next_gap_probe(n, cover_step(n - 1), &|i| m[i]));
            let Some(i) = next else {
                return order;
            };
            assert!(m[i].is_none(), "{i} measured twice");
            measured.borrow_mut()[i] = Some(f(i));
            order.push(i);
        }
    }

    #[test]
    fn covering_the_range_costs_a_bowl_at_most_one_probe_more() {
        for n in 2..=30 {
            for min in 0..n {
                let f = |i: usize| (i as f64 - min as f64).powi(2);
                let plain = search(n, (0, n - 1), f);
                let order = search_covered(n, f);
                assert_eq!(best_of(&order, f), min, "n {n} min {min}: {order:?}");
                assert!(order.len() <= plain.len() + 1, "n {n} min {min}: {order:?}");
                // No run of `cover_step` unmeasured positions is left between measured ones,
                // nor one of twice that at an end.
                let step = cover_step(n - 1).max(2);
                let (first, last) = (order.iter().min().unwrap(), order.iter().max().unwrap());
                assert!(
                    *first < 2 * step && n - 1 - last < 2 * step,
                    "n {n}: {order:?}"
                );
                let mut run = 0;
                for i in *first..=*last {
                    run = if order.contains(&i) { 0 } else { run + 1 };
                    assert!(run < step, "n {n} min {min}: {order:?}");
                }
            }
        }
    }

    #[test]
    fn a_second_dip_is_found_where_one_bracket_misses_it() {
        // A measured curve (Zeus's RTX 6000, BERT at batch 8, eta 0.5, highest cap first):
        // dips at position 2 and, 18% cheaper, at 5.
        let c = [1306.0, 1227.0, 1184.0, 1288.0, 1193.0, 1000.0, 1119.0];
        let f = |i: usize| c[i];
        let one = search(7, (0, 6), f);
        assert_eq!(best_of(&one, f), 2, "{one:?}");
        let order = search_covered(7, f);
        assert_eq!(best_of(&order, f), 5, "{order:?}");
        // The bracket closes on 3 of 9 after measuring 2..=5; the cost falls from 4 to 5,
        // towards the unmeasured end 6..=8, so that end is probed and its dip (7) found.
        let c = [7.0, 8.0, 8.0, 5.0, 9.0, 8.0, 6.0, 3.0, 7.0];
        let f = |i: usize| c[i];
        let one = search(9, (0, 8), f);
        assert_eq!(one, [3, 5, 2, 4]);
        assert_eq!(best_of(&search_covered(9, f), f), 7);
        // A bowl rising towards both ends leaves its short ends (0..=1, 6..=8) alone.
        let f = |i: usize| (i as f64 - 3.0).powi(2);
        assert_eq!(search_covered(9, f).len(), search(9, (0, 8), f).len());
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
