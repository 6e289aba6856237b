//! What the prefix cache costs per turn of an agent conversation, against encoding each
//! prompt whole, in one process with nothing else running (the server's figure adds its
//! other work's effect on the CPU caches).
//!
//! `cargo run --release -p kvmesh-llm --example prefix_turn_cost -- MODEL_DIR CORPUS`: a
//! conversation of 1 500-character user turns and 400-character replies taken from CORPUS (the
//! long-prompt bench's text) grows to 200 000 characters, three times over; every prompt is
//! rendered with the model's chat template, encoded whole and through the cache (checked
//! equal), and the mean time per turn of each is printed.

use std::time::{Duration, Instant};

use kvmesh_llm::openai::ChatCompletionRequest;
use kvmesh_llm::{ModelDir, PrefixCache, TokenizerEngine};

const HISTORY_CHARS: usize = 200_000;

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
    let (mut whole, mut cached, mut turns) = (Duration::ZERO, Duration::ZERO, 0u32);
    for _ in 0..3 {
        let mut messages = vec![serde_json::json!({"role": "system", "content": slice(2000)})];
        let mut length = 2000;
        while length < HISTORY_CHARS {
            messages.push(serde_json::json!({"role": "user", "content": slice(1500)}));
            let request: ChatCompletionRequest =
                serde_json::from_value(serde_json::json!({"model": "tiny", "messages": messages}))?;
            let text = template.render_request(&request)?;
            let started = Instant::now();
            let expected = tokenizer.encode(&text, false)?;
            whole += started.elapsed();
            let started = Instant::now();
            let got = cache.encode_with_cuts(tokenizer, text)?;
            cached += started.elapsed();
            if got.ids != expected {
                return Err("the cache's ids differ from the whole prompt's".into());
            }
            messages.push(serde_json::json!({"role": "assistant", "content": slice(400)}));
            length += 1900;
            turns += 1;
        }
    }
    let per_turn = |total: Duration| total.as_secs_f64() * 1e3 / f64::from(turns);
    println!(
        "turns {turns}: cached {:.4} ms, whole {:.4} ms per turn ({:.1} %); {:?}",
        per_turn(cached),
        per_turn(whole),
        100.0 * cached.as_secs_f64() / whole.as_secs_f64(),
        cache.stats()
    );
    Ok(())
}
