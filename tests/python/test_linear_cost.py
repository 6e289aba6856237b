"""The request path's cost is linear in the prompt: callgrind counts the instructions of one chat
request through `kvmesh bench request-path` (parse, template, tokenize, worker request, mock
engine, KV events, index apply; nothing else is counted) at a prompt and at one twice as long,
with each tokenizer engine. Twice the prompt must cost at most 2.2 times the instructions."""
import re
import shutil
import subprocess

import pytest

from conftest import BIN_DIR, TINY_MODEL

# Below 64 KiB, where fastokens would hand parts of one encode to its own threads (which the
# toggle, following this thread's stack, would not count).
CHARS = 24_000


def instructions(chars, engine):
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         "--toggle-collect=kvmesh::bench_request_path::request_path",
         str(BIN_DIR / "kvmesh"), "bench", "request-path", "--model-path", str(TINY_MODEL),
         "--prompt-chars", str(chars), "--tokenizer", engine],
        capture_output=True, text=True, timeout=600, check=True)
    collected = re.search(r"Collected : (\d+)", out.stderr)
    assert collected, out.stderr[-2000:]
    return int(collected.group(1))


@pytest.mark.parametrize("engine", ["default", "fastokens"])
def test_twice_the_prompt_costs_at_most_2_2_times_the_instructions(engine):
    assert shutil.which("valgrind"), "valgrind must be installed (CI installs it)"
    short, long = instructions(CHARS, engine), instructions(2 * CHARS, engine)
    assert short > 1_000_000, "the toggle counted nothing: is request_path still a symbol?"
    assert long <= 2.2 * short, f"{engine}: {long} instructions at {2 * CHARS} chars vs {short} at {CHARS}"
