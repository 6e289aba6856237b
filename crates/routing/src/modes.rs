//! The load-balancing modes that do not look at the KV cache (docs/routing.md, "Modes").
//!
//! Each takes the eligible candidates (ids ascending) and their in-flight counts and returns the
//! chosen position. Ties that Dynamo's rules leave open are broken uniformly at random with the
//! router's seeded generator, so a stream of short requests on idle workers spreads evenly instead
//! of piling onto the lowest id.

use crate::rng::Rng;
use crate::select::lowest_with_ties;

/// `ids[counter mod n]`.
pub(crate) fn round_robin(n: usize, counter: &mut u64) -> usize {
    let choice = (*counter % n.max(1) as u64) as usize;
    *counter = counter.wrapping_add(1);
    choice
}

/// Uniform.
pub(crate) fn random(n: usize, rng: &mut Rng) -> usize {
    rng.below(n)
}

/// Two distinct random candidates; fewer in flight wins, a tie goes to the first drawn.
pub(crate) fn power_of_two(inflight: &[u32], rng: &mut Rng) -> usize {
    let n = inflight.len();
    if n < 2 {
        return 0;
    }
    let first = rng.below(n);
    let mut second = rng.below(n - 1);
    if second >= first {
        second += 1;
    }
    if inflight[second] < inflight[first] {
        second
    } else {
        first
    }
}

/// Minimum in flight, ties uniform.
pub(crate) fn least_loaded(inflight: &[u32], rng: &mut Rng) -> usize {
    let costs: Vec<f64> = inflight.iter().map(|&c| f64::from(c)).collect();
    if costs.is_empty() {
        return 0;
    }
    lowest_with_ties(&costs, rng)
}

/// Splits into CPU and other groups; `load(g) = inflight(g) / (count(g) · w(g))` with
/// `w(cpu) = 1` and `w(other) = ratio`; the CPU group only when its load is strictly lower;
/// then least-loaded inside the group.
pub(crate) fn device_aware(is_cpu: &[bool], inflight: &[u32], ratio: f64, rng: &mut Rng) -> usize {
    let group =
        |cpu: bool| -> Vec<usize> { (0..is_cpu.len()).filter(|&i| is_cpu[i] == cpu).collect() };
    let cpu = group(true);
    let other = group(false);
    let load = |members: &[usize], weight: f64| -> f64 {
        let total: u32 = members.iter().map(|&i| inflight[i]).sum();
        f64::from(total) / (members.len() as f64 * weight)
    };
    let chosen = if cpu.is_empty() {
        other
    } else if other.is_empty() || load(&cpu, 1.0) < load(&other, ratio) {
        cpu
    } else {
        other
    };
    let counts: Vec<u32> = chosen.iter().map(|&i| inflight[i]).collect();
    chosen[least_loaded(&counts, rng)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_cycles() {
        let mut counter = 0;
        let picks: Vec<usize> = (0..5).map(|_| round_robin(3, &mut counter)).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1]);
    }

    #[test]
    fn power_of_two_prefers_fewer_in_flight_and_draws_distinct() {
        let mut rng = Rng::new(9);
        for _ in 0..1000 {
            assert_ne!(power_of_two(&[5, 0], &mut rng), 0);
            // With one heavily loaded worker among three it is chosen only if drawn twice, which
            // distinct draws forbid.
            assert_ne!(power_of_two(&[9, 1, 1], &mut rng), 0);
        }
    }

    #[test]
    fn least_loaded_picks_minimum() {
        let mut rng = Rng::new(2);
        assert_eq!(least_loaded(&[3, 1, 2], &mut rng), 1);
    }

    #[test]
    fn device_aware_weights_accelerators() {
        let mut rng = Rng::new(4);
        let is_cpu = [true, false];
        // cpu load 1/1 = 1; gpu load 4/(1·8) = 0.5 → gpu.
        assert_eq!(device_aware(&is_cpu, &[1, 4], 8.0, &mut rng), 1);
        // gpu 9/8 > cpu 1 → cpu.
        assert_eq!(device_aware(&is_cpu, &[1, 9], 8.0, &mut rng), 0);
        // equal loads: CPU only when strictly lower.
        assert_eq!(device_aware(&is_cpu, &[0, 0], 8.0, &mut rng), 1);
        // the ratio matters: with ratio 1, 1 vs 4 → cpu.
        assert_eq!(device_aware(&is_cpu, &[1, 4], 1.0, &mut rng), 0);
        // one group only.
        assert_eq!(device_aware(&[true, true], &[3, 2], 8.0, &mut rng), 1);
    }
}
