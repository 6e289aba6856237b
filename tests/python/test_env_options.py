"""Dynamo's environment-only frontend options act, not just parse: DYN_ENABLE_FORCE_INCLUDE_USAGE
ends every stream with usage, DYN_METRICS_<SERIES>_{MIN,MAX,COUNT} lay out the histogram
buckets, and DYN_TCP_MAX_MESSAGE_SIZE bounds the messages of the internal gRPC between the
frontend and mock workers running as separate processes (real etcd and NATS)."""
import json
import re

import pytest
import requests

from conftest import Proc, free_port, start_distributed
from test_admission import start_up as start_kvmesh_up


def start_up(name, env):
    return start_kvmesh_up(name, ["--speedup-ratio", "100"], env, workers=1)


@pytest.fixture(scope="module")
def tuned():
    mesh = start_up("up-env", {
        "DYN_ENABLE_FORCE_INCLUDE_USAGE": "1",
        "DYN_METRICS_TTFT_MIN": "0.01", "DYN_METRICS_TTFT_MAX": "10", "DYN_METRICS_TTFT_COUNT": "4",
        "DYN_METRICS_OUTPUT_SEQUENCE_COUNT": "3",
    })
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module")
def plain():
    mesh = start_up("up-plain", {})
    yield mesh
    mesh.stop()


def stream_events(mesh, path, body):
    r = requests.post(f"{mesh.base_url}{path}", json={"model": "tiny", "stream": True, **body},
                      stream=True, timeout=60)
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
            if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]}),
    ("/v1/completions", {"prompt": "hello"}),
])
def test_forced_usage_ends_every_stream_with_usage(tuned, plain, path, body):
    body = {**body, "max_tokens": 5, "ignore_eos": True}
    forced = stream_events(tuned, path, body)
    assert forced[-1]["usage"]["completion_tokens"] == 5, forced[-1]
    assert forced[-1]["choices"] == []
    assert all(event.get("usage") is None for event in forced[:-1])
    # Without the variable a stream that did not ask for usage carries none.
    unforced = stream_events(plain, path, body)
    assert all(event.get("usage") is None for event in unforced)
    # A request that asks keeps getting exactly one usage chunk either way.
    asked = stream_events(tuned, path, {**body, "stream_options": {"include_usage": True}})
    assert sum(1 for event in asked if event.get("usage")) == 1


def bucket_bounds(mesh, series):
    text = requests.get(f"{mesh.base_url}/metrics", timeout=10).text
    return sorted({float(le) for le in re.findall(rf'^{series}_bucket{{[^}}]*le="([^"+]+)"', text, re.M)})


def test_metric_variables_lay_out_the_buckets(tuned, plain):
    r = requests.post(f"{tuned.base_url}/v1/completions",
                      json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200
    requests.post(f"{plain.base_url}/v1/completions",
                  json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, timeout=30)
    ttft = bucket_bounds(tuned, "dynamo_frontend_time_to_first_token_seconds")
    assert ttft == pytest.approx([0.01, 0.1, 1.0, 10.0])
    assert len(bucket_bounds(tuned, "dynamo_frontend_output_sequence_tokens")) == 3
    # Series the variables do not name keep the built-in layout, as does a process without them.
    default_itl = bucket_bounds(plain, "dynamo_frontend_inter_token_latency_seconds")
    assert len(default_itl) == 18
    assert bucket_bounds(plain, "dynamo_frontend_time_to_first_token_seconds") == default_itl


def test_a_bad_bucket_variable_stops_the_frontend_naming_it():
    proc = Proc("bad-buckets", ["kvmesh-frontend", "--http-port", str(free_port())],
                {"DYN_METRICS_ITL_COUNT": "many", "DYN_DISCOVERY_BACKEND": "file"})
    proc.proc.wait(timeout=20)
    assert proc.proc.returncode == 2
    assert "DYN_METRICS_ITL_COUNT" in proc.output()


def test_internal_messages_are_bounded_by_the_tcp_message_size():
    # 4 KiB between processes: a short prompt fits, ~3 000 token ids (well over 4 KiB of
    # protobuf) do not, and the frontend answers 413 naming the limit instead of
    # breaking the stream.
    mesh = start_distributed("etcd", extra_env={"DYN_TCP_MAX_MESSAGE_SIZE": "4096"}, num_workers=1)
    try:
        url = f"{mesh.base_url}/v1/completions"
        ok = requests.post(url, json={"model": "tiny", "prompt": list(range(10, 60)), "max_tokens": 2},
                           timeout=30)
        assert ok.status_code == 200, ok.text
        big = requests.post(url, json={"model": "tiny", "prompt": [200 + i % 2700 for i in range(3000)], "max_tokens": 2},
                            timeout=30)
        assert big.status_code == 413, big.text
        assert "DYN_TCP_MAX_MESSAGE_SIZE" in big.json()["error"]["message"]
        assert all(p.alive() for p in mesh.procs)
    finally:
        mesh.stop()
    # The default (32 MiB) carries the same request.
    mesh = start_distributed("etcd", num_workers=1)
    try:
        r = requests.post(f"{mesh.base_url}/v1/completions",
                          json={"model": "tiny", "prompt": [200 + i % 2700 for i in range(3000)], "max_tokens": 2},
                          timeout=30)
        assert r.status_code == 200, r.text
    finally:
        mesh.stop()
