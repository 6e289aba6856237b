//! Flag value parsing shared by every kvmesh binary and library that defines clap flags.

use std::collections::BTreeMap;

use clap::Command;

/// Strict boolean parser for flags and their environment variables: `1 true yes on` and
/// `0 false no off`, case-insensitive; anything else is an error.
pub fn parse_bool(value: &str) -> std::result::Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        other => Err(format!(
            "expected one of 1 true yes on 0 false no off, got {other:?}"
        )),
    }
}

/// Whether a "truthy" switch value is set (`1 true yes on`, case-insensitive).
pub fn is_truthy(value: &str) -> bool {
    matches!(parse_bool(value), Ok(true))
}

/// Whether an environment switch is truthy.
pub fn env_truthy(name: &str) -> bool {
    std::env::var(name).map(|v| is_truthy(&v)).unwrap_or(false)
}

/// Resolves a negatable boolean flag pair (`--x` / `--no-x`).
pub fn negatable(value: bool, negated: bool) -> bool {
    value && !negated
}

/// Checks that no two arguments of `command` read the same environment variable.
pub fn check_unique_env(command: &Command) -> std::result::Result<(), String> {
    let mut seen = BTreeMap::new();
    for arg in command.get_arguments() {
        if let Some(name) = arg.get_env().and_then(|name| name.to_str())
            && let Some(previous) = seen.insert(name.to_string(), arg.get_id().to_string())
        {
            return Err(format!(
                "{name} is read by both --{previous} and --{}",
                arg.get_id()
            ));
        }
    }
    Ok(())
}
