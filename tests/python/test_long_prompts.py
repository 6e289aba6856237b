"""Long prompts through `kvmesh up` with the long-context model (scripts/make_long_context_model.py):
a 100 k-token request streaming and not, with --tokenizer fastokens; the stage histograms, the
prefix cache's and the block-hash cache's series as requests are served; the preprocessing pool's
size; and the tokenizer fallback, warned or fatal as --tokenizer-fallback says."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from conftest import ROOT, TINY_MODEL, Mesh, Proc, free_port, wait_ready, wait_until

MODEL = "tiny-128k"


def corpus(chars):
    """Real text: this repository's docs and sources, repeated to `chars` characters."""
    files = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "crates" / "llm" / "src").rglob("*.rs"))
    text = "\n".join(f.read_text() for f in files)
    return (text * (chars // len(text) + 1))[:chars]


def make_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / MODEL
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_long_context_model.py"), str(out)], check=True)
    return out


def start_up(model_dir, *extra, env=None):
    port = free_port()
    proc = Proc("up", ["kvmesh", "up", "--http-host", "127.0.0.1", "--http-port", str(port), "--num-workers", "1",
                       "--speedup-ratio", "1000000", "--model-path", str(model_dir), "--model-name", MODEL,
                       "--tcp-rpc-port", str(free_port()), *extra], env)
    return Mesh(f"http://127.0.0.1:{port}", [proc], model=MODEL)


@pytest.fixture(scope="module")
def long_mesh(tmp_path_factory):
    mesh = start_up(make_model(tmp_path_factory), "--tokenizer", "fastokens", "--router-mode", "kv",
                    env={"DYN_PREPROCESS_WORKERS": "3"})
    try:
        wait_ready(mesh.base_url, MODEL, 1, mesh.procs)
        yield mesh
    except BaseException:
        mesh.print_logs()
        raise
    finally:
        mesh.stop()


def metric(mesh, name, **labels):
    """The value of one series of /metrics, 0 when absent."""
    text = requests.get(f"{mesh.base_url}/metrics", timeout=5).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    # kvmesh's own series carry their full name; Dynamo's are under dynamo_frontend_.
    name = name if name.startswith("kvmesh_") else f"dynamo_frontend_{name}"
    pattern = re.compile(rf"^{name}(\{{{re.escape(want)}\}})?\s+(\S+)$" if want else
                         rf"^{name}\s+(\S+)$", re.M)
    match = pattern.search(text)
    return float(match.groups()[-1]) if match else 0.0


def test_a_100k_token_prompt_is_served_streaming_and_not(long_mesh):
    client = long_mesh.client(timeout=120)
    content = corpus(220_000)
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                            max_tokens=8)
    assert answer.usage.prompt_tokens >= 100_000, answer.usage
    assert answer.usage.completion_tokens == 8
    assert answer.choices[0].message.content
    assert "fastokens" not in long_mesh.procs[0].output(), "no fallback warning expected"

    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content + " again"}],
                                            max_tokens=8, stream=True, stream_options={"include_usage": True})
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert text
    assert usage.prompt_tokens >= 100_000 and usage.completion_tokens == 8


