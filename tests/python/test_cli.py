"""Start-up behaviour of the real binaries: invalid configuration, --dump-config-to, graceful
shutdown with in-flight requests."""
import json
import os
import signal
import subprocess
import tempfile
import threading
import time

import requests

from conftest import BIN_DIR, Proc, free_port, wait_ready, wait_until


def run_bin(args, env=None, timeout=20):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([str(BIN_DIR / args[0]), *args[1:]], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def test_invalid_values_stop_startup_naming_the_flag():
    r = run_bin(["kvmesh-frontend", "--http-port", "notaport"])
    assert r.returncode == 2 and "--http-port" in r.stderr
    r = run_bin(["kvmesh-frontend", "--discovery-backend", "mem"], env={"DYN_HTTP_PORT": "99999"})
    assert r.returncode == 2 and "--http-port" in r.stderr
    r = run_bin(["kvmesh-frontend", "--request-plane", "nats"])
    assert r.returncode == 2 and "--request-plane" in r.stderr
    r = run_bin(["kvmesh", "up", "--router-mode", "nope"])
    assert r.returncode == 2 and "--router-mode" in r.stderr
    r = run_bin(["kvmesh-frontend", "--router-temperature", "-1"])
    assert r.returncode == 2 and "--router-temperature" in r.stderr
    r = run_bin(["kvmesh-mocker", "--model-path", "x", "--speedup-ratio", "-1"])
    assert r.returncode == 2 and "--speedup-ratio" in r.stderr
    r = run_bin(["kvmesh-frontend", "--no-such-flag"])
    assert r.returncode == 2


def test_dump_config_records_values_and_sources():
    out = os.path.join(tempfile.mkdtemp(), "config.json")
    port = free_port()
    proc = Proc("dump", ["kvmesh", "up", "--http-host", "127.0.0.1", "--http-port", str(port),
                         "--dump-config-to", out, "--num-workers", "1"],
                {"DYN_ROUTER_MODE": "random"})
    try:
        wait_until(lambda: os.path.exists(out) and os.path.getsize(out) > 0, timeout=20, what="config dump")
        config = json.load(open(out))
        assert config["http-port"] == {"value": str(port), "source": "cli", "env": "DYN_HTTP_PORT"}
        assert config["router-mode"]["value"] == "random" and config["router-mode"]["source"] == "env"
        assert config["discovery-backend"]["value"] == "mem"
        assert config["num-workers"]["value"] == "1"
        assert config["kv-partitions"]["source"] == "default"
        # Start-up continues after the dump.
        wait_ready(f"http://127.0.0.1:{port}", "tiny", 1, [proc])
    finally:
        proc.kill()


def test_sigterm_drains_in_flight_requests_then_exits():
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = Proc("drain", ["kvmesh", "up", "--http-host", "127.0.0.1", "--http-port", str(port),
                          "--num-workers", "1", "--speedup-ratio", "1"],
                {"DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS": "30"})
    try:
        wait_ready(base, "tiny", 1, [proc])
        result = {}

        def long_request():
            r = requests.post(f"{base}/v1/chat/completions", timeout=60, json={
                "model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 150})
            result["status"] = r.status_code
            result["body"] = r.json()

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(0.5)
        proc.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        # New work is refused while draining.
        try:
            r = requests.post(f"{base}/v1/chat/completions", timeout=10, json={
                "model": "tiny", "messages": [{"role": "user", "content": "y"}], "max_tokens": 2})
            assert r.status_code == 503, r.text
        except requests.ConnectionError:
            pass
        t.join(timeout=60)
        assert result.get("status") == 200, result
        assert result["body"]["usage"]["completion_tokens"] == 150
        assert proc.proc.wait(timeout=30) == 0
    finally:
        proc.kill()
