//! Log probabilities the mock engine reports for its tokens: a made-up distribution over
//! [`RANKS`] candidates per position, drawn from the request's own generator, with the token the
//! engine emitted among them (first when the request is greedy), so the figures are consistent
//! with the choices and reproducible for a seeded or greedy request.

use super::sampler::{Vocab, Xoshiro256};

/// Candidates per position: the most alternatives a request may ask for (OpenAI's 20).
pub const RANKS: usize = 20;

/// The log probability of one emitted token and the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The emitted token's natural log probability (≤ 0).
    pub logprob: f32,
    /// The `top` most likely tokens and their log probabilities, most likely first; holds the
    /// emitted token when its rank is within `top`.
    pub top: Vec<(u32, f32)>,
}

/// Draws the distribution at one position and places `emitted` in it: at rank 0 for a greedy
/// request, else at a rank drawn with the distribution's own probabilities.
pub(crate) fn draw(
    rng: &mut Xoshiro256,
    vocab: &Vocab,
    emitted: u32,
    greedy: bool,
    num_top: u32,
) -> TokenLogprobs {
    let mut probs = [0f64; RANKS];
    let mut mass = 1.0;
    for prob in &mut probs {
        *prob = mass * (0.2 + 0.5 * rng.unit());
        mass -= *prob;
    }
    probs.sort_by(|a, b| b.total_cmp(a));
    let rank = if greedy {
        0
    } else {
        let total: f64 = probs.iter().sum();
        let mut pick = rng.unit() * total;
        probs
            .iter()
            .position(|&p| {
                pick -= p;
                pick < 0.0
            })
            .unwrap_or(RANKS - 1)
    };
    let num_top = (num_top as usize).min(RANKS);
    let mut top = Vec::with_capacity(num_top);
    for (index, &prob) in probs.iter().enumerate().take(num_top) {
        let id = if index == rank {
            emitted
        } else {
            distinct_draw(rng, vocab, emitted, &top)
        };
        top.push((id, prob.ln() as f32));
    }
    TokenLogprobs {
        logprob: probs[rank].ln() as f32,
        top,
    }
}

/// A token other than `emitted` and those already listed; gives up after a few tries on a
/// vocabulary too small to have enough distinct tokens.
fn distinct_draw(rng: &mut Xoshiro256, vocab: &Vocab, emitted: u32, listed: &[(u32, f32)]) -> u32 {
    let mut id = vocab.draw(rng);
    for _ in 0..16 {
        if id != emitted && listed.iter().all(|&(other, _)| other != id) {
            break;
        }
        id = vocab.draw(rng);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> Vocab {
        Vocab::new(1000, &[], Vec::new().into())
    }

    #[test]
    fn a_greedy_token_is_the_most_likely_and_the_top_list_is_sorted_and_distinct() {
        let vocab = vocab();
        let mut rng = Xoshiro256::from_seed(5);
        for _ in 0..200 {
            let lp = draw(&mut rng, &vocab, 7, true, 5);
            assert_eq!(lp.top.len(), 5);
            assert_eq!(lp.top[0], (7, lp.logprob));
            assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
            let mut ids: Vec<u32> = lp.top.iter().map(|&(id, _)| id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), 5);
            let mass: f64 = lp.top.iter().map(|&(_, l)| f64::from(l).exp()).sum();
            assert!(mass <= 1.0 + 1e-6 && lp.logprob <= 0.0);
        }
    }

    #[test]
    fn a_sampled_token_is_somewhere_in_the_distribution_and_often_not_first() {
        let vocab = vocab();
        let mut rng = Xoshiro256::from_seed(9);
        let mut not_first = 0;
        for _ in 0..200 {
            let lp = draw(&mut rng, &vocab, 7, false, RANKS as u32);
            let rank = lp.top.iter().position(|&(id, _)| id == 7).unwrap();
            assert_eq!(lp.top[rank].1, lp.logprob);
            not_first += usize::from(rank > 0);
        }
        assert!(
            (20..190).contains(&not_first),
            "{not_first} of 200 not first"
        );
    }

    #[test]
    fn asking_for_fewer_alternatives_gives_a_prefix_of_the_same_list() {
        let vocab = vocab();
        let few = draw(&mut Xoshiro256::from_seed(3), &vocab, 7, true, 2);
        let many = draw(&mut Xoshiro256::from_seed(3), &vocab, 7, true, 8);
        assert_eq!(few.logprob, many.logprob);
        assert_eq!(few.top[..], many.top[..2]);
    }
}
