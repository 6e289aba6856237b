"""Fault drills of the discovery and event planes on real processes, with a private etcd and NATS
each test starts, kills and restarts (docs/security.md, "Faults the mesh rides out").

- etcd restarted empty (every lease lost) under load: every process keeps serving, /health says
  degraded while the registrations are lost, then healthy again with the same workers; no request
  fails.
- NATS down when the mesh starts: the frontend serves, /health says kv routing is degraded, and
  once NATS is up the event plane connects and /health is healthy again; NATS killed and
  restarted under load loses no request.
- One worker cut off from a live etcd (a proxy the test cuts) past its lease TTL, under load: it
  leaves routing and the index, comes back under the same id once reachable, and KV routing
  follows its new blocks again; no request fails.

After each: KV routing follows blocks stored after the fault (a prefix pinned on each worker
draws the requests that share it), and two indexer replicas beside the frontend's own index have
applied the whole stream with equal digests and no event twice.
"""
import base64
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid

import grpc
import requests

from conftest import (TINY_MODEL, Mesh, Proc, assert_prefix_follows_the_cache, free_port, indexer_status, proto_stubs,
                      wait_ready, wait_until)

BLOCK = 16
SERVING = 1  # IndexerState.SERVING


class Server:
    """etcd or nats-server on free ports, killable and restartable."""

    def __init__(self, kind):
        self.kind = kind
        self.port = free_port()
        self.peer = free_port()
        self.data = tempfile.mkdtemp(prefix=f"kvmesh-drill-{kind}-")
        self.proc = None

    @property
    def url(self):
        return f"{'http' if self.kind == 'etcd' else 'nats'}://127.0.0.1:{self.port}"

    def start(self, fresh=False):
        if fresh:
            shutil.rmtree(self.data, ignore_errors=True)
            self.data = tempfile.mkdtemp(prefix=f"kvmesh-drill-{self.kind}-")
        if self.kind == "etcd":
            peer = f"http://127.0.0.1:{self.peer}"
            args = ["etcd", "--data-dir", self.data, "--name", "drill", "--listen-client-urls", self.url,
                    "--advertise-client-urls", self.url, "--listen-peer-urls", peer,
                    "--initial-advertise-peer-urls", peer, "--initial-cluster", f"drill={peer}"]
        else:
            args = ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", self.data]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Ready before anything is started against it (a process that finds etcd refusing
        # connections at start exits: only a registration already made is kept through an outage).
        wait_until(self.ready, timeout=20, interval=0.05, what=f"{self.kind} on port {self.port}")

    def ready(self):
        assert self.proc.poll() is None, f"{self.kind} exited"
        if self.kind == "etcd":
            return requests.get(f"{self.url}/health", timeout=1).status_code == 200
        with socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return True

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        self.kill()
        shutil.rmtree(self.data, ignore_errors=True)


def start_mesh(etcd, nats, num_workers=2, wait=True, worker_etcd=None, indexers=0):
    """A kv-mode frontend (its own index, fed from the stream), `num_workers` mockers and
    `indexers` replicas of one indexer shard (`mesh.indexers`, their addresses; the frontend does
    not ask them); mocker i reaches etcd at `worker_etcd(i)` when given (a proxy the test cuts),
    else at `etcd`."""
    namespace = f"d{uuid.uuid4().hex[:10]}"
    env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": etcd.url, "NATS_SERVER": nats.url}
    port = free_port()
    frontend = Proc("frontend", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                                 "--namespace", namespace, "--router-mode", "kv"], env)
    mockers = [Proc(f"mocker{i}", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                                   "--endpoint", f"dyn://{namespace}.backend.generate", "--speedup-ratio", "100",
                                   "--block-size", str(BLOCK), "--tcp-rpc-port", str(free_port())],
                    {**env, "ETCD_ENDPOINTS": worker_etcd(i) if worker_etcd else etcd.url})
               for i in range(num_workers)]
    indexer_ports = [free_port() for _ in range(indexers)]
    replicas = [Proc(f"indexer{i}", ["kvmesh-indexer", "--tcp-rpc-port", str(p)], {**env, "DYN_NAMESPACE": namespace})
                for i, p in enumerate(indexer_ports)]
    mesh = Mesh(f"http://127.0.0.1:{port}", [frontend, *mockers, *replicas], namespace)
    mesh.indexers = [f"127.0.0.1:{p}" for p in indexer_ports]
    if wait:
        try:
            wait_ready(mesh.base_url, "tiny", num_workers, mesh.procs)
        except BaseException:
            mesh.print_logs()
            mesh.stop()
            raise
    return mesh


