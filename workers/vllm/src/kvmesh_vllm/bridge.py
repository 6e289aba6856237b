"""Starts `kvmesh-kv-bridge` for this worker: vLLM's ZMQ KV events into the mesh's index.

vLLM publishes its KV cache events on a ZMQ PUB socket it binds (an `ipc://` endpoint in a
directory private to this worker); the bridge subscribes, maps vLLM's block hashes onto the
mesh's (docs/kv-events.md) and publishes them for this worker id. The bridge gets this process's
pid (`--parent-pid`) and has the kernel kill it when this process dies, so a SIGKILLed worker
leaves no bridge behind. (Not a `preexec_fn`: forking with Python code to run in the child is not
safe once gRPC and vLLM have started their threads.)
"""
import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)


def find_bridge(explicit: str | None) -> str:
    """`--kv-bridge-bin`, else `kvmesh-kv-bridge` on PATH."""
    candidate = explicit or shutil.which("kvmesh-kv-bridge")
    if not candidate or not os.access(candidate, os.X_OK):
        raise SystemExit("kvmesh-kv-bridge not found: put it on PATH or pass --kv-bridge-bin "
                         "(or --no-kv-events to publish no KV events)")
    return candidate


class KvBridge:
    """The bridge process of one worker."""

    def __init__(self, binary: str, run_dir: Path):
        self.binary = binary
        self.endpoint = f"ipc://{run_dir}/kv-events.sock"
        self.replay_endpoint = f"ipc://{run_dir}/kv-replay.sock"
        self.topic = "kv-events"
        self.proc: subprocess.Popen | None = None

    def events_config(self) -> dict:
        """vLLM's `--kv-events-config` that makes the engine publish where the bridge reads."""
        return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.endpoint,
                "replay_endpoint": self.replay_endpoint, "topic": self.topic}

    def start(self, worker_id: int, namespace: str, model: str, block_size: int, env: dict) -> None:
        args = [self.binary, "--worker-id", str(worker_id), "--namespace", namespace,
                "--model-name", model, "--block-size", str(block_size),
                "--zmq-endpoint", self.endpoint, "--zmq-replay-endpoint", self.replay_endpoint,
                "--zmq-topic", self.topic, "--parent-pid", str(os.getpid())]
        # Started from the main thread, which lives as long as the process: the kernel's
        # parent-death signal follows the thread that started the child.
        self.proc = subprocess.Popen(args, env=env)
        log.info("kv bridge started (pid %d) for worker %x", self.proc.pid, worker_id)

    def check(self) -> None:
        """Raises when the bridge exited: the worker's KV events would silently stop."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"kvmesh-kv-bridge exited with status {self.proc.returncode}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
