//! The deprecated spellings of router flags and variables, which still work with one WARN each
//! (docs/flags.md, "Router flags").

/// Deprecated environment spelling of `--router-kv-overlap-score-weight`.
pub const LEGACY_OVERLAP_WEIGHT_ENV: &str = "DYN_OVERLAP_SCORE_WEIGHT";

/// Deprecated flag spellings and what they stand for (each works, with one WARN).
pub const DEPRECATED_ALIASES: [(&str, &str); 10] = [
    (
        "--kv-overlap-score-weight",
        "--router-kv-overlap-score-weight",
    ),
    ("--kv-events", "--router-kv-events"),
    ("--no-kv-events", "--no-router-kv-events"),
    ("--router-ttl", "--router-ttl-secs"),
    ("--track-active-blocks", "--router-track-active-blocks"),
    (
        "--no-track-active-blocks",
        "--no-router-track-active-blocks",
    ),
    ("--assume-kv-reuse", "--router-assume-kv-reuse"),
    ("--no-assume-kv-reuse", "--no-router-assume-kv-reuse"),
    ("--track-output-blocks", "--router-track-output-blocks"),
    (
        "--no-track-output-blocks",
        "--no-router-track-output-blocks",
    ),
];