def etcd_keys(etcd, prefix):
    """The keys under `prefix`, through etcd's JSON gateway."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = {"key": base64.b64encode(prefix.encode()).decode(),
            "range_end": base64.b64encode(end.encode()).decode(), "keys_only": True}
    kvs = requests.post(f"{etcd.url}/v3/kv/range", json=body, timeout=5).json().get("kvs", [])
    return [base64.b64decode(kv["key"]).decode() for kv in kvs]


def health(mesh):
    r = requests.get(f"{mesh.base_url}/health", timeout=2)
    return r.status_code, r.json()


class Load:
    """Completions sent back to back from a few threads; counts outcomes."""

    def __init__(self, mesh, threads=8):
        self.mesh, self.stop_flag = mesh, threading.Event()
        self.ok, self.failed = 0, []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(threads)]

    def run(self, index):
        n = 0
        while not self.stop_flag.is_set():
            n += 1
            prompt = [10 + (index * 31 + n * 7 + j) % 200 for j in range(40)]
            try:
                r = requests.post(f"{self.mesh.base_url}/v1/completions",
                                  json={"model": "tiny", "prompt": prompt, "max_tokens": 8}, timeout=30)
                with self.lock:
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed.append((r.status_code, r.text[:200]))
            except requests.RequestException as e:
                with self.lock:
                    self.failed.append(("exception", str(e)[:200]))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=60)


def metric(mesh, name):
    text = requests.get(f"{mesh.base_url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def complete(mesh, prompt, **nvext):
    """A completion of token ids (`nvext` extras: a pin); returns the worker that served it."""
    r = requests.post(f"{mesh.base_url}/v1/completions", timeout=30, json={
        "model": "tiny", "prompt": prompt, "max_tokens": 2, "nvext": {"extra_fields": ["worker_id"], **nvext}})
    assert r.status_code == 200, r.text
    return r.json()["nvext"]["worker_id"]["decode_worker_id"]


def worker_ids(etcd, mesh):
    """The instance ids of the mesh's workers, from their discovery keys."""
    keys = etcd_keys(etcd, f"/kvmesh/{mesh.namespace}/instances/backend/")
    return [int(key.rsplit("/", 1)[1], 16) for key in keys]


def matches(addr, prompt):
    """Device blocks of `prompt` each worker holds, by the indexer replica at `addr`."""
    pb = proto_stubs()
    with grpc.insecure_channel(addr) as channel:
        answer = pb["indexer_pb2_grpc"].IndexerStub(channel).FindMatches(
            pb["indexer_pb2"].FindMatchesRequest(model="tiny", token_ids=prompt, block_size=BLOCK), timeout=5)
    return {score.worker_id: score.device_blocks for score in answer.scores if score.device_blocks}


def assert_each_prefix_follows_its_worker(mesh, workers, seed):
    """KV routing uses the blocks workers store from now on: a prefix first served (pinned) on each
    worker draws every request that shares it, whichever way the router breaks ties (without
    that worker's events a router sees no overlap and picks at random). With indexer replicas,
    each of them first shows each prefix held by its worker alone (the events went through the
    stream); without, the requests are retried for a while."""
    rng = random.Random(seed)
    prefixes = {worker: [rng.randrange(10, 250) for _ in range(4 * BLOCK)] for worker in workers}
    for worker, prefix in prefixes.items():
        assert complete(mesh, prefix + [11, 12], backend_instance_id=worker) == worker

    def routed():
        """(the worker holding the prefix, the worker chosen) for one request of each prefix."""
        return [(worker, complete(mesh, prefix + [rng.randrange(10, 250)])) for worker, prefix in prefixes.items()]

    if mesh.indexers:
        wait_until(lambda: all(matches(addr, prefix) == {worker: 4} for addr in mesh.indexers
                               for worker, prefix in prefixes.items()),
                   timeout=15, what="each replica indexing each prefix on its worker")
        time.sleep(1)  # the frontend's own index reads the same stream
    else:
        wait_until(lambda: all(held == chosen for held, chosen in routed()), timeout=10,
                   what="each prefix routed to the worker holding it")
    rounds = [routed() for _ in range(3)]
    assert all(held == chosen for requests in rounds for held, chosen in requests), rounds


