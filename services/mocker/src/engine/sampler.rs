//! Deterministic output tokens: a self-contained PRNG (no `rand`, so results never change with a
//! dependency version) and the mapping from draws to vocabulary ids.

use std::sync::Arc;

use super::ReasoningConfig;

/// The drawable ids: the model's whole-word tokens when known, else `0..vocab_size` minus the
/// special ids.
#[derive(Debug, Clone)]
pub(crate) struct Vocab {
    vocab_size: u32,
    /// Sorted, deduplicated, all below `vocab_size`.
    special_ids: Vec<u32>,
    /// When not empty, every draw is one of these.
    words: Arc<[u32]>,
}

impl Vocab {
    pub(crate) fn new(vocab_size: u32, special_ids: &[u32], words: Arc<[u32]>) -> Self {
        let mut special_ids: Vec<u32> = special_ids
            .iter()
            .copied()
            .filter(|&id| id < vocab_size)
            .collect();
        special_ids.sort_unstable();
        special_ids.dedup();
        Self {
            vocab_size,
            special_ids,
            words,
        }
    }

    pub(crate) fn num_drawable(&self) -> u32 {
        self.vocab_size - self.special_ids.len() as u32
    }

    /// The `index`-th drawable id in ascending order (`index < num_drawable()`).
    fn nth_drawable(&self, index: u32) -> u32 {
        // The answer is `index + k` where `k` counts the special ids at or below it; iterate to
        // the fixed point (k only grows and is bounded by the number of special ids).
        let mut num_skipped = 0usize;
        loop {
            let candidate = index + num_skipped as u32;
            let now_skipped = self.special_ids.partition_point(|&id| id <= candidate);
            if now_skipped == num_skipped {
                return candidate;
            }
            num_skipped = now_skipped;
        }
    }

    /// Draws a uniform drawable id; 0 when nothing is drawable (a config `validate` rejects).
    pub(crate) fn draw(&self, rng: &mut Xoshiro256) -> u32 {
        if !self.words.is_empty() {
            return self.words[rng.below(self.words.len() as u64) as usize];
        }
        match self.num_drawable() {
            0 => 0,
            n => self.nth_drawable(rng.below(u64::from(n)) as u32),
        }
    }
}

/// SplitMix64 step: expands a seed into well-mixed words.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a over bytes: a stable, dependency-free string hash for seeding.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash = 0xCBF2_9CE4_8422_2325u64;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
    }
    hash
}

/// xoshiro256** (Blackman and Vigna), seeded through SplitMix64.
#[derive(Debug, Clone)]
pub(crate) struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    pub(crate) fn from_seed(seed: u64) -> Self {
        let mut state = seed;
        let s = [
            splitmix64(&mut state),
            splitmix64(&mut state),
            splitmix64(&mut state),
            splitmix64(&mut state),
        ];
        Self { s }
    }

    /// The generator of one request: same config seed and request id ⇒ same stream.
    pub(crate) fn for_request(seed: u64, request_id: &str) -> Self {
        let mut state = seed;
        let mixed = splitmix64(&mut state) ^ fnv1a64(request_id.as_bytes());
        Self::from_seed(mixed)
    }

    /// The generator of a greedy or seeded request: it depends on the prompt (and the request's
    /// seed), never on the request id, so the same prompt gives the same tokens however it is
    /// sent.
    pub(crate) fn for_prompt(seed: u64, prompt: &[u32], request_seed: Option<u64>) -> Self {
        let mut state = seed ^ request_seed.map_or(0, |s| s.rotate_left(32) ^ 0x5EED);
        let mut hash = 0xCBF2_9CE4_8422_2325u64;
        for &token in prompt {
            hash ^= u64::from(token);
            hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
        }
        Self::from_seed(splitmix64(&mut state) ^ hash)
    }

    /// The generator of a request's output, free text and forced (guided, tool-call) output
    /// alike: a greedy or seeded request's follows its prompt ([`Self::for_prompt`], the seed
    /// ignored when greedy), any other request's its id ([`Self::for_request`]), so sampled
    /// choices differ.
    pub(crate) fn for_output(
        seed: u64,
        prompt: &[u32],
        request_id: &str,
        is_greedy: bool,
        request_seed: Option<u64>,
    ) -> Self {
        if is_greedy || request_seed.is_some() {
            Self::for_prompt(seed, prompt, request_seed.filter(|_| !is_greedy))
        } else {
            Self::for_request(seed, request_id)
        }
    }

    /// A seed for a side generator, derived without advancing this one (so a request's tokens
    /// are the same whether or not it asked for anything drawn on the side).
    pub(crate) fn side_seed(&self) -> u64 {
        let mut state = self.clone().next_u64() ^ 0x1095_7A7E_5EED_0001;
        splitmix64(&mut state)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`, 53 bits.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` without modulo bias (Lemire's multiply-and-reject); `n > 0`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        let n = n.max(1);
        let threshold = n.wrapping_neg() % n;
        loop {
            let product = u128::from(self.next_u64()) * u128::from(n);
            if (product as u64) >= threshold {
                return (product >> 64) as u64;
            }
        }
    }
}

