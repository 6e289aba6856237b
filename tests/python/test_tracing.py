"""One trace per request across the mesh (docs/tracing.md): real frontend, processor host, router
replica and mocker processes over real etcd and NATS export OTLP/gRPC spans to the repository's
own `kvmesh-otel-collector`, which the tests query by the client's trace id."""
import json
import os
import signal
import time
import uuid

import pytest
import requests

from conftest import TINY_MODEL, Mesh, Proc, free_port, require_env, wait_ready, wait_until
from test_migration import running_on
from test_processor import python_env, wait_processor_ready


class Collector:
    def __init__(self):
        self.otlp_port = free_port()
        self.http_port = free_port()
        self.proc = Proc("collector", ["kvmesh-otel-collector", "--host", "127.0.0.1",
                                       "--otlp-port", str(self.otlp_port), "--http-port", str(self.http_port)])
        self.url = f"http://127.0.0.1:{self.http_port}"
        wait_until(lambda: requests.get(f"{self.url}/health", timeout=2).status_code == 200, timeout=30,
                   what="collector healthy")

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.otlp_port}"

    def spans(self, trace_id):
        r = requests.get(f"{self.url}/v1/traces/{trace_id}", timeout=5)
        assert r.status_code == 200, r.text
        return r.json()["spans"]

    def received(self):
        return requests.get(f"{self.url}/health", timeout=5).json()["spans_received"]


@pytest.fixture(scope="module")
def collector():
    c = Collector()
    yield c
    c.proc.kill()


def tracing_env(collector, **extra):
    # A short batch delay so that spans reach the collector within the test's wait.
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100", **extra}


def new_traceparent():
    trace_id, parent = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    return trace_id, parent, f"00-{trace_id}-{parent}-01"


def start_mesh(collector, namespace, env_extra, processor=True, remote_router=True, mocker_args=(),
               frontend_env=None):
    env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
           "NATS_SERVER": require_env("NATS_SERVER"), "DYN_NAMESPACE": namespace, **python_env(), **env_extra}
    procs = []
    if remote_router:
        procs.append(Proc("router", ["kvmesh-router", "--router-mode", "kv", "--tcp-rpc-port", str(free_port()),
                                     "--metrics-port", str(free_port())], env))
    worker_ports = [free_port() for _ in range(2)]
    procs += [Proc(f"mocker{i}", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                                  "--endpoint", f"dyn://{namespace}.backend.generate", "--speedup-ratio", "100",
                                  "--block-size", "16", "--tcp-rpc-port", str(port), *mocker_args], env)
              for i, port in enumerate(worker_ports)]
    port = free_port()
    args = ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port)]
    if remote_router:
        args += ["--use-remote-router", "on"]
    if processor:
        args += ["--dyn-chat-processor", "seed_processor:provider"]
    procs.append(Proc("frontend", args, {**env, **(frontend_env or {})}))
    mesh = Mesh(f"http://127.0.0.1:{port}", procs, namespace)
    mesh.worker_rpc = [f"127.0.0.1:{p}" for p in worker_ports]
    mesh.mockers = [p for p in procs if p.name.startswith("mocker")]
    try:
        wait_ready(mesh.base_url, "tiny", 2, procs)
        if processor:
            wait_processor_ready(mesh)
    except BaseException:
        mesh.print_logs()
        mesh.stop()
        raise
    return mesh


def by_name(spans, service, name):
    return [s for s in spans if s["service"] == service and s["name"] == name]


def one(spans, service, name):
    found = by_name(spans, service, name)
    assert len(found) == 1, (service, name, [(s["service"], s["name"]) for s in spans])
    return found[0]


def test_one_request_is_one_trace_through_frontend_processor_router_and_worker(collector):
    mesh = start_mesh(collector, f"tr{uuid.uuid4().hex[:10]}", tracing_env(collector))
    try:
        trace_id, client_span, traceparent = new_traceparent()
        reply = mesh.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=6,
            extra_headers={"traceparent": traceparent, "tracestate": "vendor=1"})
        assert reply.choices[0].message.content is not None

        # Each process exports on its own schedule: wait for every hop's span.
        wanted = [("kvmesh-frontend", "chat_completions"), ("kvmesh-frontend", "route"),
                  ("kvmesh-frontend", "worker_generate"), ("kvmesh-processor-host", "processor_process"),
                  ("kvmesh-router", "route"), ("kvmesh-mocker", "worker_generate")]

        def complete():
            spans = collector.spans(trace_id)
            return spans if all(by_name(spans, *hop) for hop in wanted) else None

        spans = wait_until(complete, timeout=20, interval=0.2, what="spans of every hop")
        assert all(s["trace_id"] == trace_id for s in spans)
        root = one(spans, "kvmesh-frontend", "chat_completions")
        assert root["parent_span_id"] == client_span
        assert root["attributes"]["kvmesh.model"] == "tiny"
        host = one(spans, "kvmesh-processor-host", "processor_process")
        assert host["parent_span_id"] == root["span_id"]
        assert host["attributes"]["kvmesh.model"] == "tiny"
        # The frontend's decision span, and the replica's as its child naming the same worker.
        route = one(spans, "kvmesh-frontend", "route")
        assert route["parent_span_id"] == root["span_id"]
        replica = one(spans, "kvmesh-router", "route")
        assert replica["parent_span_id"] == route["span_id"]
        worker_id = replica["attributes"]["kvmesh.worker_id"]
        assert route["attributes"]["kvmesh.worker_id"] == worker_id
        assert "kvmesh.overlap_blocks" in replica["attributes"]
        # The worker call: the frontend's client span, the worker's server span under it.
        attempt = one(spans, "kvmesh-frontend", "worker_generate")
        assert attempt["parent_span_id"] == root["span_id"]
        assert attempt["attributes"]["kvmesh.worker_id"] == worker_id
        worker = one(spans, "kvmesh-mocker", "worker_generate")
        assert worker["parent_span_id"] == attempt["span_id"]
        assert worker["attributes"]["kvmesh.worker_id"] == worker_id
        assert worker["attributes"]["kvmesh.ttft_ms"] >= 0
        assert worker["attributes"]["kvmesh.output_tokens"] >= 1
        for span in spans:
            assert span["start_unix_nano"] <= span["end_unix_nano"], span
        # Another request is another trace.
        other_trace, _, other_parent = new_traceparent()
        mesh.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "again"}],
                                              max_tokens=2, extra_headers={"traceparent": other_parent})
        wait_until(lambda: by_name(collector.spans(other_trace), "kvmesh-frontend", "chat_completions"),
                   timeout=20, interval=0.2, what="the second trace")
        assert len(collector.spans(trace_id)) == len(spans)
    finally:
        mesh.stop()