def assert_indexes_agree(mesh):
    """The indexer replicas are serving, have applied the stream up to its last message and hold
    the same index (digest and block count per model), with blocks in it; none was handed an
    event twice (a consumer opened again after a fault resumes after the last message it
    delivered)."""
    def agree():
        statuses = [indexer_status(addr) for addr in mesh.indexers]
        positions = [(s.state, s.applied_seq, s.stream_last_seq) for s in statuses]
        views = [{m.model: (m.digest, m.blocks) for m in s.models} for s in statuses]
        caught_up = all(state == SERVING and applied == last for state, applied, last in positions)
        assert caught_up and views[0].get("tiny", (0, 0))[1] > 0 and all(v == views[0] for v in views), \
            (positions, views)
        return statuses

    statuses = wait_until(agree, timeout=30, what="equal digests on the indexer replicas (state, applied, last)")
    assert [s.counters["duplicates"] for s in statuses] == [0] * len(statuses), [dict(s.counters) for s in statuses]


def assert_recovered(mesh, etcd):
    """After a drill: nothing is left in flight; KV routing works (requests sharing a prefix land
    on the worker holding it, unrelated ones use both workers), on blocks stored after the fault;
    the indexer replicas hold the same index."""
    wait_until(lambda: metric(mesh, "dynamo_frontend_inflight_requests") == 0, timeout=15,
               what="no request left in flight")
    assert_prefix_follows_the_cache(mesh, BLOCK, settle=3.0, seed=11)
    assert_each_prefix_follows_its_worker(mesh, worker_ids(etcd, mesh), seed=13)
    if mesh.indexers:
        assert_indexes_agree(mesh)


def test_etcd_restored_empty_under_load_degrades_then_recovers_without_a_failed_request():
    etcd, nats = Server("etcd"), Server("nats")
    etcd.start()
    nats.start()
    mesh = None
    try:
        mesh = start_mesh(etcd, nats, indexers=2)
        assert health(mesh)[1]["status"] == "healthy"
        assert metric(mesh, "kvmesh_discovery_registered") == 1
        with Load(mesh) as load:
            time.sleep(2)
            etcd.kill()
            wait_until(lambda: health(mesh)[1]["status"] == "degraded", timeout=15, what="degraded while etcd is down")
            body = health(mesh)[1]
            assert any("discovery" in reason for reason in body["degraded"]), body
            assert metric(mesh, "kvmesh_discovery_registered") == 0
            time.sleep(3)
            etcd.start(fresh=True)  # every lease is gone: the processes must register again
            wait_until(lambda: health(mesh)[1]["status"] == "healthy", timeout=30, what="healthy again")
            time.sleep(2)
        assert load.ok > 50, load.ok
        assert not load.failed, load.failed[:5]
        status, body = health(mesh)
        assert status == 200 and body["num_instances"] == 2, body
        assert metric(mesh, "kvmesh_discovery_lease_losses_total") == 1
        for proc in mesh.procs:
            assert proc.alive(), f"{proc.name} exited:\n{proc.output()[-3000:]}"
            assert "etcd lease granted again" in proc.output(), proc.name
        listed = etcd_keys(etcd, f"/kvmesh/{mesh.namespace}/")
        assert len([k for k in listed if "/instances/backend/" in k]) == 2, listed
        assert len([k for k in listed if "/models/" in k]) == 2, listed
        assert len([k for k in listed if "/instances/indexer/" in k]) == 2, listed
        assert_recovered(mesh, etcd)
    finally:
        if mesh:
            mesh.stop()
        etcd.close()
        nats.close()


