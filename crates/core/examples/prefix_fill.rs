//! Fills a prefix store with unique short prompts, as a server under random chat prompts does,
//! and prints every insert that held the store's lock for over a millisecond.
//!
//! `cargo run --release -p kvmesh-core --example prefix_fill -- [BOUND_MB] [PROMPTS]`
//! (defaults 256 and 3 000 000). Figures are in docs/benchmarks.md ("Long prompts").

use std::time::{Duration, Instant};

use kvmesh_core::prefix::{PrefixEntry, PrefixStore};

/// A stored short prompt: two cuts, 80 bytes of text and 20 token ids, about what the
/// tokenizer's cache holds for an eight-word chat request.
struct ShortPrompt {
    keys: Vec<u128>,
    text: String,
    ids: Vec<u32>,
}

impl PrefixEntry for ShortPrompt {
    fn keys(&self) -> &[u128] {
        &self.keys
    }

    fn value_bytes(&self) -> usize {
        self.text.capacity() + self.ids.capacity() * 4
    }
}

fn arg<T: std::str::FromStr>(index: usize, default: T) -> Result<T, String> {
    match std::env::args().nth(index) {
        Some(value) => value
            .parse()
            .map_err(|_| format!("argument {index} is not a number: {value}")),
        None => Ok(default),
    }
}

fn main() -> Result<(), String> {
    let bound_mb: usize = arg(1, 256)?;
    let prompts: u64 = arg(2, 3_000_000)?;
    let store = PrefixStore::new(bound_mb << 20);
    let mut key = 0u128;
    let mut slow = Vec::new();
    let started = Instant::now();
    for prompt in 0..prompts {
        let keys = (0..2)
            .map(|_| {
                key = key.wrapping_add(0x2545_F491_4F6C_DD1D_9E37_79B9_7F4A_7C15);
                key
            })
            .collect();
        let entry = ShortPrompt {
            keys,
            text: "x".repeat(80),
            ids: vec![1; 20],
        };
        let insert = Instant::now();
        let _ = store.longest(entry.keys());
        store.insert(entry);
        let took = insert.elapsed();
        if took > Duration::from_millis(1) {
            slow.push((prompt, took));
        }
    }
    let stats = store.stats();
    println!(
        "{prompts} prompts in {:.2} s; {} held, {} bytes; {} inserts over 1 ms",
        started.elapsed().as_secs_f64(),
        stats.entries,
        stats.bytes,
        slow.len()
    );
    for (prompt, took) in slow {
        println!("  prompt {prompt}: {:.1} ms", took.as_secs_f64() * 1e3);
    }
    Ok(())
}
