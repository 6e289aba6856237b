//! Turning costs into a choice (docs/routing.md, "Selection").

use crate::rng::Rng;

/// Costs within this distance count as tied (they come from the same float formula).
const TIE_EPSILON: f64 = 1e-9;

/// Picks an index: at temperature 0 the lowest cost, ties broken uniformly at random (reservoir
/// over the tied rows); above 0 a softmax draw over normalised costs. `None` for no costs.
pub fn select_index(costs: &[f64], temperature: f64, rng: &mut Rng) -> Option<usize> {
    if costs.is_empty() {
        return None;
    }
    if temperature <= 0.0 {
        return Some(lowest_with_ties(costs, rng));
    }
    let probabilities = softmax_probabilities(costs, temperature);
    let u = rng.next_f64();
    let mut cumulative = 0.0;
    for (i, p) in probabilities.iter().enumerate() {
        cumulative += p;
        if cumulative >= u {
            return Some(i);
        }
    }
    Some(costs.len() - 1)
}

/// `p_i ∝ exp(−(c_i − c_min) / ((c_max − c_min) · T))`; uniform when all costs are equal.
pub fn softmax_probabilities(costs: &[f64], temperature: f64) -> Vec<f64> {
    let (min, max) = costs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &c| {
            (lo.min(c), hi.max(c))
        });
    let range = max - min;
    if costs.is_empty() || range <= TIE_EPSILON || temperature <= 0.0 {
        let n = costs.len().max(1) as f64;
        return vec![1.0 / n; costs.len()];
    }
    let weights: Vec<f64> = costs
        .iter()
        .map(|c| (-(c - min) / (range * temperature)).exp())
        .collect();
    let sum: f64 = weights.iter().sum();
    weights.into_iter().map(|w| w / sum).collect()
}

/// Lowest cost, uniform among ties (one pass, reservoir sampling).
pub(crate) fn lowest_with_ties(costs: &[f64], rng: &mut Rng) -> usize {
    let mut best = 0;
    let mut ties = 1usize;
    for (i, &cost) in costs.iter().enumerate().skip(1) {
        let best_cost = costs[best];
        if cost < best_cost - TIE_EPSILON {
            best = i;
            ties = 1;
        } else if (cost - best_cost).abs() <= TIE_EPSILON {
            ties += 1;
            if rng.below(ties) == 0 {
                best = i;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_probabilities() {
        let costs = [18.0, 10.0, 11.0];
        let p1 = softmax_probabilities(&costs, 1.0);
        let p05 = softmax_probabilities(&costs, 0.5);
        let round = |v: &[f64]| {
            v.iter()
                .map(|x| (x * 1000.0).round() / 1000.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(round(&p1), vec![0.163, 0.444, 0.392]);
        assert_eq!(round(&p05), vec![0.071, 0.522, 0.407]);
        let mut rng = Rng::new(3);
        assert_eq!(select_index(&costs, 0.0, &mut rng), Some(1));
    }

    #[test]
    fn temperature_draws_follow_the_probabilities() {
        let costs = [18.0, 10.0, 11.0];
        let mut rng = Rng::new(11);
        let mut counts = [0u32; 3];
        for _ in 0..100_000 {
            counts[select_index(&costs, 1.0, &mut rng).unwrap()] += 1;
        }
        let freq: Vec<f64> = counts.iter().map(|&c| f64::from(c) / 100_000.0).collect();
        for (f, p) in freq.iter().zip([0.163, 0.444, 0.392]) {
            assert!((f - p).abs() < 0.01, "{freq:?}");
        }
    }

    #[test]
    fn ties_are_uniform_and_equal_costs_uniform() {
        let mut rng = Rng::new(5);
        let mut counts = [0u32; 4];
        for _ in 0..40_000 {
            counts[select_index(&[1.0, 1.0, 2.0, 1.0], 0.0, &mut rng).unwrap()] += 1;
        }
        assert_eq!(counts[2], 0);
        for i in [0, 1, 3] {
            assert!((12_500..14_200).contains(&counts[i]), "{counts:?}");
        }
        assert_eq!(softmax_probabilities(&[4.0, 4.0], 1.0), vec![0.5, 0.5]);
        assert_eq!(select_index(&[], 0.0, &mut rng), None);
    }
}
