"""KV-aware routing through `kvmesh up --router-mode kv`: the in-process indexer shard answers the
frontend's overlap queries over loopback gRPC, so requests sharing a prefix follow its cache."""
import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import Mesh, Proc, free_port, wait_ready

BLOCK = 64  # the mocker's default block size, which the card advertises


@pytest.fixture(scope="module")
def kv_mesh():
    port = free_port()
    rpc_port = free_port()
    proc = Proc("up-kv", ["kvmesh", "up", "--router-mode", "kv", "--http-host", "127.0.0.1",
                          "--http-port", str(port), "--num-workers", "2", "--speedup-ratio", "100",
                          "--tcp-rpc-port", str(rpc_port)])
    base = f"http://127.0.0.1:{port}"
    mesh = Mesh(base, [proc])
    try:
        wait_ready(base, "tiny", 2, [proc])
        yield mesh
    finally:
        mesh.stop()


def complete(mesh, prompt, max_tokens=4):
    r = requests.post(f"{mesh.base_url}/v1/completions", json={
        "model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
        "nvext": {"extra_fields": ["worker_id"]}}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["nvext"]["worker_id"]["decode_worker_id"]


def test_shared_prefix_follows_the_cache_and_unrelated_prompts_spread(kv_mesh):
    prefix = [10 + (i * 7) % 200 for i in range(4 * BLOCK)]
    first = complete(kv_mesh, prefix + [11, 12, 13])
    time.sleep(0.5)  # the first request's blocks reach the indexer through the event plane
    for i in range(6):
        assert complete(kv_mesh, prefix + [20 + i, 30 + i, 40 + i]) == first

    rng = random.Random(7)
    unrelated = [[rng.randrange(10, 250) for _ in range(4 * BLOCK)] for _ in range(12)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        workers = list(pool.map(lambda p: complete(kv_mesh, p, max_tokens=16), unrelated))
    assert len(set(workers)) == 2, workers


def test_chat_still_works_in_kv_mode(kv_mesh):
    r = requests.post(f"{kv_mesh.base_url}/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None
