"""Real processes: one kvmesh-frontend and two kvmesh-mocker processes discovering each other
through a real etcd (or the file backend) and publishing KV events on a real NATS JetStream."""
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from conftest import ROOT, proto_stubs, start_distributed, wait_until


def exercise_sdk(mesh):
    client = mesh.client()
    resp = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                          max_tokens=6)
    assert resp.choices[0].message.content and resp.usage.completion_tokens == 6
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=6, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    comp = client.completions.create(model="tiny", prompt="kv caches", max_tokens=5)
    assert comp.choices[0].text and comp.usage.completion_tokens == 5
    comp_stream = list(client.completions.create(model="tiny", prompt="kv caches", max_tokens=5, stream=True))
    assert comp_stream[-1].choices[0].finish_reason == "length"


def worker_of(mesh, content):
    r = requests.post(f"{mesh.base_url}/v1/chat/completions", timeout=30, json={
        "model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 2,
        "nvext": {"extra_fields": ["worker_id"]}})
    assert r.status_code == 200, r.text
    return r.json()["nvext"]["worker_id"]["decode_worker_id"]


def num_instances(mesh):
    return requests.get(f"{mesh.base_url}/health", timeout=5).json().get("num_instances", 0)


def kill_one_and_check(mesh, ttl_secs):
    workers_before = {worker_of(mesh, f"probe {i}") for i in range(4)}
    assert len(workers_before) == 2, "round robin over two workers"
    victim = mesh.procs[1]
    victim.kill()  # SIGKILL: no chance to unregister
    killed_at = time.monotonic()
    wait_until(lambda: num_instances(mesh) == 1, timeout=ttl_secs + 10, what="dead worker removed")
    assert time.monotonic() - killed_at <= ttl_secs + 5
    client = mesh.client()
    for i in range(20):
        resp = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"after {i}"}],
                                              max_tokens=3)
        assert resp.usage.completion_tokens == 3
    survivors = {worker_of(mesh, f"again {i}") for i in range(4)}
    assert len(survivors) == 1 and survivors < workers_before


@pytest.fixture
def etcd_mesh():
    mesh = start_distributed("etcd")
    yield mesh
    mesh.stop()


@pytest.fixture
def file_mesh():
    root = tempfile.mkdtemp(prefix="kvmesh-file-kv-")
    mesh = start_distributed("file", {"DYN_FILE_KV": root})
    yield mesh
    mesh.stop()


def test_etcd_nats_mesh_serves_the_sdk(etcd_mesh):
    exercise_sdk(etcd_mesh)


def compile_protos():
    return proto_stubs()


def worker_load(address):
    import grpc
    stubs = compile_protos()
    with grpc.insecure_channel(address) as channel:
        stub = stubs["worker_pb2_grpc"].WorkerStub(channel)
        return stub.GetLoad(stubs["worker_pb2"].GetLoadRequest(), timeout=5).ranks[0]


@pytest.fixture
def slow_decode_mesh():
    # Decoding 100x slower than real time, so a long request is still running when checked.
    mesh = start_distributed("etcd", mocker_args=("--decode-speedup-ratio", "0.01"))
    yield mesh
    mesh.stop()


def test_client_disconnect_cancels_on_the_worker(slow_decode_mesh):
    etcd_mesh = slow_decode_mesh
    with requests.post(f"{etcd_mesh.base_url}/v1/chat/completions", stream=True, timeout=30, json={
            "model": "tiny", "messages": [{"role": "user", "content": "a long answer please"}],
            "max_tokens": 7000, "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        running = sum(worker_load(a).num_running for a in etcd_mesh.worker_rpc)
        assert running == 1, "the request is running on a worker"
    wait_until(lambda: sum(worker_load(a).num_running for a in etcd_mesh.worker_rpc) == 0, timeout=10,
               what="worker stopped the abandoned request")
    assert all(worker_load(a).kv_used_blocks == 0 for a in etcd_mesh.worker_rpc)


def test_kv_events_on_nats_decode(etcd_mesh):
    import nats
    events_pb2 = compile_protos()["events_pb2"]
    # Long prompts fill whole 16-token blocks, so each mocker stores blocks.
    client = etcd_mesh.client()
    workers = set()
    for i in range(4):
        text = f"request {i} " + "the router sends each prompt to the worker with its prefix " * 6
        resp = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}],
                                              max_tokens=4, extra_body={"nvext": {"extra_fields": ["worker_id"]}})
        workers.add(resp.model_extra["nvext"]["worker_id"]["decode_worker_id"])
    assert len(workers) == 2
    ns = etcd_mesh.namespace

    async def read_events():
        nc = await nats.connect(os.environ["NATS_SERVER"])
        js = nc.jetstream()
        sub = await js.subscribe(f"kvmesh.{ns}.kv.>", ordered_consumer=True)
        batches = []
        deadline = time.monotonic() + 20
        seen_workers = set()
        while time.monotonic() < deadline and seen_workers != workers:
            try:
                msg = await sub.next_msg(timeout=2)
            except nats.errors.TimeoutError:
                continue
            batch = events_pb2.KvEventBatch()
            batch.ParseFromString(msg.data)
            batches.append((msg.subject, batch))
            seen_workers.add(batch.worker_id)
        await nc.close()
        return batches

    batches = asyncio.run(read_events())
    by_worker = {}
    for subject, batch in batches:
        assert subject.startswith(f"kvmesh.{ns}.kv.tiny.")
        by_worker.setdefault(batch.worker_id, []).extend(batch.events)
    assert set(by_worker) == workers
    for events in by_worker.values():
        ids = [e.event_id for e in events]
        assert ids == list(range(len(ids))), "event ids start at 0 and are consecutive"
        stored = [e.stored for e in events if e.WhichOneof("kind") == "stored"]
        assert stored and all(len(s.blocks) >= 1 for s in stored)
        assert all(b.tokens_hash != 0 for s in stored for b in s.blocks)


def test_etcd_sigkill_removes_worker_within_lease_ttl(etcd_mesh):
    kill_one_and_check(etcd_mesh, ttl_secs=10)


def test_file_backend_mesh(file_mesh):
    exercise_sdk(file_mesh)
    kill_one_and_check(file_mesh, ttl_secs=10)
    # With every worker gone the model is known but unavailable: 503, not 404.
    file_mesh.procs[2].kill()
    wait_until(lambda: num_instances(file_mesh) == 0, timeout=20, what="all workers removed")
    r = requests.post(f"{file_mesh.base_url}/v1/chat/completions", timeout=10, json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    assert r.status_code == 503, r.text
    assert "no ready workers" in r.json()["error"]["message"]
