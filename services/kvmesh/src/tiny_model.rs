//! The small model directory bundled into the binary, so `kvmesh up` serves something on a fresh
//! machine without downloading anything.

use std::path::PathBuf;

use anyhow::Context;

const FILES: [(&str, &[u8]); 4] = [
    (
        "config.json",
        include_bytes!("../../../models/tiny/config.json"),
    ),
    (
        "tokenizer.json",
        include_bytes!("../../../models/tiny/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_bytes!("../../../models/tiny/tokenizer_config.json"),
    ),
    (
        "generation_config.json",
        include_bytes!("../../../models/tiny/generation_config.json"),
    ),
];

/// Writes the bundled model to a directory keyed by its content hash and returns its path.
pub fn materialize() -> anyhow::Result<PathBuf> {
    let mut digest = 0u64;
    for (name, bytes) in FILES {
        digest ^= xxhash(name.as_bytes()).rotate_left(7) ^ xxhash(bytes);
    }
    let dir = std::env::temp_dir().join(format!("kvmesh-tiny-{digest:016x}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    for (name, bytes) in FILES {
        let path = dir.join(name);
        let current = std::fs::read(&path).ok();
        if current.as_deref() != Some(bytes) {
            let temp = dir.join(format!(".{name}.{}", std::process::id()));
            std::fs::write(&temp, bytes).with_context(|| format!("write {}", temp.display()))?;
            std::fs::rename(&temp, &path).with_context(|| format!("write {}", path.display()))?;
        }
    }
    Ok(dir)
}

fn xxhash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}