/// Length of the thinking section of an output of `max_tokens` tokens, markers included:
/// `floor(osl · ratio)`, raised to the markers' length when non-zero, 0 when the output cannot
/// hold both markers.
pub(crate) fn thinking_len(reasoning: Option<&ReasoningConfig>, max_tokens: u32) -> u32 {
    let Some(reasoning) = reasoning else {
        return 0;
    };
    let markers = reasoning.marker_len();
    let ratio = reasoning.thinking_ratio.clamp(0.0, 1.0);
    let len = (f64::from(max_tokens) * ratio).floor() as u32;
    match len {
        0 => 0,
        _ if max_tokens < markers => 0,
        len => len.max(markers).min(max_tokens),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xoshiro_matches_reference_vector() {
        // Reference: the C implementation seeded with s = {1, 2, 3, 4}.
        let mut rng = Xoshiro256 { s: [1, 2, 3, 4] };
        let got: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
        assert_eq!(got, vec![11520, 0, 1509978240]);
    }

    #[test]
    fn splitmix_matches_reference_vector() {
        let mut state = 1234567u64;
        assert_eq!(splitmix64(&mut state), 6457827717110365317);
        assert_eq!(splitmix64(&mut state), 3203168211198807973);
    }

    #[test]
    fn draws_skip_special_ids_and_cover_the_rest() {
        let vocab = Vocab::new(10, &[9, 0, 4, 5, 5, 77], Arc::from([]));
        assert_eq!(vocab.num_drawable(), 6);
        let drawable: Vec<u32> = (0..6).map(|i| vocab.nth_drawable(i)).collect();
        assert_eq!(drawable, vec![1, 2, 3, 6, 7, 8]);
        let mut rng = Xoshiro256::from_seed(7);
        let mut seen = [0u32; 10];
        for _ in 0..6000 {
            seen[vocab.draw(&mut rng) as usize] += 1;
        }
        for id in [0, 4, 5, 9] {
            assert_eq!(seen[id], 0, "special id {id} drawn");
        }
        for id in [1, 2, 3, 6, 7, 8] {
            assert!(
                (800..1200).contains(&seen[id]),
                "id {id} drawn {} times",
                seen[id]
            );
        }
    }

    #[test]
    fn request_streams_depend_on_seed_and_id() {
        let draw = |seed, id: &str| {
            let mut rng = Xoshiro256::for_request(seed, id);
            (0..4).map(|_| rng.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw(0, "a"), draw(0, "a"));
        assert_ne!(draw(0, "a"), draw(0, "b"));
        assert_ne!(draw(0, "a"), draw(1, "a"));
    }

    #[test]
    fn prompt_streams_ignore_the_request_id_and_follow_prompt_and_seed() {
        let draw = |prompt: &[u32], seed| {
            let mut rng = Xoshiro256::for_prompt(0, prompt, seed);
            (0..4).map(|_| rng.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw(&[1, 2, 3], None), draw(&[1, 2, 3], None));
        assert_ne!(draw(&[1, 2, 3], None), draw(&[1, 2, 4], None));
        assert_ne!(draw(&[1, 2, 3], None), draw(&[1, 2, 3], Some(0)));
        assert_ne!(draw(&[1, 2, 3], Some(1)), draw(&[1, 2, 3], Some(2)));
    }

    #[test]
    fn output_streams_follow_the_prompt_when_greedy_or_seeded_else_the_request() {
        let draw = |id: &str, is_greedy, seed| {
            let mut rng = Xoshiro256::for_output(0, &[1, 2, 3], id, is_greedy, seed);
            (0..4).map(|_| rng.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw("a", true, None), draw("b", true, None));
        assert_eq!(draw("a", true, Some(5)), draw("b", true, None));
        assert_eq!(draw("a", false, Some(5)), draw("b", false, Some(5)));
        assert_ne!(draw("a", false, Some(5)), draw("a", false, Some(6)));
        assert_ne!(draw("a", false, None), draw("b", false, None));
        assert_eq!(draw("a", false, None), draw("a", false, None));
    }

    #[test]
    fn with_words_every_draw_is_a_word() {
        let vocab = Vocab::new(100, &[], Arc::from([10, 20, 30]));
        let mut rng = Xoshiro256::from_seed(1);
        let mut seen = [0u32; 3];
        for _ in 0..300 {
            let id = vocab.draw(&mut rng);
            seen[(id / 10 - 1) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
    }

    #[test]
    fn below_is_in_range() {
        let mut rng = Xoshiro256::from_seed(3);
        for n in [1u64, 2, 3, 7, 1000, u64::MAX] {
            for _ in 0..100 {
                assert!(rng.below(n) < n);
            }
        }
    }

    #[test]
    fn thinking_length_rules() {
        let reasoning = ReasoningConfig::single(1, 2, 0.25);
        assert_eq!(thinking_len(None, 100), 0);
        assert_eq!(thinking_len(Some(&reasoning), 100), 25);
        assert_eq!(thinking_len(Some(&reasoning), 5), 2);
        assert_eq!(thinking_len(Some(&reasoning), 3), 0);
        let all = ReasoningConfig {
            thinking_ratio: 1.0,
            ..reasoning.clone()
        };
        assert_eq!(thinking_len(Some(&all), 1), 0);
        assert_eq!(thinking_len(Some(&all), 4), 4);
    }
}