def test_nats_down_at_start_then_up_and_restarted_under_load():
    etcd, nats = Server("etcd"), Server("nats")
    etcd.start()
    mesh = None
    try:
        mesh = start_mesh(etcd, nats, wait=False, indexers=2)
        wait_ready(mesh.base_url, "tiny", 2, mesh.procs)
        status, body = health(mesh)
        assert status == 200 and body["status"] == "degraded", body
        assert any("event plane" in reason for reason in body["degraded"]), body
        assert metric(mesh, "kvmesh_event_plane_connected") == 0
        r = requests.post(f"{mesh.base_url}/v1/completions",
                          json={"model": "tiny", "prompt": [5] * 40, "max_tokens": 4}, timeout=30)
        assert r.status_code == 200, r.text
        nats.start()
        wait_until(lambda: health(mesh)[1]["status"] == "healthy", timeout=30, what="healthy once NATS is up")
        assert metric(mesh, "kvmesh_event_plane_connected") == 1
        with Load(mesh) as load:
            time.sleep(2)
            nats.kill()
            wait_until(lambda: health(mesh)[1]["status"] == "degraded", timeout=15, what="degraded without NATS")
            time.sleep(2)
            nats.start()
            wait_until(lambda: health(mesh)[1]["status"] == "healthy", timeout=30, what="healthy after the restart")
            time.sleep(2)
        assert load.ok > 50, load.ok
        assert not load.failed, load.failed[:5]
        for proc in mesh.procs:
            assert proc.alive(), f"{proc.name} exited:\n{proc.output()[-3000:]}"
        # KV routing follows the cache again and the replicas agree: every index consumer opens
        # itself again when the client reconnects (a restarted NATS can leave an ordered consumer
        # stalled).
        assert_recovered(mesh, etcd)
    finally:
        if mesh:
            mesh.stop()
        etcd.close()
        nats.close()


class Proxy:
    """A TCP proxy from a free port to `target_port` that the test can cut (every connection
    closed, new ones refused) and restore: one process's own network partition from etcd."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.is_cut = threading.Event()
        self.lock = threading.Lock()
        self.conns = []
        threading.Thread(target=self.accept, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.is_cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    @staticmethod
    def pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        self.is_cut.set()
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def restore(self):
        self.is_cut.clear()

    def close(self):
        self.cut()
        self.listener.close()


def test_a_worker_cut_off_from_etcd_past_its_lease_comes_back_and_its_kv_events_count_again():
    """Mocker 0 reaches etcd through a proxy the test cuts for longer than the lease TTL (10 s)
    but shorter than the registration grace (30 s), under load. Its records expire, so the
    frontend stops routing to it and the indexes publish a worker-removed marker; once the proxy
    is restored the worker's lease is granted again under the same id, the indexes publish a
    readmission, KV routing follows the worker's new blocks again, and the two indexer replicas
    end with equal digests. No request fails."""
    etcd, nats = Server("etcd"), Server("nats")
    etcd.start()
    nats.start()
    proxy = Proxy(etcd.port)
    mesh = None
    try:
        mesh = start_mesh(etcd, nats, worker_etcd=lambda i: proxy.url if i == 0 else etcd.url, indexers=2)
        mockers, namespace = mesh.procs[1:3], mesh.namespace
        backends = f"/kvmesh/{namespace}/instances/backend/"
        before = set(etcd_keys(etcd, backends))
        assert len(before) == 2, before
        with Load(mesh) as load:
            time.sleep(1)
            proxy.cut()
            wait_until(lambda: len(etcd_keys(etcd, backends)) == 1, timeout=25, what="mocker 0's lease expired")
            cut_off = (before - set(etcd_keys(etcd, backends))).pop()
            time.sleep(2)  # the frontend saw the removal and its index the marker
            proxy.restore()
            wait_until(lambda: set(etcd_keys(etcd, backends)) == before, timeout=30,
                       what="mocker 0 registered again under the same id")
            wait_until(lambda: health(mesh)[1].get("num_instances") == 2, timeout=15, what="routing to both")
            time.sleep(2)
        assert load.ok > 50, load.ok
        assert not load.failed, load.failed[:5]
        assert "etcd lease granted again" in mockers[0].output()
        readmitted = int(cut_off.rsplit("/", 1)[1], 16)
        # Blocks each worker stores now reach the index, the readmitted one's included.
        assert readmitted in worker_ids(etcd, mesh)
        assert_each_prefix_follows_its_worker(mesh, worker_ids(etcd, mesh), seed=17)
        assert_indexes_agree(mesh)
        for proc in mesh.procs:
            assert proc.alive(), f"{proc.name} exited:\n{proc.output()[-3000:]}"
    except BaseException:
        if mesh:
            mesh.print_logs()
        raise
    finally:
        if mesh:
            mesh.stop()
        proxy.close()
        etcd.close()
        nats.close()