def test_stage_histograms_and_the_prefix_cache_move_as_requests_are_served(long_mesh):
    client = long_mesh.client(timeout=60)
    before = {stage: metric(long_mesh, "stage_duration_seconds_count", stage=stage)
              for stage in ("template", "tokenize", "preprocess", "hash", "route", "dispatch", "first_token")}
    hits = metric(long_mesh, "kvmesh_tokenizer_prefix_cache_hits_total")
    reused = metric(long_mesh, "kvmesh_tokenizer_prefix_cache_reused_tokens_total")
    hash_hits = metric(long_mesh, "kvmesh_router_block_hash_cache_hits_total")
    reused_blocks = metric(long_mesh, "kvmesh_router_block_hash_cache_reused_blocks_total")
    tokenize_calls = metric(long_mesh, "tokenizer_latency_ms_count", operation="tokenize")
    history = [{"role": "system", "content": corpus(60_000)}]
    for turn in range(3):
        history.append({"role": "user", "content": f"Question {turn}: what comes next?"})
        answer = client.chat.completions.create(model=MODEL, messages=history, max_tokens=4)
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
    for stage, count in before.items():
        assert metric(long_mesh, "stage_duration_seconds_count", stage=stage) >= count + 3, stage
    assert metric(long_mesh, "tokenizer_latency_ms_count", operation="tokenize") >= tokenize_calls + 3
    assert metric(long_mesh, "tokenizer_latency_ms_count", operation="detokenize") > 0
    # Turns 2 and 3 re-send the history: both reuse the earlier turn's tokens.
    assert metric(long_mesh, "kvmesh_tokenizer_prefix_cache_hits_total") >= hits + 2
    assert metric(long_mesh, "kvmesh_tokenizer_prefix_cache_reused_tokens_total") >= reused + 2 * 15_000
    assert metric(long_mesh, "kvmesh_tokenizer_prefix_cache_bytes") > 0
    # And the router hashes only their new blocks: every full 64-token block (the mock engine's
    # block size) of the reused tokens.
    assert metric(long_mesh, "kvmesh_router_block_hash_cache_hits_total") >= hash_hits + 2
    reused_tokens = metric(long_mesh, "kvmesh_tokenizer_prefix_cache_reused_tokens_total") - reused
    reused_blocks = metric(long_mesh, "kvmesh_router_block_hash_cache_reused_blocks_total") - reused_blocks
    assert reused_blocks * 64 >= reused_tokens - 2 * 64, (reused_blocks, reused_tokens)
    assert metric(long_mesh, "kvmesh_router_block_hash_cache_bytes") > 0


def test_the_preprocessing_pool_has_the_size_asked_for_and_runs_at_lower_priority(long_mesh):
    assert metric(long_mesh, "kvmesh_preprocess_workers") == 3
    tasks = Path(f"/proc/{long_mesh.procs[0].proc.pid}/task")

    def nice(task):  # field 19 of /proc/<pid>/task/<tid>/stat, after the parenthesised name
        return int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])

    threads = {task.name: ((task / "comm").read_text().strip(), nice(task)) for task in tasks.iterdir()}
    pool = [n for name, n in threads.values() if name.startswith("kvmesh-preproce")]
    io_threads = [n for name, n in threads.values() if name.startswith("tokio-rt-worker")]
    assert len(pool) == 3, threads
    # 19 levels below the I/O threads, where nice values stop.
    assert io_threads and all(n == min(max(io_threads) + 19, 19) for n in pool), threads
    # fastokens spreads a large encode over threads of its own; the pool starts them, so they
    # run at the pool's priority too (made by the first encode instead, they ran at the I/O
    # threads').
    helpers = [n for name, n in threads.values() if name.startswith("fastokens")]
    if len(os.sched_getaffinity(0)) > 1:
        assert helpers, threads
    assert all(n == pool[0] for n in helpers), threads


def unsupported_model(tmp_path_factory):
    """The long-context model with a normalizer fastokens does not have (NFKC)."""
    model = make_model(tmp_path_factory)
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    tokenizer["normalizer"] = {"type": "NFKC"}
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    return model


def test_an_unsupported_tokenizer_falls_back_with_a_warning(tmp_path_factory):
    mesh = start_up(unsupported_model(tmp_path_factory), "--tokenizer", "fastokens")
    try:
        wait_ready(mesh.base_url, MODEL, 1, mesh.procs)
        answer = mesh.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                       max_tokens=2)
        assert answer.usage.prompt_tokens > 0
        warnings = [line for line in mesh.procs[0].output().splitlines()
                    if "WARN" in line and "fastokens unavailable" in line]
        assert len(warnings) == 1, warnings
    finally:
        mesh.stop()


def test_without_fallback_an_unsupported_tokenizer_stops_the_frontend(tmp_path_factory):
    mesh = start_up(unsupported_model(tmp_path_factory), "--tokenizer", "fastokens", "--tokenizer-fallback", "false")
    proc = mesh.procs[0]
    try:
        wait_until(lambda: not proc.alive(), timeout=60, what="kvmesh up to stop")
        assert proc.proc.returncode != 0
        assert "tokenizer-fallback is off" in proc.output()
    finally:
        mesh.stop()
