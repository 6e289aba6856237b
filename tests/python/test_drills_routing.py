"""Routing fault drills on real processes with real etcd and NATS (docs/security.md, "Faults"): a
stalled worker is given up at its deadline and its streams complete elsewhere; a fast-failing
worker is ejected and readmitted once it recovers; a killed router replica's synced load and a
killed frontend's routings are released within the discovery lease TTL; a restarted indexer
replica past the stream's retention converges to its peer. The worker-kill drill under 200
streams is test_migration.py::test_a_burst_of_migrations_fails_no_stream."""
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import requests

from conftest import (TINY_MODEL, Mesh, Proc, digests, free_port, proto_stubs, require_env, stream_usage,
                      wait_ready, wait_until)

# etcd leases of kvmesh processes last 10 s (crates/runtime/src/discovery/etcd.rs); a departed
# process's routings must be released within that plus the watch's delivery.
LEASE_RELEASE_LIMIT = 20


def mesh_env(namespace, **extra):
    env = {
        "DYN_DISCOVERY_BACKEND": "etcd",
        "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
        "NATS_SERVER": require_env("NATS_SERVER"),
        "DYN_NAMESPACE": namespace,
    }
    env.update(extra)
    return env


def mocker(name, namespace, env, *args):
    return Proc(name, ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                       "--endpoint", f"dyn://{namespace}.backend.generate", "--block-size", "16",
                       "--tcp-rpc-port", str(free_port()), *args], env)


def metric(url, series):
    for line in requests.get(url, timeout=5).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def faulty_mesh(tmp_path, frontend_env, frontend_args=()):
    """A frontend and two mockers; mocker 0 reads its fault from `mesh.fault`."""
    namespace = f"d{uuid.uuid4().hex[:10]}"
    env = mesh_env(namespace)
    fault = tmp_path / "fault0"
    fault.write_text("")
    mockers = [mocker("mocker0", namespace, env, "--speedup-ratio", "10", "--fault-file", str(fault)),
               mocker("mocker1", namespace, env, "--speedup-ratio", "10")]
    port = free_port()
    frontend = Proc("frontend", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                                 "--namespace", namespace, "--router-mode", "round-robin", *frontend_args],
                    {**env, **frontend_env})
    mesh = Mesh(f"http://127.0.0.1:{port}", [frontend, *mockers], namespace)
    mesh.fault = fault
    try:
        wait_ready(mesh.base_url, "tiny", 2, mesh.procs)
    except BaseException:
        mesh.print_logs()
        mesh.stop()
        raise
    return mesh


def stream_completion(base_url, index, max_tokens):
    """One streamed completion; returns (completion tokens from the final usage, error or None)."""
    return stream_usage(base_url, "/v1/completions", {
        "model": "tiny", "prompt": f"story number {index}", "max_tokens": max_tokens, "ignore_eos": True})


def served_by(base_url, prompt):
    r = requests.post(f"{base_url}/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": prompt, "max_tokens": 3, "nvext": {"extra_fields": ["worker_id"]}})
    assert r.status_code == 200, r.text
    return r.json()["nvext"]["worker_id"]["decode_worker_id"]


def test_a_stalled_worker_is_given_up_and_its_streams_complete(tmp_path):
    """Mocker 0 accepts requests and never answers while its server stays up. With a short
    DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS (the default deadlines are unit-tested in
    services/router/src/generation/deadline.rs) every stream that landed there moves to
    mocker 1 and completes; the stalled worker is counted as failing and ejected."""
    mesh = faulty_mesh(tmp_path, {"DYN_MIGRATION_LIMIT": "3", "DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS": "2"})
    try:
        mesh.fault.write_text("stall")
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=12) as pool:
            results = list(pool.map(lambda i: stream_completion(mesh.base_url, i, 30), range(12)))
        elapsed = time.monotonic() - began
        assert [e for _, e in results if e] == []
        assert [t for t, _ in results] == [30] * 12
        assert elapsed < 30, elapsed
        metrics_url = f"{mesh.base_url}/metrics"
        migrated = sum(float(line.rsplit(" ", 1)[1]) for line in requests.get(metrics_url, timeout=5).text.splitlines()
                       if line.startswith("dynamo_frontend_model_migration_total{"))
        assert migrated >= 3, migrated
        assert metric(metrics_url, 'kvmesh_router_ejected_workers{model="tiny"}') == 1
        assert metric(metrics_url, 'kvmesh_router_worker_ejections_total{model="tiny"}') >= 1
    finally:
        mesh.stop()


