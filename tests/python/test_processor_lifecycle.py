"""The life of a chat processor around its requests: the annotated envelope, a factory that fails
before it builds, a card change that rebuilds the engine, the caller's trace in `Context`, a
client that leaves, a second host taking over from a killed one, a worker dying under a
processor request, and remote router replicas. Real frontend, host, mocker and router processes
over real etcd and NATS."""
import json
import re
import threading
import uuid

import pytest
import requests

from conftest import (TINY_MODEL, Mesh, Proc, free_port, require_env, start_distributed, wait_ready,
                      wait_until)
from test_distributed import worker_load
from test_processor import chat, python_env, start_processor_mesh, wait_processor_ready


def whoami(mesh, headers=None):
    r = requests.post(f"{mesh.base_url}/v1/chat/completions", timeout=30, headers=headers or {}, json={
        "model": "tiny", "messages": [{"role": "user", "content": "whoami"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    return json.loads(r.json()["choices"][0]["message"]["content"])


def metric_sum(mesh, series, part="sum"):
    text = requests.get(f"{mesh.base_url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf'^{series}_{part}{{[^}}]*}} (\S+)$', text, re.M))


def served_by_host(mesh):
    text = requests.get(f"{mesh.base_url}/metrics", timeout=10).text
    return {host: float(n) for host, n in re.findall(
        r'^kvmesh_processor_requests_total\{processor_host="([^"]+)"\} (\S+)$', text, re.M)}


def test_the_envelope_feeds_usage_and_metrics_and_never_reaches_the_client():
    mesh = start_processor_mesh("lifecycle_processor:provider",
                                ("--dyn-chat-processor-config", '{"input_bonus": 1000}'))
    try:
        before = metric_sum(mesh, "dynamo_frontend_input_sequence_tokens")
        ttft_before = metric_sum(mesh, "dynamo_frontend_time_to_first_token_seconds", "count")
        itl_before = metric_sum(mesh, "dynamo_frontend_inter_token_latency_seconds", "count")
        r = chat(mesh, "hello")
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        # The processor's reported counts win over the frontend's own (10 + the bonus).
        assert usage["prompt_tokens"] == 1010 and usage["completion_tokens"] >= 1, usage
        assert metric_sum(mesh, "dynamo_frontend_input_sequence_tokens") - before == 1010
        # Time to first token once per request and the gaps between the processor's chunks.
        assert metric_sum(mesh, "dynamo_frontend_time_to_first_token_seconds", "count") - ttft_before == 1
        assert metric_sum(mesh, "dynamo_frontend_inter_token_latency_seconds", "count") - itl_before >= 1
        streamed = chat(mesh, "hello", stream=True, stream_options={"include_usage": True})
        assert streamed.status_code == 200
        assert "_dynamo_annotated" not in streamed.text and "llm_metrics" not in streamed.text
        events = [json.loads(line[6:]) for line in streamed.text.splitlines()
                  if line.startswith("data: {")]
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
        assert events[-1]["usage"]["prompt_tokens"] == 1010
    finally:
        mesh.stop()


def test_a_failing_factory_is_retried_until_it_builds():
    # The first two factory calls raise; the host retries after 1 s, then 2 s, answering 503 meanwhile.
    mesh = start_distributed("etcd", python_env(), num_workers=1, frontend_args=(
        "--dyn-chat-processor", "lifecycle_processor:provider",
        "--dyn-chat-processor-config", '{"fail_first": 2}'))
    try:
        statuses = set()

        def built():
            r = chat(mesh, "whoami")
            statuses.add(r.status_code)
            return r.status_code == 200

        wait_until(built, timeout=30, interval=0.2, what="the engine built on the third try")
        assert statuses == {503, 200}, statuses
        assert whoami(mesh)["factory_call"] == 3
    finally:
        mesh.stop()


def test_a_card_change_rebuilds_the_engine():
    mesh = start_processor_mesh("lifecycle_processor:provider", num_workers=1)
    try:
        first = whoami(mesh)
        assert (first["factory_call"], first["block_size"]) == (1, 16), first
        # A worker with another card joins, then the first leaves: the model stays served, its
        # card changed, and the engine is built again for it.
        env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
               "NATS_SERVER": require_env("NATS_SERVER"), **python_env()}
        other = Proc("mocker-32", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                                   "--endpoint", f"dyn://{mesh.namespace}.backend.generate",
                                   "--speedup-ratio", "100", "--block-size", "32",
                                   "--tcp-rpc-port", str(free_port())], env)
        mesh.procs.append(other)
        wait_ready(mesh.base_url, "tiny", 2, [mesh.procs[0], other])
        assert whoami(mesh)["factory_call"] == 1
        mesh.procs[1].kill()
        wait_until(lambda: whoami(mesh)["block_size"] == 32, timeout=30, what="engine rebuilt for the new card")
        assert whoami(mesh)["factory_call"] == 2
    finally:
        mesh.stop()


def test_context_carries_the_callers_trace_and_config_the_frontends_options():
    mesh = start_processor_mesh("lifecycle_processor:provider", num_workers=1)
    try:
        trace, parent = uuid.uuid4().hex, uuid.uuid4().hex[:16]
        seen = whoami(mesh, {"traceparent": f"00-{trace}-{parent}-01"})
        assert seen["trace_id"] == trace and seen["parent_span_id"] == parent
        assert re.fullmatch(r"[0-9a-f]{16}", seen["span_id"]) and seen["span_id"] != parent
        assert seen["request_id"]
        untraced = whoami(mesh)
        assert untraced["trace_id"] is None and untraced["span_id"] is None
        assert untraced["request_id"] != seen["request_id"]
        assert seen["namespace"] == mesh.namespace
    finally:
        mesh.stop()


def test_a_client_that_leaves_cancels_the_worker():
    mesh = start_processor_mesh("errors_processor:provider", num_workers=1)
    try:
        with requests.post(f"{mesh.base_url}/v1/chat/completions", stream=True, timeout=30, json={
                "model": "tiny", "messages": [{"role": "user", "content": "slow"}], "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)
            assert worker_load(mesh.worker_rpc[0]).num_running == 1
        wait_until(lambda: worker_load(mesh.worker_rpc[0]).num_running == 0, timeout=10,
                   what="the worker stopped the abandoned request")
    finally:
        mesh.stop()


def start_host(mesh, name, processor="seed_processor:provider"):
    env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
           "NATS_SERVER": require_env("NATS_SERVER"), **python_env()}
    port = free_port()
    host = Proc(name, ["kvmesh-processor-host", "--namespace", mesh.namespace, "--dyn-chat-processor",
                       processor, "--tcp-rpc-port", str(port)], env)
    host.port = port
    mesh.procs.append(host)
    return host


def start_two_hosts(speedup="100"):
    """A frontend that starts no host of its own, two mockers and two hosts of the lifecycle
    processor, both serving; returns (mesh, first host, second host)."""
    mesh = start_distributed("etcd", python_env(), num_workers=2, speedup=speedup, frontend_args=(
        "--dyn-chat-processor", "lifecycle_processor:provider", "--spawn-processor-host", "false"))
    try:
        first, second = start_host(mesh, "host-a", "lifecycle_processor:provider"), \
            start_host(mesh, "host-b", "lifecycle_processor:provider")

        def both_serving():
            # Requests alternate between the hosts the frontend knows: four answers in a row, with
            # both hosts counted, mean both are known and both built their engine.
            answers = [chat(mesh, "whoami").status_code for _ in range(4)]
            served = served_by_host(mesh)
            return answers == [200] * 4 and host_counter(served, first) and host_counter(served, second)

        wait_until(both_serving, timeout=30, what="both hosts serving")
    except BaseException:
        mesh.print_logs()
        mesh.stop()
        raise
    return mesh, first, second


def host_counter(served, host):
    """`kvmesh_processor_requests_total` of `host` (its series is labelled with its address)."""
    return sum(n for address, n in served.items() if address.endswith(f":{host.port}"))


class HostStream:
    """One streaming chat request to the lifecycle processor, read on its own thread: `host` is the
    pid the processor names in its first chunk (the host that started the request), `ok` is None
    while it runs, then whether it ended normally ([DONE] after a `length` finish, no error)."""

    def __init__(self, mesh, max_tokens):
        self.host = None
        self.ok = None
        self.detail = ""
        self._thread = threading.Thread(target=self._run, args=(mesh, max_tokens), daemon=True)
        self._thread.start()

    def _run(self, mesh, max_tokens):
        finish, done, error = None, False, None
        try:
            with requests.post(f"{mesh.base_url}/v1/chat/completions", stream=True, timeout=60, json={
                    "model": "tiny", "messages": [{"role": "user", "content": "host, tell me something"}],
                    "max_tokens": max_tokens, "stream": True}) as r:
                if r.status_code != 200:
                    error = f"status {r.status_code}: {r.text[:200]}"
                for line in r.iter_lines() if error is None else ():
                    if line == b"data: [DONE]":
                        done = True
                    elif line.startswith(b"data: {"):
                        event = json.loads(line[6:])
                        if "error" in event:
                            error = json.dumps(event)[:200]
                        for choice in event.get("choices") or ():
                            named = re.search(r"\[host (\d+)\]", choice["delta"].get("content") or "")
                            if named and self.host is None:
                                self.host = int(named.group(1))
                            finish = choice.get("finish_reason") or finish
        except requests.RequestException as e:
            error = repr(e)
        self.detail = error or f"finish={finish} done={done}"
        self.ok = error is None and done and finish == "length"

    def join(self):
        self._thread.join(timeout=90)
        assert self.ok is not None, "the stream did not end"
        return self


def test_two_live_hosts_share_the_load():
    mesh, first, second = start_two_hosts()
    try:
        before = served_by_host(mesh)
        streams = [HostStream(mesh, 3).join() for _ in range(10)]
        assert all(s.ok for s in streams), [s.detail for s in streams]
        after = served_by_host(mesh)
        # Round robin: one after another, the requests alternate between the two hosts.
        assert host_counter(after, first) - host_counter(before, first) == 5, (before, after)
        assert host_counter(after, second) - host_counter(before, second) == 5, (before, after)
        assert [s.host for s in streams[:2]] in ([first.proc.pid, second.proc.pid],
                                                 [second.proc.pid, first.proc.pid]), [s.host for s in streams]
        assert all(s.host == streams[i % 2].host for i, s in enumerate(streams)), [s.host for s in streams]
    finally:
        mesh.stop()


def test_a_second_host_takes_over_from_a_killed_one():
    # Slow mockers: a 30-token answer takes about two seconds, so the kill lands while every
    # request of the first wave is still streaming (checked just before it).
    mesh, first, second = start_two_hosts(speedup="0.1")
    try:
        wave = [HostStream(mesh, 30) for _ in range(8)]
        wait_until(lambda: all(s.host for s in wave), timeout=20, what="every request started on a host")
        killed, survivor = first.proc.pid, second.proc.pid
        assert {s.host for s in wave} == {killed, survivor}, [s.host for s in wave]
        assert all(s.ok is None for s in wave), "the load outlasts the kill"
        first.kill()
        # Sent at once, while discovery may still list the dead host: none of these had started on
        # it, so none may fail, and the survivor serves them all.
        served = served_by_host(mesh)
        after = [HostStream(mesh, 4) for _ in range(6)]
        for s in wave + after:
            s.join()
        on_killed = [s for s in wave if s.host == killed]
        # The requests running on the killed host are the ones, and the only ones, that fail.
        assert on_killed and not any(s.ok for s in on_killed), [s.detail for s in on_killed]
        assert all(s.ok for s in wave if s.host == survivor), [(s.host, s.detail) for s in wave]
        assert all(s.ok and s.host == survivor for s in after), [(s.host, s.detail) for s in after]
        # Every request sent after the kill is counted on the survivor alone.
        now = served_by_host(mesh)
        assert host_counter(now, second) - host_counter(served, second) == len(after), (served, now)
        assert second.alive() and not first.alive()
    finally:
        mesh.stop()


def test_a_processor_request_migrates_when_its_worker_dies():
    mesh = start_distributed("etcd", python_env(), num_workers=2, speedup="0.05", frontend_args=(
        "--dyn-chat-processor", "seed_processor:provider", "--migration-limit", "3"))
    try:
        wait_processor_ready(mesh)
        result = {}

        def stream():
            result["r"] = chat(mesh, "a long story", stream=True, max_tokens=40,
                               stream_options={"include_usage": True})

        reader = threading.Thread(target=stream)
        reader.start()
        def running_on():
            # The worker's process (mesh.procs[0] is the frontend), once the request runs there.
            return next((mesh.procs[1 + i] for i, address in enumerate(mesh.worker_rpc)
                         if worker_load(address).num_running == 1), None)

        wait_until(running_on, timeout=10, what="the request running on a worker").kill()
        reader.join(timeout=60)
        r = result["r"]
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert not any("error" in e for e in events), r.text[-500:]
        assert events[-1]["usage"]["completion_tokens"] == 40
        text = requests.get(f"{mesh.base_url}/metrics", timeout=10).text
        assert re.search(r'^dynamo_frontend_model_migration_total\{[^}]*\} [1-9]', text, re.M), "migrated"
    finally:
        mesh.stop()


def test_remote_router_replicas_route_processor_requests():
    namespace = f"p{uuid.uuid4().hex[:10]}"
    env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
           "NATS_SERVER": require_env("NATS_SERVER"), "DYN_NAMESPACE": namespace, **python_env()}
    metrics_port = free_port()
    router = Proc("router", ["kvmesh-router", "--tcp-rpc-port", str(free_port()),
                             "--metrics-port", str(metrics_port)], env)
    mockers = [Proc(f"mocker{i}", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                                   "--endpoint", f"dyn://{namespace}.backend.generate", "--speedup-ratio", "100",
                                   "--tcp-rpc-port", str(free_port())], env) for i in range(2)]
    port = free_port()
    frontend = Proc("frontend", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                                 "--use-remote-router", "on", "--dyn-chat-processor", "seed_processor:provider"],
                    env)
    mesh = Mesh(f"http://127.0.0.1:{port}", [router, *mockers, frontend], namespace)
    try:
        wait_ready(mesh.base_url, "tiny", 2, mesh.procs)
        wait_processor_ready(mesh)
        routed = 'kvmesh_router_decisions_total{model="tiny",outcome="routed"}'

        def decisions():
            text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
            return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(routed)), 0.0)

        before = decisions()
        for _ in range(4):
            assert chat(mesh, "hello").status_code == 200
        assert decisions() == before + 4
    finally:
        mesh.stop()
