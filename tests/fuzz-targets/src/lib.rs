//! Every fuzz target of `fuzz/` (the cargo-fuzz crate at the repository root) by name, so that the
//! fuzzers and the corpus replay that CI runs on the stable toolchain call one code path
//! (docs/security.md, "Fuzzing"). Each entry lives in the crate that owns the decoder, in its
//! `fuzzing` module, and panics only when a property of that decoder breaks.

use std::path::PathBuf;

/// One fuzz target: its name (the file `fuzz/fuzz_targets/<name>.rs` and the corpus folder
/// `fuzz/corpus/<name>/`) and the entry it feeds with each input.
#[derive(Debug, Clone, Copy)]
pub struct FuzzTarget {
    /// Name of the target, its source file and its corpus folder.
    pub name: &'static str,
    /// What decodes the input.
    pub run: fn(&[u8]),
}

/// Every target, one per decoder of input from outside the process.
pub const TARGETS: &[FuzzTarget] = &[
    FuzzTarget {
        name: "openai_chat",
        run: kvmesh_frontend::fuzzing::chat_completions,
    },
    FuzzTarget {
        name: "openai_completions",
        run: kvmesh_frontend::fuzzing::completions,
    },
    FuzzTarget {
        name: "openai_responses",
        run: kvmesh_frontend::fuzzing::responses,
    },
    FuzzTarget {
        name: "anthropic_messages",
        run: kvmesh_frontend::fuzzing::anthropic_messages,
    },
    FuzzTarget {
        name: "kserve_infer",
        run: kvmesh_frontend::fuzzing::kserve_infer,
    },
    FuzzTarget {
        name: "kv_event_batches",
        run: kvmesh_indexer::fuzzing::kv_event_batches,
    },
    FuzzTarget {
        name: "zmq_kv_frames",
        run: kvmesh_kv_bridge::fuzzing::zmq_message,
    },
    FuzzTarget {
        name: "discovery_records",
        run: kvmesh_runtime::fuzzing::discovery_record,
    },
    FuzzTarget {
        name: "worker_loads",
        run: kvmesh_router::fuzzing::worker_loads,
    },
    FuzzTarget {
        name: "router_sync_events",
        run: kvmesh_router::fuzzing::router_sync_events,
    },
];

/// Feeds `input` to the target called `name`; the fuzz target files are this one call.
///
/// # Panics
///
/// When no target has that name, or when the target's property breaks on `input`.
pub fn run(name: &str, input: &[u8]) {
    match TARGETS.iter().find(|target| target.name == name) {
        Some(target) => (target.run)(input),
        None => panic!("no fuzz target named {name:?}"),
    }
}

/// `fuzz/` at the repository root.
pub fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}
