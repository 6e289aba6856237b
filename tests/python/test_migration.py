"""Request migration (docs/routing.md, "Migration") with real processes on etcd and NATS: a
worker SIGKILLed mid-stream does not fail the client's stream when --migration-limit allows
moving the request; the stream continues on the other worker with the right token count, and the
migration is counted. Without migration the same failure reaches the client as an error."""
import json
import signal
import time

import grpc
import pytest
import requests

from conftest import proto_stubs, start_distributed, stream_usage, wait_until


def running_on(mesh):
    pb = proto_stubs()
    counts = []
    for address in mesh.worker_rpc:
        with grpc.insecure_channel(address) as channel:
            stub = pb["worker_pb2_grpc"].WorkerStub(channel)
            counts.append(stub.GetLoad(pb["worker_pb2"].GetLoadRequest(), timeout=5).ranks[0].num_running)
    return counts


def stream_and_kill(mesh, max_tokens=120, sig=signal.SIGKILL, stop_worker=None):
    """Streams a completion, kills the worker serving it with `sig` (or hands it to
    `stop_worker`) after some tokens; returns the parsed events (data objects, or an error) and
    the number of tokens seen before the kill."""
    events = []
    killed_after = None
    with requests.post(f"{mesh.base_url}/v1/completions", stream=True, timeout=60, json={
            "model": "tiny", "prompt": "tell me a long story", "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            events.append(json.loads(line[len(b"data: "):]))
            if killed_after is None and len(events) == 10:
                counts = running_on(mesh)
                assert sorted(counts) == [0, 1], counts
                victim = mesh.procs[1 + counts.index(1)]  # procs: frontend, mocker0, mocker1
                if stop_worker:
                    stop_worker(victim)
                else:
                    victim.kill(sig)
                killed_after = len(events)
    return events, killed_after


@pytest.fixture
def migrating_mesh():
    mesh = start_distributed("etcd", {"DYN_MIGRATION_LIMIT": "3"}, mocker_args=("--decode-speedup-ratio", "0.05"))
    yield mesh
    mesh.stop()


@pytest.fixture
def plain_mesh():
    mesh = start_distributed("etcd", mocker_args=("--decode-speedup-ratio", "0.05"))
    yield mesh
    mesh.stop()


def test_stream_survives_a_killed_worker(migrating_mesh):
    events, killed_after = stream_and_kill(migrating_mesh)
    assert killed_after == 10
    assert not any("error" in e for e in events), [e for e in events if "error" in e]
    finals = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
    assert finals and finals[-1]["choices"][0]["finish_reason"] == "length"
    usage = [e["usage"] for e in events if e.get("usage")][-1]
    assert usage["completion_tokens"] == 120
    assert usage["prompt_tokens"] < 20  # the original prompt, not prompt + streamed tokens
    metrics = requests.get(f"{migrating_mesh.base_url}/metrics", timeout=5).text
    assert 'dynamo_frontend_model_migration_total{migration_type="ongoing_request",model="tiny"} 1' in metrics
    # The surviving worker serves new requests.
    r = requests.post(f"{migrating_mesh.base_url}/v1/completions", timeout=30,
                      json={"model": "tiny", "prompt": "again", "max_tokens": 3})
    assert r.status_code == 200


@pytest.fixture
def impatient_mesh():
    # Workers that stop without waiting for their running requests: they end them CANCELLED.
    # Speed-up 25, not 100: at 100 a busy machine let the worker finish all 120 tokens before the
    # client had read 10 events, and the kill found no running request.
    mesh = start_distributed("etcd", {"DYN_MIGRATION_LIMIT": "3", "DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS": "0"},
                             mocker_args=("--decode-speedup-ratio", "0.05"), speedup="25")
    yield mesh
    mesh.stop()


def test_stream_survives_a_worker_that_gives_up_its_requests(impatient_mesh):
    """A worker shutting down ends its requests with a CANCELLED finish: that is a failure to
    migrate from, not the end of the answer."""
    events, killed_after = stream_and_kill(impatient_mesh, sig=signal.SIGTERM)
    assert killed_after == 10
    assert not any("error" in e for e in events), [e for e in events if "error" in e]
    finals = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
    assert finals and finals[-1]["choices"][0]["finish_reason"] == "length"
    assert [e["usage"] for e in events if e.get("usage")][-1]["completion_tokens"] == 120


@pytest.fixture
def watchful_mesh():
    mesh = start_distributed("etcd", {"DYN_MIGRATION_LIMIT": "3", "DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS": "1"},
                             mocker_args=("--decode-speedup-ratio", "0.05"))
    yield mesh
    mesh.stop()


def test_stream_survives_a_frozen_worker(watchful_mesh):
    """A worker that stops answering without closing its connection (SIGSTOP: the kernel still
    acknowledges, HTTP/2 keepalive would notice only after 15 s) is given up after the backend
    stream timeout, and the request continues on the other worker."""
    frozen = []

    def freeze(victim):
        victim.proc.send_signal(signal.SIGSTOP)
        frozen.append(victim)

    try:
        began = time.monotonic()
        events, killed_after = stream_and_kill(watchful_mesh, stop_worker=freeze)
        elapsed = time.monotonic() - began
    finally:
        for victim in frozen:
            victim.proc.send_signal(signal.SIGKILL)
    assert killed_after == 10
    assert not any("error" in e for e in events), [e for e in events if "error" in e]
    assert [e["usage"] for e in events if e.get("usage")][-1]["completion_tokens"] == 120
    assert elapsed < 10, elapsed  # the silence limit (1 s), not the keepalive (15 s), moved it


def test_without_migration_the_client_sees_the_failure(plain_mesh):
    events, killed_after = stream_and_kill(plain_mesh)
    assert killed_after == 10
    assert any("error" in e for e in events), events[-3:]
    assert not any(e.get("usage") for e in events)


def stream_tokens(base_url, index, max_tokens):
    """One streamed chat; returns (completion tokens from the final usage, the error if any)."""
    return stream_usage(base_url, "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": f"story {index}"}],
        "max_tokens": max_tokens, "ignore_eos": True})