def test_a_failing_worker_is_ejected_and_readmitted_when_it_recovers(tmp_path):
    """Mocker 0 fails every request at once. Its failures move the requests to mocker 1 (no
    client sees an error); after three in a row it is ejected and gets nothing, although it looks
    idle. Once it recovers, the probe after its back-off readmits it and it serves again."""
    mesh = faulty_mesh(tmp_path, {"DYN_MIGRATION_LIMIT": "3", "KVMESH_ROUTER_EJECTION_BASE_SECS": "2"})
    metrics_url = f"{mesh.base_url}/metrics"
    try:
        healthy = {served_by(mesh.base_url, f"warm {i}") for i in range(4)}
        assert len(healthy) == 2, healthy
        mesh.fault.write_text("fail")
        during = [served_by(mesh.base_url, f"during {i}") for i in range(12)]
        assert len(set(during)) == 1, during
        assert metric(metrics_url, 'kvmesh_router_ejected_workers{model="tiny"}') == 1
        assert metric(metrics_url, 'kvmesh_router_worker_ejections_total{model="tiny"}') >= 1
        ejected = (healthy - set(during)).pop()
        mesh.fault.write_text("")
        time.sleep(2.5)

        def readmitted():
            served_by(mesh.base_url, f"after {uuid.uuid4().hex}")
            return metric(metrics_url, 'kvmesh_router_worker_readmissions_total{model="tiny"}') == 1

        wait_until(readmitted, timeout=30, what="the recovered worker readmitted")
        assert metric(metrics_url, 'kvmesh_router_ejected_workers{model="tiny"}') == 0
        after = [served_by(mesh.base_url, f"again {i}") for i in range(8)]
        assert ejected in after, after
    finally:
        mesh.stop()


@pytest.fixture
def replicas(tmp_path):
    """Two synced router replicas (round-robin, no index), two slow mockers, and two frontends
    routing through the replicas."""
    namespace = f"q{uuid.uuid4().hex[:10]}"
    env = mesh_env(namespace)
    mockers = [mocker(f"mocker{i}", namespace, env, "--speedup-ratio", "1", "--decode-speedup-ratio", "0.1")
               for i in range(2)]
    router_ports = [free_port() for _ in range(2)]
    metrics_ports = [free_port() for _ in range(2)]
    routers = [Proc(f"router{i}", ["kvmesh-router", "--router-mode", "round-robin", "--router-replica-sync",
                                   "--tcp-rpc-port", str(port), "--metrics-port", str(metrics_ports[i])], env)
               for i, port in enumerate(router_ports)]
    frontend_ports = [free_port() for _ in range(2)]
    frontends = [Proc(f"frontend{i}", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                                       "--use-remote-router", "on"], env)
                 for i, port in enumerate(frontend_ports)]
    mesh = Mesh(f"http://127.0.0.1:{frontend_ports[0]}", [*mockers, *routers, *frontends], namespace)
    mesh.routers = routers
    mesh.frontends = frontends
    mesh.frontend_urls = [f"http://127.0.0.1:{p}" for p in frontend_ports]
    mesh.router_addrs = [f"127.0.0.1:{p}" for p in router_ports]
    mesh.router_metrics = [f"http://127.0.0.1:{p}/metrics" for p in metrics_ports]
    try:
        for url in mesh.frontend_urls:
            wait_ready(url, "tiny", 2, mesh.procs)
            wait_until(lambda u=url: served_by(u, "ping") is not None, what="frontend routing remotely")
        yield mesh
    except BaseException:
        mesh.print_logs()
        raise
    finally:
        mesh.stop()


def tracked(mesh, replica):
    return metric(mesh.router_metrics[replica], 'kvmesh_router_tracked_requests{model="tiny"}') or 0


def start_streams(url, count, max_tokens=1000):
    """Starts `count` long streamed completions in threads; returns the threads' results list."""
    results = []

    def one(i):
        results.append(stream_completion(url, f"long {i}", max_tokens))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    return results


def test_a_killed_frontends_routings_are_released(replicas):
    """Frontend 1 routes 8 long streams through the replicas and is SIGKILLed: the replicas
    release what they routed for it once its lease is gone, not after the 300 s expiry."""
    start_streams(replicas.frontend_urls[1], 8)
    wait_until(lambda: tracked(replicas, 0) >= 8 and tracked(replicas, 1) >= 8, timeout=30,
               what="both replicas tracking the streams")
    replicas.frontends[1].kill(signal.SIGKILL)
    began = time.monotonic()
    wait_until(lambda: tracked(replicas, 0) == 0 and tracked(replicas, 1) == 0, timeout=LEASE_RELEASE_LIMIT,
               what="the killed frontend's routings released")
    print(f"released {time.monotonic() - began:.1f} s after the kill")
    # The surviving frontend serves on.
    assert served_by(replicas.frontend_urls[0], "still here") is not None