def test_a_worker_killed_mid_stream_gives_a_span_per_migration(collector):
    mesh = start_mesh(collector, f"tm{uuid.uuid4().hex[:10]}", tracing_env(collector, DYN_MIGRATION_LIMIT="3"),
                      processor=False, remote_router=False, mocker_args=("--decode-speedup-ratio", "0.01"))
    try:
        trace_id, client_span, traceparent = new_traceparent()
        seen = 0
        with requests.post(f"{mesh.base_url}/v1/completions", stream=True, timeout=60,
                           headers={"traceparent": traceparent}, json={
                               "model": "tiny", "prompt": "tell me a long story", "max_tokens": 120,
                               "stream": True, "ignore_eos": True,
                               "nvext": {"extra_fields": ["worker_id"]}}) as r:
            assert r.status_code == 200, r.text
            for line in r.iter_lines():
                if not line.startswith(b"data: {"):
                    continue
                seen += 1
                if seen == 10:
                    counts = running_on(mesh)
                    assert sorted(counts) == [0, 1], counts
                    mesh.mockers[counts.index(1)].kill(signal.SIGKILL)
        assert seen > 10

        def migrated():
            spans = collector.spans(trace_id)
            root = by_name(spans, "kvmesh-frontend", "completions")
            # Each process exports on its own schedule: wait for the surviving worker's span too.
            survived = [w for w in by_name(spans, "kvmesh-mocker", "worker_generate")
                        if w["attributes"].get("kvmesh.migrations") == 1]
            return spans if root and survived and by_name(spans, "kvmesh-frontend", "migration") else None

        spans = wait_until(migrated, timeout=20, interval=0.2, what="the migration span")
        root = one(spans, "kvmesh-frontend", "completions")
        assert root["parent_span_id"] == client_span
        migration = one(spans, "kvmesh-frontend", "migration")
        assert migration["parent_span_id"] == root["span_id"]
        assert migration["attributes"]["kvmesh.migration"] == 1
        victim_id = migration["attributes"]["kvmesh.from_worker_id"]
        attempts = by_name(spans, "kvmesh-frontend", "worker_generate")
        assert len(attempts) == 2, attempts
        first = next(a for a in attempts if a["parent_span_id"] == root["span_id"])
        moved = next(a for a in attempts if a["parent_span_id"] == migration["span_id"])
        assert first["attributes"]["kvmesh.worker_id"] == victim_id
        assert moved["attributes"]["kvmesh.worker_id"] != victim_id
        # The new decision is a child of the migration too, and the surviving worker's span
        # (a prompt that carries the tokens already streamed) hangs under the new attempt.
        assert any(s["parent_span_id"] == migration["span_id"] for s in by_name(spans, "kvmesh-frontend", "route"))
        survivor = [s for s in by_name(spans, "kvmesh-mocker", "worker_generate")
                    if s["parent_span_id"] == moved["span_id"]]
        assert len(survivor) == 1 and survivor[0]["attributes"]["kvmesh.migrations"] == 1
    finally:
        mesh.stop()


@pytest.mark.parametrize("switch", [{}, {"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}])
def test_with_tracing_off_nothing_reaches_the_collector(switch):
    # A collector of its own, so that only this mesh could have sent it anything.
    collector = Collector()
    env = {**switch}
    if switch:
        # The endpoint is set: only the switch keeps the spans home.
        env.update(tracing_env(collector))
    mesh = None
    try:
        mesh = start_mesh(collector, f"to{uuid.uuid4().hex[:10]}", env)
        _, _, traceparent = new_traceparent()
        mesh.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=4, extra_headers={"traceparent": traceparent})
        time.sleep(1.5)
        assert collector.received() == 0
        assert "exporting traces" not in "".join(p.output() for p in mesh.procs)
    finally:
        if mesh:
            mesh.stop()
        collector.proc.kill()


def test_an_unsupported_exporter_fails_at_start():
    proc = Proc("bad-otel", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny"],
                {"OTEL_TRACES_EXPORTER": "zipkin", "DYN_DISCOVERY_BACKEND": "mem"})
    try:
        proc.proc.wait(timeout=30)
        assert proc.proc.returncode == 2
        assert "OTEL_TRACES_EXPORTER=zipkin" in proc.output()
    finally:
        proc.kill()


def test_the_collector_answers_bad_ids_with_400(collector):
    r = requests.get(f"{collector.url}/v1/traces/not-hex", timeout=5)
    assert r.status_code == 400 and "error" in r.json()
    assert requests.get(f"{collector.url}/v1/traces/{'0' * 32}", timeout=5).json() == {"spans": []}
