"""Starts implementations of the `Worker` contract as real processes registered in real etcd, for
the conformance suite (worker_conformance.py) and the vLLM end-to-end tests.

- the Rust mock engine (`kvmesh-mocker`, from $KVMESH_BIN_DIR);
- the Python vLLM worker (`kvmesh-vllm-worker`, workers/vllm, in the environment whose Python is
  $KVMESH_VLLM_PYTHON: scripts/test.sh installs vLLM's CPU build there).

Both are started once per test session and shared; each lives in a namespace of its own. The
vLLM workers serve over mutual TLS (`--tcp-tls-*`, a CA made for the session): every mesh process
that talks to them (frontend, indexer, processor host) and every test channel presents a
certificate of that CA, so the Python worker and the Rust services are also tested for TLS
interoperability.
"""
import os
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import BIN_DIR, ROOT, TINY_MODEL, Proc, free_port, require_env, wait_until

# vLLM's CPU kernels need a block size that is a multiple of 32.
BLOCK_SIZE = 32
VLLM_START_TIMEOUT = 240.0


class MeshPki:
    """The session's mesh CA, a member certificate (127.0.0.1) and an outsider from another CA."""

    def __init__(self, directory: Path):
        import pki
        self.ca = pki.Ca(directory / "mesh", "kvmesh vllm mesh CA")
        self.member = self.ca.issue("vllm-mesh-member", 101)
        self.outsider = pki.Ca(directory / "other", "another CA").issue("outsider", 7)

    def mesh_env(self) -> dict:
        """`DYN_TCP_TLS_*` for a Rust mesh process: serve TLS demanding members, dial with TLS."""
        cert, key = (str(p) for p in self.member)
        return {"DYN_TCP_TLS_CERT_PATH": cert, "DYN_TCP_TLS_KEY_PATH": key,
                "DYN_TCP_TLS_CLIENT_CA_CERT_PATH": str(self.ca.pem), "DYN_TCP_TLS_CA_CERT_PATH": str(self.ca.pem),
                "DYN_TCP_TLS_CLIENT_CERT_PATH": cert, "DYN_TCP_TLS_CLIENT_KEY_PATH": key}

    def channel(self, address: str, pair=None):
        """A gRPC channel to a mesh server presenting `pair` (default: the member's)."""
        import grpc
        cert, key = pair or self.member
        credentials = grpc.ssl_channel_credentials(root_certificates=self.ca.pem.read_bytes(),
                                                   private_key=Path(key).read_bytes(),
                                                   certificate_chain=Path(cert).read_bytes())
        return grpc.secure_channel(address, credentials)


@dataclass
class RunningWorker:
    """One registered worker process and what the conformance suite needs to know of it."""

    kind: str
    namespace: str
    model: str
    address: str
    proc: object
    block_size: int
    instance_id: int = 0
    pki: MeshPki | None = None

    def channel(self):
        """A channel to the worker's gRPC server (over the mesh's TLS when it serves TLS)."""
        import grpc
        return self.pki.channel(self.address) if self.pki else grpc.insecure_channel(self.address)


def vllm_python() -> str:
    python = os.environ.get("KVMESH_VLLM_PYTHON")
    if not python or not Path(python).exists():
        pytest.fail("KVMESH_VLLM_PYTHON is not set: scripts/test.sh installs vLLM's CPU build and sets it")
    return python


def vllm_env() -> dict:
    """The environment vLLM's CPU build needs on this machine: a small KV cache, no network."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(Path(tempfile.gettempdir()) / "kvmesh-vllm-cache"),
        "OMP_NUM_THREADS": "1",
    }


class PyProc(Proc):
    """A Python console script of the vLLM environment, captured like the Rust binaries."""

    def __init__(self, name, script, args, env=None):
        self.script = str(Path(vllm_python()).parent / script)
        super().__init__(name, [self.script, *args], env)


def make_vllm_model(out: Path) -> Path:
    """A tiny random-weight model sharing models/tiny's tokenizer (kvmesh_vllm.tiny_model)."""
    if not (out / "model.safetensors").exists():
        subprocess.run([vllm_python(), "-m", "kvmesh_vllm.tiny_model", str(out), "--tokenizer-from", str(TINY_MODEL)],
                       check=True, capture_output=True, timeout=300)
    return out


