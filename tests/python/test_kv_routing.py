"""KV-aware routing through `kvmesh up --router-mode kv`: the in-process indexer shard answers the
frontend's overlap queries by direct calls (no gRPC in between), so requests sharing a prefix
follow its cache. The shard still serves `kvmesh.v1.Indexer` on --tcp-rpc-port for others."""

import grpc
import pytest
import requests

from conftest import Mesh, Proc, assert_prefix_follows_the_cache, complete_on, free_port, proto_stubs, wait_ready

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
    mesh.indexer_rpc = f"127.0.0.1:{rpc_port}"
    try:
        wait_ready(base, "tiny", 2, [proc])
        yield mesh
    finally:
        mesh.stop()


def test_shared_prefix_follows_the_cache_and_unrelated_prompts_spread(kv_mesh):
    assert_prefix_follows_the_cache(kv_mesh, BLOCK, settle=0.5)


def test_chat_still_works_in_kv_mode(kv_mesh):
    r = requests.post(f"{kv_mesh.base_url}/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None


def test_overlap_queries_make_no_grpc_call(kv_mesh):
    pb = proto_stubs()

    def status():
        with grpc.insecure_channel(kv_mesh.indexer_rpc) as channel:
            stub = pb["indexer_pb2_grpc"].IndexerStub(channel)
            return stub.Status(pb["indexer_pb2"].StatusRequest(), timeout=5)

    before = status()
    for i in range(5):
        complete_on(kv_mesh, [7 + i] * (2 * BLOCK))
    after = status()
    # Every kv decision of a prompt of at least one block reads the index: five more answers,
    # all by direct call.
    assert after.in_process_queries >= before.in_process_queries + 5, (before, after)
    assert after.grpc_queries == 0, after
