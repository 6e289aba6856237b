//! A seeded synthetic workload: shared system prompts and multi-turn sessions.
//!
//! Each session picks one of `system_prompts` system prompts and runs `turns` turns. Turn `k`'s
//! prompt is turn `k − 1`'s prompt, that turn's reply and a new user message, so a session's
//! prompts grow and each one extends the previous one; sessions on the same system prompt share
//! it. Replies are fixed content chosen by the generator (the mock engine's own output tokens
//! differ), so what a later turn can find cached is the previous turn's prompt, as with the
//! Mooncake trace's hash ids.
//!
//! Arrivals are open-loop: sessions start with uniformly distributed gaps (mean
//! `1 / session_rate`), and each turn follows the previous one's arrival after a uniformly
//! distributed think time (mean `think_time`). Only integer and basic float arithmetic is used,
//! so the same seed gives the same workload on every machine.

use clap::Args;
use kvmesh_routing::Rng;

use super::workload::{Segment, WorkItem};

/// Options of the synthetic workload (`--synthetic`).
#[derive(Debug, Clone, Args)]
pub struct SyntheticArgs {
    /// Distinct system prompts shared by the sessions.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub system_prompts: u32,
    /// Tokens of each system prompt.
    #[arg(long, default_value_t = 2048)]
    pub system_prompt_tokens: u32,
    /// Sessions (conversations).
    #[arg(long, default_value_t = 512)]
    pub sessions: u32,
    /// Turns per session.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub turns: u32,
    /// Mean tokens of a user message (uniform in [0.5, 1.5] × this, at least 1).
    #[arg(long, default_value_t = 512)]
    pub user_tokens: u32,
    /// Mean tokens of a reply (uniform in [0.5, 1.5] × this, at least 1).
    #[arg(long, default_value_t = 128)]
    pub output_tokens: u32,
    /// Sessions started per second (before `--speed`).
    #[arg(long, default_value_t = 4.0, value_parser = positive_f64)]
    pub session_rate: f64,
    /// Mean seconds between a turn's arrival and the next turn's.
    #[arg(long, default_value_t = 10.0, value_parser = non_negative_f64)]
    pub think_time: f64,
}

impl SyntheticArgs {
    /// The tool-agent shape (`--tool-agent`): agents share one of a few long tool-definition
    /// prefixes and loop through many short turns (a tool result in, a short call out) with
    /// little think time between them.
    pub fn tool_agent() -> Self {
        Self {
            system_prompts: 4,
            system_prompt_tokens: 8192,
            sessions: 256,
            turns: 8,
            user_tokens: 256,
            output_tokens: 48,
            session_rate: 2.0,
            think_time: 2.0,
        }
    }
}

/// Generates the workload, sorted by arrival (ties in generation order).
pub fn generate(args: &SyntheticArgs, seed: u64) -> Vec<WorkItem> {
    let mut rng = Rng::new(seed ^ 0x5359_4e54_4845_5449);
    let num_prompts = u64::from(args.system_prompts.max(1));
    let mut next_id = num_prompts;
    let mut fresh = |len: u32| {
        let segment = Segment { id: next_id, len };
        next_id += 1;
        segment
    };
    let session_gap_us = (1e6 / args.session_rate).round() as u64;
    let think_us = (args.think_time * 1e6).round() as u64;
    let mut items = Vec::new();
    let mut session_start = 0u64;
    for _ in 0..args.sessions {
        session_start += uniform_up_to(&mut rng, 2 * session_gap_us);
        let system = Segment {
            id: rng.below(num_prompts as usize) as u64,
            len: args.system_prompt_tokens,
        };
        let mut history = Vec::new();
        if system.len > 0 {
            history.push(system);
        }
        let mut arrival = session_start;
        for turn in 0..args.turns {
            if turn > 0 {
                arrival += uniform_up_to(&mut rng, 2 * think_us);
            }
            history.push(fresh(around(&mut rng, args.user_tokens)));
            let output_length = around(&mut rng, args.output_tokens);
            let input_length = history.iter().map(|s| s.len).sum();
            items.push(WorkItem {
                arrival_us: arrival,
                segments: history.clone(),
                input_length,
                output_length,
            });
            history.push(fresh(output_length));
        }
    }
    items.sort_by_key(|item| item.arrival_us);
    items
}

/// Uniform in `[0, max]`.
fn uniform_up_to(rng: &mut Rng, max: u64) -> u64 {
    rng.below(usize::try_from(max).unwrap_or(usize::MAX).saturating_add(1)) as u64
}

/// Uniform in `[mean / 2, mean + mean / 2]`, at least 1.
fn around(rng: &mut Rng, mean: u32) -> u32 {
    let low = mean / 2;
    (low + rng.below(mean as usize + 1) as u32).max(1)
}

/// Parses a finite number above 0 (clap value parser).
pub(super) fn positive_f64(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("must be a number > 0, got {value}")),
    }
}

fn non_negative_f64(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("must be a number >= 0, got {value}")),
    }
}