def start_vllm_worker(name: str, namespace: str, model_dir: Path, mesh_pki: MeshPki, extra_env=None) -> RunningWorker:
    env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
           "NATS_SERVER": require_env("NATS_SERVER"), **vllm_env(), **(extra_env or {})}
    port = free_port()
    cert, key = mesh_pki.member
    proc = PyProc(name, "kvmesh-vllm-worker", [
        "--namespace", namespace, "--model-name", "tiny", "--tcp-rpc-port", str(port),
        "--tcp-tls-cert-path", str(cert), "--tcp-tls-key-path", str(key),
        "--tcp-tls-client-ca-cert-path", str(mesh_pki.ca.pem),
        "--kv-bridge-bin", str(BIN_DIR / "kvmesh-kv-bridge"), "--migration-limit", "3",
        "--", "--model", str(model_dir), "--max-model-len", "1024", "--block-size", str(BLOCK_SIZE),
        "--enable-prefix-caching", "--enforce-eager", "--distributed-executor-backend", "uni",
        "--num-gpu-blocks-override", "256", "--max-num-seqs", "16", "--seed", "0"], env)
    return RunningWorker("vllm", namespace, "tiny", f"127.0.0.1:{port}", proc, BLOCK_SIZE, pki=mesh_pki)


def start_mocker(name: str, namespace: str, extra_args=()) -> RunningWorker:
    env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
           "NATS_SERVER": require_env("NATS_SERVER")}
    port = free_port()
    proc = Proc(name, ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                       "--endpoint", f"dyn://{namespace}.backend.generate", "--speedup-ratio", "10",
                       "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", "256",
                       "--tcp-rpc-port", str(port), *extra_args], env)
    return RunningWorker("mocker", namespace, "tiny", f"127.0.0.1:{port}", proc, BLOCK_SIZE)


def wait_registered(workers: list[RunningWorker], timeout: float) -> None:
    """Waits until every worker's instance record is in etcd; fills in its instance id."""
    from etcd_records import instance_records

    def registered():
        for worker in workers:
            assert worker.proc.alive(), f"{worker.proc.name} exited:\n{worker.proc.output()[-4000:]}"
            if worker.instance_id:
                continue
            for record in instance_records(worker.namespace):
                if record["address"] == worker.address:
                    worker.instance_id = int(record["instance_id"])
        return all(w.instance_id for w in workers)

    wait_until(registered, timeout=timeout, interval=0.5, what="workers registered in etcd")


@pytest.fixture(scope="session")
def vllm_model():
    return make_vllm_model(Path(tempfile.gettempdir()) / f"kvmesh-tiny-vllm-{os.getpid()}")


@pytest.fixture(scope="session")
def mesh_pki():
    return MeshPki(Path(tempfile.mkdtemp(prefix="kvmesh-vllm-pki-")))


@pytest.fixture(scope="session")
def vllm_workers(vllm_model, mesh_pki):
    """Two vLLM workers in one namespace, serving mutual TLS, started once for the session."""
    namespace = f"v{uuid.uuid4().hex[:10]}"
    workers = [start_vllm_worker(f"vllm{i}", namespace, vllm_model, mesh_pki) for i in range(2)]
    try:
        wait_registered(workers, VLLM_START_TIMEOUT)
        yield workers
    finally:
        for worker in workers:
            if not worker.proc.alive() and not worker.proc.was_killed:
                print(f"--- {worker.proc.name} exited on its own ---\n{worker.proc.output()[-4000:]}")
            worker.proc.stop()


@pytest.fixture(scope="session")
def mocker_worker():
    worker = start_mocker("mocker-conformance", f"m{uuid.uuid4().hex[:10]}")
    try:
        wait_registered([worker], 60)
        yield worker
    finally:
        worker.proc.stop()
