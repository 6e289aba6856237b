//! Runs the Mooncake-trace replay (`kvmesh_kv::replay`) once and prints its report as JSON.
//!
//! `cargo bench -p kvmesh-kv --bench replay -- --trace FILE [--workers N] [--lanes N]
//! [--blocks-per-worker N] [--expansion N] [--copies N] [--assignment round_robin|prefix]
//! [--max-requests N] [--static-queries N] [--static-query-blocks N]`; other flags are ignored.

// A benchmark that cannot set up has nothing to measure: aborting is the right response.
#![allow(clippy::expect_used)]

use std::path::PathBuf;

use kvmesh_kv::replay::{self, Assignment, ReplayConfig};

fn main() {
    let mut config = ReplayConfig::default();
    let mut trace =
        PathBuf::from("../../../shared/traces/mooncake_fast25_conversation_trace.jsonl");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        let number = || {
            value
                .parse::<usize>()
                .unwrap_or_else(|_| panic!("{} needs a number", args[i]))
        };
        match args[i].as_str() {
            "--trace" => trace = PathBuf::from(&value),
            "--workers" => config.workers = number(),
            "--lanes" => config.lanes = number(),
            "--blocks-per-worker" => config.blocks_per_worker = number(),
            "--expansion" => config.expansion = number(),
            "--copies" => config.copies = number(),
            "--max-requests" => config.max_requests = Some(number()),
            "--static-queries" => config.static_queries = number(),
            "--static-query-blocks" => config.static_query_blocks = number(),
            "--assignment" => {
                config.assignment = match value.as_str() {
                    "prefix" => Assignment::Prefix,
                    _ => Assignment::RoundRobin,
                }
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    match replay::run(&trace, &config) {
        Ok(report) => println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serialises")
        ),
        Err(error) => {
            eprintln!("replay failed: {error}");
            std::process::exit(1);
        }
    }
}
