//! What tokenizing and block-hashing an agent conversation's turn costs through the prefix
//! caches, against doing both for the whole prompt, in one process with nothing else running
//! (the server's figure adds its other work's effect on the CPU caches).
//!
//! `cargo run --release -p kvmesh-llm --example prefix_turn_cost -- MODEL_DIR CORPUS`: a
//! conversation of 1 500-character user turns and 400-character replies taken from CORPUS (the
//! long-prompt bench's text) grows to 200 000 characters, three times over. Every prompt is
//! rendered with the model's chat template, then tokenized and hashed into 64-token blocks
//! through the caches first (so the new text's words are as new to the tokenizer as in a server
//! that only ever sees each turn once) and then whole (checked equal). Costs are process CPU
//! time, so the tokenizer's own fan-out threads for large inputs count, and wall time. Printed
//! for every turn and for the later turns (history past half of the limit), which the
//! long-prompt work's "≤ 5 %" target is about.

use std::time::{Duration, Instant};

use kvmesh_kv::BlockHashCache;
use kvmesh_llm::openai::ChatCompletionRequest;
use kvmesh_llm::{ModelDir, PrefixCache, TokenizerEngine};
use rustix::time::{ClockId, clock_gettime};

kvmesh_runtime::global_allocator!();

const HISTORY_CHARS: usize = 200_000;
const BLOCK_SIZE: u32 = 64;

/// CPU and wall time of one way of tokenizing and hashing, summed over turns.
#[derive(Default, Clone, Copy)]
struct Cost {
    cpu: Duration,
    wall: Duration,
}

impl Cost {
    fn add(&mut self, other: Cost) {
        self.cpu += other.cpu;
        self.wall += other.wall;
    }
}

/// Sums per band of turns: every turn, and the later ones.
#[derive(Default)]
struct Band {
    turns: u32,
    cached: Cost,
    whole: Cost,
}

impl Band {
    fn print(&self, name: &str) {
        let ms = |total: Duration| total.as_secs_f64() * 1e3 / f64::from(self.turns.max(1));
        let pct = |part: Duration, of: Duration| 100.0 * part.as_secs_f64() / of.as_secs_f64();
        println!(
            "{name} ({} turns): CPU cached {:.4} ms, whole {:.4} ms ({:.1} %); wall cached {:.4} ms, whole {:.4} ms ({:.1} %)",
            self.turns,
            ms(self.cached.cpu),
            ms(self.whole.cpu),
            pct(self.cached.cpu, self.whole.cpu),
            ms(self.cached.wall),
            ms(self.whole.wall),
            pct(self.cached.wall, self.whole.wall),
        );
    }
}

fn process_cpu() -> Duration {
    let now = clock_gettime(ClockId::ProcessCPUTime);
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Runs `work`, returning its result and what it cost.
fn timed<T>(work: impl FnOnce() -> T) -> (T, Cost) {
    let (cpu, wall) = (process_cpu(), Instant::now());
    let value = work();
    let cost = Cost {
        cpu: process_cpu().saturating_sub(cpu),
        wall: wall.elapsed(),
    };
    (value, cost)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(model_dir), Some(corpus)) = (args.next(), args.next()) else {
        return Err("usage: prefix_turn_cost MODEL_DIR CORPUS".into());
    };
    let model = ModelDir::load_with(&model_dir, TokenizerEngine::Fastokens)?;
    let corpus = std::fs::read_to_string(corpus)?.replace("\\n", "\n");
    let mut chars = corpus.chars().cycle();
    let mut slice = |n: usize| -> String { chars.by_ref().take(n).collect() };
    let template = model.require_chat_template()?;
    let tokenizer = model.tokenizer();
    let cache = PrefixCache::new(256 << 20);
    let hashes = BlockHashCache::new(256 << 20);
    let uncached_hashes = BlockHashCache::new(0);
    let (mut all, mut later) = (Band::default(), Band::default());
    for _ in 0..3 {
        let mut messages = vec![serde_json::json!({"role": "system", "content": slice(2000)})];
        let mut length = 2000;
        while length < HISTORY_CHARS {
            messages.push(serde_json::json!({"role": "user", "content": slice(1500)}));
            let request: ChatCompletionRequest =
                serde_json::from_value(serde_json::json!({"model": "tiny", "messages": messages}))?;
            let text = template.render_request(&request)?;
            let copy = text.clone();
            let (got, cached) = timed(|| -> Result<_, kvmesh_llm::LlmError> {
                let encoded = cache.encode_with_cuts(tokenizer, copy)?;
                let blocks = hashes.hash(&encoded.ids, &encoded.cuts, BLOCK_SIZE, 0);
                Ok((encoded.ids, blocks))
            });
            let (expected, whole) = timed(|| -> Result<_, kvmesh_llm::LlmError> {
                let ids = tokenizer.encode(&text, false)?;
                let blocks = uncached_hashes.hash(&ids, &[], BLOCK_SIZE, 0);
                Ok((ids, blocks))
            });
            if got? != expected? {
                return Err("the caches' ids or hashes differ from the whole prompt's".into());
            }
            for band in [&mut all]
                .into_iter()
                .chain((length >= HISTORY_CHARS / 2).then_some(&mut later))
            {
                band.turns += 1;
                band.cached.add(cached);
                band.whole.add(whole);
            }
            messages.push(serde_json::json!({"role": "assistant", "content": slice(400)}));
            length += 1900;
        }
    }
    all.print("every turn");
    later.print("later turns (history past 100 000 chars)");
    println!("{:?}", cache.stats());
    Ok(())
}
