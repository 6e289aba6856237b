#!/usr/bin/env bash
# Fuzzes every target of fuzz/ (docs/security.md, "Fuzzing") for FUZZ_SECONDS each (default 30),
# starting from its committed corpus, on the stable toolchain (cargo-fuzz needs nightly flags:
# RUSTC_BOOTSTRAP=1). Installs cargo-fuzz when it is missing. Inputs found on the way go to a
# scratch folder; with --merge, the fewest of them that add edge coverage are merged into
# fuzz/corpus/<target>/.
# A crash stops the run: the input is printed (base64) with the command that reproduces it.
#
# Usage: scripts/fuzz.sh [--merge] [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-30}
merge=0
if [ "${1:-}" = "--merge" ]; then merge=1; shift; fi
if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for file in fuzz/fuzz_targets/*.rs; do targets+=("$(basename "$file" .rs)"); done
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
target_dir=${CARGO_TARGET_DIR:-$PWD/target}/fuzz
# No sanitizer: the workspace forbids unsafe code, and what the fuzzers look for is panics
# (debug assertions and overflow checks are on), hangs and runaway memory.
flags=(--sanitizer none --target-dir "$target_dir")
work=$(mktemp -d /tmp/kvmesh-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT

cargo fuzz build "${flags[@]}"
for target in "${targets[@]}"; do
  found="$work/$target"
  mkdir -p "$found" "$work/artifacts/$target"
  echo "fuzz: $target for ${seconds}s"
  if ! cargo fuzz run "${flags[@]}" "$target" "$found" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/$target/" 2>"$work/$target.log"; then
    tail -n 40 "$work/$target.log" >&2
    for artifact in "$work/artifacts/$target"/*; do
      [ -f "$artifact" ] || continue
      echo "fuzz: $target failed on $(basename "$artifact") (base64):" >&2
      base64 -w0 "$artifact" >&2; echo >&2
      echo "reproduce: save it as fuzz/corpus/$target/crash-NAME and run" \
        "cargo test -p kvmesh-fuzz-targets" >&2
    done
    exit 1
  fi
  grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$work/$target.log" \
    | sed "s/^/fuzz: $target /"
  if [ "$merge" = 1 ]; then
    # Edge coverage only, smallest covering set: the corpus stays a few hundred inputs.
    "$target_dir"/*/release/"$target" -set_cover_merge=1 -use_counters=0 -use_value_profile=0 \
      "fuzz/corpus/$target" "$found" 2>/dev/null
  fi
done
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no crash"
