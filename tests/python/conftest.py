"""Fixtures that start real kvmesh processes from the built binaries.

The binaries come from $KVMESH_BIN_DIR (scripts/test.sh points it at target/debug). Tests that use
etcd and NATS read ETCD_ENDPOINTS and NATS_SERVER, which scripts/test.sh sets after starting real
servers; they fail rather than skip when those are missing.
"""
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("KVMESH_BIN_DIR", ROOT / "target" / "debug"))
TINY_MODEL = ROOT / "models" / "tiny"


_HANDED_OUT = set()


def _ephemeral_range():
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port():
    """A free port outside the kernel's ephemeral range: a port the OS picked for us (bind to 0)
    could be handed again to a process that binds port 0 itself (an embedded indexer, say)
    before the process we pass it to binds it."""
    low, _ = _ephemeral_range()
    for _ in range(200):
        port = random.randrange(10_000, max(low, 10_001))
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port below the ephemeral range")


class Proc:
    """A child process with its output captured in a log file, killed at teardown."""

    def __init__(self, name, args, env=None):
        self.name = name
        self.log = tempfile.NamedTemporaryFile(prefix=f"kvmesh-{name}-", suffix=".log", delete=False)
        full_env = dict(os.environ)
        full_env.setdefault("RUST_LOG", "info")
        full_env["NO_COLOR"] = "1"
        if env:
            full_env.update(env)
        binary = str(BIN_DIR / args[0])
        self.proc = subprocess.Popen([binary, *args[1:]], stdout=self.log, stderr=subprocess.STDOUT, env=full_env)
        self.was_killed = False

    def output(self):
        return Path(self.log.name).read_text(errors="replace")

    def alive(self):
        return self.proc.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.alive():
            self.was_killed = True
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stop(self):
        self.kill(signal.SIGTERM)


def wait_until(predicate, timeout=30.0, interval=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - polled until the deadline
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}: last={last!r}")


def wait_ready(base_url, model, num_workers, procs, timeout=60.0):
    """Waits until /health lists the model with at least num_workers instances."""
    def ready():
        for p in procs:
            assert p.alive(), f"{p.name} exited early:\n{p.output()[-3000:]}"
        r = requests.get(f"{base_url}/health", timeout=2)
        body = r.json()
        return r.status_code == 200 and model in body.get("models", []) and body.get("num_instances", 0) >= num_workers
    wait_until(ready, timeout=timeout, what=f"{num_workers} workers of {model} at {base_url}")


class Mesh:
    def __init__(self, base_url, procs, namespace=None, model="tiny"):
        self.base_url = base_url
        self.procs = procs
        self.namespace = namespace
        self.model = model

    def client(self, **kwargs):
        import openai
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, **kwargs)

    def stop(self):
        # A process that exited on its own (not one a test killed) shows its log tail, so a
        # failure caused by a crash says why in the test's captured output.
        for p in self.procs:
            if not p.alive() and not p.was_killed:
                print(f"--- {p.name} exited on its own (rc {p.proc.returncode}) ---\n{p.output()[-4000:]}")
        for p in reversed(self.procs):
            p.kill()

    def print_logs(self):
        """The tail of every process's output, for a fixture that failed to start."""
        for p in self.procs:
            print(f"--- {p.name} ---\n{p.output()[-4000:]}")


_STUBS = {}


def proto_stubs():
    """Python stubs for kvmesh's contracts, generated with grpcio-tools' bundled protoc."""
    if not _STUBS:
        import sys
        from grpc_tools import protoc
        import grpc_tools
        out_dir = Path(tempfile.mkdtemp())
        include = str(Path(grpc_tools.__file__).parent / "_proto")
        protos = ["events", "llm", "worker", "indexer", "router"]
        rc = protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"-I{include}", f"--python_out={out_dir}",
                          f"--grpc_python_out={out_dir}", *[f"kvmesh/v1/{p}.proto" for p in protos]])
        assert rc == 0
        sys.path.insert(0, str(out_dir))
        import importlib
        for p in protos:
            _STUBS[f"{p}_pb2"] = importlib.import_module(f"kvmesh.v1.{p}_pb2")
            _STUBS[f"{p}_pb2_grpc"] = importlib.import_module(f"kvmesh.v1.{p}_pb2_grpc")
    return _STUBS


def indexer_status(addr):
    """`kvmesh.v1.Indexer/Status` of the replica at `addr` (plaintext gRPC)."""
    import grpc
    pb = proto_stubs()
    with grpc.insecure_channel(addr) as channel:
        return pb["indexer_pb2_grpc"].IndexerStub(channel).Status(pb["indexer_pb2"].StatusRequest(), timeout=5)


def digests(addr):
    """A replica's state and, per model, its index digest and block count."""
    status = indexer_status(addr)
    return status.state, {m.model: (m.digest, m.blocks) for m in status.models}


def require_env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: this test needs the real server (run scripts/test.sh)")
    return value