def generate_on(addr, count, max_tokens=1000):
    """Starts `count` Router.Generate streams on one replica; returns (results, threads)."""
    pb = proto_stubs()
    results = []

    def one(i):
        channel = grpc.insecure_channel(addr)
        client = pb["router_pb2_grpc"].RouterStub(channel)
        request = pb["llm_pb2"].GenerateRequest(
            request_id=uuid.uuid4().hex, model="tiny", token_ids=[5 + i] * 40,
            stop=pb["llm_pb2"].StopConditions(max_tokens=max_tokens, ignore_eos=True))
        try:
            results.append(sum(len(r.token_ids) for r in client.Generate(
                pb["router_pb2"].RoutedGenerateRequest(request=request), timeout=120)))
        except grpc.RpcError as e:
            results.append(e.code())
        finally:
            channel.close()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    return results, threads


def test_a_killed_router_replicas_synced_load_is_released(replicas):
    """Replica 0 proxies 8 long Router.Generate streams; replica 1 mirrors their load through
    replica sync. Replica 0 is SIGKILLed: its own streams end with it (their clients see
    UNAVAILABLE: documented in docs/routing.md, "Replica sync"), and replica 1 drops the load it
    had synced from it within the lease TTL. Requests through the frontends keep succeeding."""
    results, threads = generate_on(replicas.router_addrs[0], 8)
    wait_until(lambda: tracked(replicas, 1) >= 8, timeout=30, what="replica 1 mirroring the streams")
    replicas.routers[0].kill(signal.SIGKILL)
    began = time.monotonic()
    wait_until(lambda: tracked(replicas, 1) == 0, timeout=LEASE_RELEASE_LIMIT,
               what="the dead replica's synced load released")
    print(f"released {time.monotonic() - began:.1f} s after the kill")
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 8 and all(r == grpc.StatusCode.UNAVAILABLE for r in results), results
    for i in range(6):
        assert served_by(replicas.frontend_urls[0], f"after the kill {i}") is not None
    # A request's load is released when the replica's stream task ends, just after the client
    # read its last byte: allow that moment, not a leak.
    wait_until(lambda: tracked(replicas, 1) == 0, timeout=5, what="the survivors' own requests released")


def test_an_indexer_restarted_past_retention_converges_to_its_peer():
    """Two replicas of one shard on a stream that keeps messages for 2 s. Replica 1 is killed,
    events keep flowing for longer than the retention, and it is restarted: it loads replica 0's
    snapshot (the events it missed are gone from the stream) and ends with the same digest."""
    namespace = f"x{uuid.uuid4().hex[:10]}"
    env = mesh_env(namespace, DYN_NATS_STREAM_MAX_AGE="2")
    ports = [free_port() for _ in range(2)]
    indexers = [Proc(f"indexer{i}", ["kvmesh-indexer", "--tcp-rpc-port", str(p)], env) for i, p in enumerate(ports)]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    worker = mocker("mocker0", namespace, env, "--speedup-ratio", "100")
    port = free_port()
    frontend = Proc("frontend", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                                 "--router-mode", "round-robin"], env)
    mesh = Mesh(f"http://127.0.0.1:{port}", [*indexers, worker, frontend], namespace)
    serving = 1  # IndexerState.SERVING

    def complete(tag, n):
        for i in range(n):
            served_by(mesh.base_url, f"{tag} {i} " + "lorem ipsum " * 20)

    def equal():
        a, b = digests(addrs[0]), digests(addrs[1])
        return a[0] == serving and a == b and a[1]

    try:
        wait_ready(mesh.base_url, "tiny", 1, mesh.procs)
        complete("before", 10)
        wait_until(equal, timeout=30, what="both replicas indexing the same blocks")
        indexers[1].kill(signal.SIGKILL)
        deadline = time.monotonic() + 4
        n = 0
        while time.monotonic() < deadline:
            complete(f"while down {n}", 2)
            n += 1
        time.sleep(2.5)  # everything published before the restart has aged out of the stream
        indexers[1] = Proc("indexer1b", ["kvmesh-indexer", "--tcp-rpc-port", str(ports[1])], env)
        mesh.procs.append(indexers[1])
        wait_until(equal, timeout=30, what="the restarted replica converging to its peer")
        complete("after", 5)
        wait_until(equal, timeout=30, what="both replicas following the stream")
        assert digests(addrs[0])[1]["tiny"][1] > 0
    except BaseException:
        mesh.print_logs()
        raise
    finally:
        mesh.stop()
