//! Fuzz target `router_sync_events`: see kvmesh_fuzz_targets::TARGETS and docs/security.md, "Fuzzing".
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| kvmesh_fuzz_targets::run("router_sync_events", input));
