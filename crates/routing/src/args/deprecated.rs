//! The deprecated spellings of router flags and variables, which still work with one WARN each
//! (docs/flags.md, "Router flags").

use std::ffi::OsStr;

use super::RouterArgs;
use super::values::finite_non_negative;
use crate::config::ConfigError;

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

impl RouterArgs {
    /// One WARN line per deprecated spelling in `argv` and per deprecated option in use.
    pub fn deprecation_warnings<I, S>(&self, argv: I) -> Vec<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut warnings = Vec::new();
        for arg in argv {
            let arg = arg.as_ref().to_string_lossy();
            let name = arg.split('=').next().unwrap_or_default();
            if let Some((old, new)) = DEPRECATED_ALIASES.iter().find(|(old, _)| *old == name) {
                warnings.push(format!("{old} is deprecated; use {new}"));
            }
        }
        let legacy_env = std::env::var_os(LEGACY_OVERLAP_WEIGHT_ENV).is_some();
        if self.router_kv_overlap_score_weight.is_some() || legacy_env {
            warnings.push(
                "--router-kv-overlap-score-weight is deprecated; use \
                 --router-prefill-load-scale and --router-kv-overlap-score-credit"
                    .into(),
            );
        }
        warnings
    }

    /// The deprecated overlap weight, from the flag or else `DYN_OVERLAP_SCORE_WEIGHT` in `env`.
    pub(super) fn legacy_weight(
        &self,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<Option<f64>, ConfigError> {
        if let Some(weight) = self.router_kv_overlap_score_weight {
            return Ok(Some(weight));
        }
        let Some(raw) = env(LEGACY_OVERLAP_WEIGHT_ENV).filter(|v| !v.trim().is_empty()) else {
            return Ok(None);
        };
        finite_non_negative(&raw).map(Some).map_err(|e| {
            ConfigError(format!(
                "--router-kv-overlap-score-weight ({LEGACY_OVERLAP_WEIGHT_ENV}): {e}"
            ))
        })
    }
}