@pytest.mark.parametrize("num_workers,num_streams", [(2, 200), (4, 400)])
def test_a_burst_of_migrations_fails_no_stream(num_workers, num_streams):
    """The worker-kill drill: many concurrent streams on real-time workers, one worker
    SIGKILLed while it runs many of them. Its streams move to the others in one burst; every
    stream, moved or not, completes with its full token count. (A burst once closed the surviving
    workers' whole HTTP/2 connections: h2 gives up on a connection holding too many small unread
    frames.)"""
    from concurrent.futures import ThreadPoolExecutor
    mesh = start_distributed("etcd", {"DYN_MIGRATION_LIMIT": "3"}, num_workers=num_workers, speedup="1")
    try:
        max_tokens = 400
        with ThreadPoolExecutor(max_workers=num_streams) as pool:
            results = [pool.submit(stream_tokens, mesh.base_url, i, max_tokens) for i in range(num_streams)]
            # Kill once the victim runs half its share (or as many as it got within 15 s), so its
            # streams move in one burst (the client starts its streams over a second or two, the
            # first end a few seconds in).
            share = num_streams // num_workers
            deadline = time.monotonic() + 15
            running_at_kill = running_on(mesh)[0]
            while running_at_kill < share // 2 and time.monotonic() < deadline:
                time.sleep(0.05)
                running_at_kill = running_on(mesh)[0]
            mesh.procs[1].kill(signal.SIGKILL)
            assert running_at_kill >= 10, f"only {running_at_kill} streams ran on the victim"
            results = [r.result() for r in results]
        errors = [e for _, e in results if e is not None]
        assert not errors, (len(errors), errors[:3])
        assert [t for t, _ in results] == [max_tokens] * num_streams
        metrics = requests.get(f"{mesh.base_url}/metrics", timeout=5).text
        migrated = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                       if line.startswith("dynamo_frontend_model_migration_total{"))
        # The victim's streams moved (some of those counted may have ended before the kill:
        # streams start over a second or two and the first end a few seconds in).
        assert migrated >= max(10, running_at_kill // 2), (migrated, running_at_kill)
    finally:
        mesh.stop()