@pytest.fixture(scope="module")
def kvmesh_up():
    port = free_port()
    rpc_port = free_port()
    proc = Proc("up", ["kvmesh", "up", "--http-host", "127.0.0.1", "--http-port", str(port), "--num-workers", "2",
                       "--speedup-ratio", "100", "--tcp-rpc-port", str(rpc_port)], {"DYN_HTTP_BODY_LIMIT_MB": "1"})
    base = f"http://127.0.0.1:{port}"
    mesh = Mesh(base, [proc])
    mesh.indexer_rpc = f"127.0.0.1:{rpc_port}"
    try:
        wait_ready(base, "tiny", 2, [proc])
        yield mesh
    finally:
        mesh.stop()


def start_distributed(backend, extra_env=None, mocker_args=(), num_workers=2, speedup="100", kserve=False,
                      frontend_args=()):
    """Frontend plus `num_workers` mocker processes sharing a fresh namespace. With `kserve` the
    frontend serves KServe gRPC on its HTTP port (`mesh.grpc`) and health and metrics on the side
    port (`mesh.base_url`)."""
    namespace = f"t{uuid.uuid4().hex[:10]}"
    env = dict(extra_env or {})
    env["DYN_DISCOVERY_BACKEND"] = backend
    if backend == "etcd":
        env["ETCD_ENDPOINTS"] = require_env("ETCD_ENDPOINTS")
    env["NATS_SERVER"] = require_env("NATS_SERVER")
    port = free_port()
    rpc_ports = [free_port() for _ in range(num_workers)]
    args = ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port), "--namespace", namespace,
            *frontend_args]
    grpc_address = None
    if kserve:
        grpc_address = f"127.0.0.1:{port}"
        port = free_port()
        args += ["--kserve-grpc-server", "--grpc-metrics-port", str(port)]
    frontend = Proc("frontend", args, env)
    mockers = [
        Proc(f"mocker{i}", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                            "--endpoint", f"dyn://{namespace}.backend.generate", "--speedup-ratio", speedup,
                            "--block-size", "16", "--tcp-rpc-port", str(rpc_ports[i]), *mocker_args], env)
        for i in range(num_workers)
    ]
    base = f"http://127.0.0.1:{port}"
    procs = [frontend, *mockers]
    mesh = Mesh(base, procs, namespace)
    mesh.worker_rpc = [f"127.0.0.1:{p}" for p in rpc_ports]
    mesh.grpc = grpc_address
    try:
        wait_ready(base, "tiny", num_workers, procs)
    except BaseException:
        mesh.print_logs()
        mesh.stop()
        raise
    return mesh


def complete_on(mesh, prompt, max_tokens=4):
    """A completion of token ids; returns the worker that served it (from nvext). A mesh with a
    `session` (TLS, API key) is called through it."""
    r = getattr(mesh, "session", requests).post(f"{mesh.base_url}/v1/completions", json={
        "model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
        "nvext": {"extra_fields": ["worker_id"]}}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["nvext"]["worker_id"]["decode_worker_id"]


def stream_usage(base_url, path, body):
    """One streamed request to `path` (OpenAI SSE); returns (completion tokens from the final
    usage, the error event or exception if any)."""
    import json
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    tokens, error = 0, None
    try:
        with requests.post(f"{base_url}{path}", json=body, stream=True, timeout=120) as r:
            if r.status_code != 200:
                return 0, f"status {r.status_code}: {r.text[:200]}"
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[len(b"data: "):])
                if "error" in event:
                    error = event["error"]
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    except requests.RequestException as e:
        error = repr(e)
    return tokens, error


def assert_prefix_follows_the_cache(mesh, block, settle=1.0, seed=7):
    """KV routing over two workers: requests sharing a 4-block prefix go to the worker that
    served the first (once its blocks reached the index), and unrelated prompts use both.
    Returns the worker holding the prefix."""
    import random
    from concurrent.futures import ThreadPoolExecutor
    prefix = [10 + (i * 7) % 200 for i in range(4 * block)]
    first = complete_on(mesh, prefix + [11, 12, 13])
    time.sleep(settle)  # the first request's blocks reach the index through the event plane
    for i in range(6):
        assert complete_on(mesh, prefix + [20 + i, 30 + i, 40 + i]) == first
    rng = random.Random(seed)
    unrelated = [[rng.randrange(10, 250) for _ in range(4 * block)] for _ in range(12)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        workers = list(pool.map(lambda p: complete_on(mesh, p, max_tokens=16), unrelated))
    assert len(set(workers)) == 2, workers
    return first


# Session-wide worker processes (the Rust mock engine and the Python vLLM worker), shared by the
# Worker conformance suite and the vLLM end-to-end tests. Imported last: worker_impls uses the
# helpers above.
from worker_impls import mesh_pki, mocker_worker, vllm_model, vllm_workers  # noqa: E402,F401
