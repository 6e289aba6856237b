"""Python chat processors written for Dynamo, run unchanged by kvmesh-processor-host: real
frontend, host and mocker processes over a real etcd and NATS, driven by the openai and anthropic
SDKs."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import requests
import openai

from conftest import BIN_DIR, ROOT, complete_on, start_distributed, wait_until

PROCESSORS = ROOT / "tests" / "python" / "processors"


def python_env(extra_path=()):
    """The host's Python: this test's virtual environment and the test processors."""
    return {"VIRTUAL_ENV": sys.prefix, "PYTHONPATH": os.pathsep.join([str(PROCESSORS), *map(str, extra_path)])}


def chat(mesh, content, stream=False, **extra):
    return requests.post(f"{mesh.base_url}/v1/chat/completions", timeout=30, stream=stream, json={
        "model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 6,
        "stream": stream, **extra})


def wait_processor_ready(mesh):
    wait_until(lambda: chat(mesh, "ready?").status_code == 200, timeout=30, what="processor engine built")


def start_processor_mesh(processor, frontend_args=(), extra_path=(), **kwargs):
    mesh = start_distributed("etcd", python_env(extra_path),
                             frontend_args=("--dyn-chat-processor", processor, *frontend_args), **kwargs)
    try:
        wait_processor_ready(mesh)
    except BaseException:
        mesh.print_logs()
        mesh.stop()
        raise
    return mesh


@pytest.fixture(scope="module")
def seed_mesh():
    # The frontend starts its own processor host (no host configured).
    mesh = start_processor_mesh("seed_processor:provider", ("--enable-anthropic-api",))
    yield mesh
    mesh.stop()


def test_a_dynamo_processor_serves_chat_unary_and_streaming(seed_mesh):
    client = seed_mesh.client()
    resp = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                          max_tokens=7)
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 7 and resp.usage.prompt_tokens > 0
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=5, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 5


def test_nvext_names_the_worker_that_served_a_processor_request(seed_mesh):
    # The built-in completions path names its workers; each pinned processor request must name
    # the one it was pinned to, unary and streaming.
    workers = {complete_on(seed_mesh, [5, 6, 7 + i]) for i in range(12)}
    assert len(workers) == 2, workers
    client = seed_mesh.client()
    for worker in workers:
        nvext = {"backend_instance_id": worker, "extra_fields": ["worker_id"]}
        resp = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "who?"}],
                                              max_tokens=3, extra_body={"nvext": nvext})
        assert resp.model_extra["nvext"]["worker_id"] == {
            "prefill_worker_id": worker, "prefill_dp_rank": 0, "decode_worker_id": worker, "decode_dp_rank": 0}
        chunks = list(client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "who?"}], max_tokens=3, stream=True,
            extra_body={"nvext": nvext}))
        told = [c.model_extra["nvext"] for c in chunks if (c.model_extra or {}).get("nvext")]
        assert len(told) == 1 and told[0]["worker_id"]["decode_worker_id"] == worker, told
    # Unpinned, the worker named is one of the mesh's; without extra_fields nothing is named.
    resp = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                          extra_body={"nvext": {"extra_fields": ["worker_id"]}})
    assert resp.model_extra["nvext"]["worker_id"]["decode_worker_id"] in workers
    plain = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert not (plain.model_extra or {}).get("nvext")


def test_responses_and_messages_go_through_the_processor(seed_mesh):
    client = seed_mesh.client()
    response = client.responses.create(model="tiny", input="hello there", max_output_tokens=5)
    assert response.output_text and response.usage.output_tokens == 5
    import anthropic
    claude = anthropic.Anthropic(base_url=seed_mesh.base_url, api_key="unused", max_retries=0)
    message = claude.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].text and message.usage.output_tokens == 4
    assert message.stop_reason == "max_tokens"
    with claude.messages.stream(model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hey"}]) as s:
        streamed = "".join(s.text_stream)
    assert streamed


def test_completions_keep_the_built_in_path_and_chat_needs_a_live_host(seed_mesh):
    # Completions never reach the processor: they still work when no host is live.
    frontend_log = seed_mesh.procs[0].output()
    assert "processor host started" in frontend_log and "processor host serving" in frontend_log, \
        "the frontend started its own processor host"
    mesh = start_distributed("etcd", python_env(),
                             frontend_args=("--dyn-chat-processor", "seed_processor:provider",
                                            "--spawn-processor-host", "false"))
    try:
        r = chat(mesh, "hello")
        assert r.status_code == 503, r.text
        assert "processor" in r.json()["error"]["message"]
        comp = mesh.client().completions.create(model="tiny", prompt="kv caches", max_tokens=3)
        assert comp.usage.completion_tokens == 3
    finally:
        mesh.stop()


def entry_point_dir():
    """A directory on PYTHONPATH that registers the seed processor as entry point `seed`."""
    root = Path(tempfile.mkdtemp(prefix="kvmesh-entry-points-"))
    info = root / "seed_processor_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: seed-processor-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dynamo.frontend.chat_processors]\nseed = seed_processor:provider\n")
    return root


def test_an_installed_entry_point_processor_runs_and_unknown_names_list_it():
    extra = entry_point_dir()
    mesh = start_processor_mesh("seed", extra_path=[extra], num_workers=1)
    try:
        resp = mesh.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                     max_tokens=3)
        assert resp.usage.completion_tokens == 3
        chunks = list(mesh.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3, stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"
        assert "".join(c.choices[0].delta.content or "" for c in chunks).strip()
    finally:
        mesh.stop()
    env = dict(os.environ, **python_env([extra]))
    failed = subprocess.run([str(BIN_DIR / "kvmesh-processor-host"), "--dyn-chat-processor", "no-such-processor",
                             "--discovery-backend", "mem"], env=env, capture_output=True, text=True, timeout=30)
    assert failed.returncode == 2
    assert "no-such-processor" in failed.stderr and "seed" in failed.stderr, failed.stderr


@pytest.fixture(scope="module")
def errors_mesh():
    # The worker's fault file is absent (no fault) unless a test writes it.
    fault_file = Path(tempfile.mkdtemp(prefix="kvmesh-processor-fault-")) / "fault"
    mesh = start_processor_mesh("errors_processor:provider", ("--enable-anthropic-api",), num_workers=1,
                                mocker_args=("--fault-file", str(fault_file)))
    mesh.fault_file = fault_file
    yield mesh
    mesh.stop()


@pytest.mark.parametrize("command,status,shown,hidden", [
    ("invalid", 400, "the request is not acceptable here", None),
    ("http418", 418, "I'm a teapot", "secret-418"),
    ("http503", 503, "Service Unavailable", "secret-503"),
    ("http529", 529, "Overloaded", "secret-529"),
    ("http502", 500, "Internal Server Error", "secret-502"),
    ("value", 400, "a value problem", None),
    ("type", 400, "a type problem", None),
    ("timeout", 504, None, None),
    ("refused", 503, None, None),
    ("connection", 503, None, None),
    ("other", 500, None, "secret-runtime"),
    ("bad-chunk", 500, None, None),
    ("routed-invalid", 400, "token_ids", None),
    ("routed-error-reraised", 503, None, None),
    ("routed-error-escapes", 503, None, None),
    ("queue", 529, None, None),
])
def test_each_row_of_the_error_table(errors_mesh, command, status, shown, hidden):
    r = chat(errors_mesh, command)
    assert r.status_code == status, r.text
    body = r.json()
    assert "error" in body
    if shown:
        assert shown in body["error"]["message"]
    if hidden:
        assert hidden not in r.text


def test_a_workers_own_error_reaches_the_client_with_the_workers_status(errors_mesh):
    # The worker fails the call itself (an internal error): the processor sees a RoutedEngineError
    # with that code, and re-raised it answers the status the code maps to, 500, not the 400 of
    # the ValueError it also is.
    errors_mesh.fault_file.write_text("fail")
    try:
        r = chat(errors_mesh, "worker-error-reraised")
    finally:
        errors_mesh.fault_file.unlink()
    assert r.status_code == 500, r.text
    assert r.headers.get("x-routed-error-code") == "internal", (r.headers, r.text)
    assert chat(errors_mesh, "hello").status_code == 200, "the worker serves again without its fault"


def test_a_processor_sets_a_header_on_a_unary_response(errors_mesh):
    r = chat(errors_mesh, "header")
    assert r.status_code == 200
    assert r.headers.get("x-processor") == "yes"
    assert r.json()["choices"][0]["message"]["content"] == "header=True late=False"
    refused = chat(errors_mesh, "header-then-raise")
    assert refused.status_code == 400 and refused.headers.get("x-processor") == "yes"
    reserved = chat(errors_mesh, "header-reserved")
    assert reserved.status_code == 400 and "HTTP layer" in reserved.json()["error"]["message"]
    invalid = chat(errors_mesh, "header-invalid")
    assert invalid.status_code == 400 and "x-processor" not in invalid.headers, invalid.text


def test_responses_and_messages_never_carry_a_processors_header(errors_mesh):
    r = requests.post(f"{errors_mesh.base_url}/v1/responses", timeout=30,
                      json={"model": "tiny", "input": "header", "max_output_tokens": 5})
    assert r.status_code == 200 and "x-processor" not in r.headers, r.text
    assert "header=False" in json.dumps(r.json()["output"])
    r = requests.post(f"{errors_mesh.base_url}/v1/messages", timeout=30, json={
        "model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "header"}]})
    assert r.status_code == 200 and "x-processor" not in r.headers, r.text
    assert "header=False" in r.json()["content"][0]["text"]


def test_a_streaming_header_needs_the_pre_commit_peek(errors_mesh):
    r = chat(errors_mesh, "header", stream=True)
    assert r.status_code == 200 and "x-processor" not in r.headers
    assert "header=False" in r.text
    mesh = start_distributed("etcd", {**python_env(), "DYN_HTTP_PRE_COMMIT_ERROR_PEEK_MS": "2000"},
                             num_workers=1, frontend_args=("--dyn-chat-processor", "errors_processor:provider"))
    try:
        wait_processor_ready(mesh)
        r = chat(mesh, "header", stream=True)
        assert r.status_code == 200 and r.headers.get("x-processor") == "yes"
        assert "header=True" in r.text and "late=False" in r.text
        # With the peek an early failure is a status, not an error event.
        assert chat(mesh, "invalid", stream=True).status_code == 400
    finally:
        mesh.stop()
    # Without it the failure comes inside the 200 stream.
    r = chat(errors_mesh, "invalid", stream=True)
    assert r.status_code == 200 and "the request is not acceptable here" in r.text


class UpMesh:
    """`kvmesh up` serving `processor` (a host it starts itself), once the engine is built."""

    def __init__(self, name, processor, extra_path=(), args=()):
        from conftest import Proc, free_port, wait_ready
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc = Proc(name, ["kvmesh", "up", "--http-host", "127.0.0.1", "--http-port", str(port),
                                "--tcp-rpc-port", str(free_port()), "--num-workers", "2",
                                "--dyn-chat-processor", processor, *args], python_env(extra_path))
        try:
            wait_ready(self.base_url, "tiny", 2, [self.proc])
            wait_processor_ready(self)
        except BaseException:
            self.proc.stop()
            raise


def test_kvmesh_up_runs_a_processor_with_one_command():
    # `kvmesh up` is one process with in-memory discovery; with a custom processor it starts the
    # host itself and both meet in a private store, which is gone when kvmesh up stops.
    mesh = UpMesh("up-processor", "errors_processor:provider", args=("--enable-anthropic-api", "--namespace", "dynamo"))
    up, base = mesh.proc, mesh.base_url
    try:
        # The processor answers: its own error and its own header, not the built-in path's.
        r = chat(mesh, "invalid")
        assert r.status_code == 400 and "the request is not acceptable here" in r.text, r.text
        r = chat(mesh, "header")
        assert r.status_code == 200 and r.headers.get("x-processor") == "yes", r.headers
        # Streaming, and Messages through the processor, on the in-process workers.
        r = chat(mesh, "hello", stream=True)
        assert r.status_code == 200 and "data: [DONE]" in r.text
        import anthropic
        claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        message = claude.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert message.usage.output_tokens == 4
        # Completions keep the built-in path.
        r = requests.post(f"{base}/v1/completions", timeout=30,
                          json={"model": "tiny", "prompt": "hello", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        store = Path(tempfile.gettempdir()) / f"kvmesh-up-{up.proc.pid}"
        assert store.is_dir()
    finally:
        up.stop()
    assert not store.exists()
    assert "processor host started" in up.output()


def test_the_readme_processor_example_runs_as_written(tmp_path):
    # README's smallest processor, copied out of README.md itself so the two cannot drift apart.
    import re
    readme = (ROOT / "README.md").read_text()
    source = re.search(r"```python\n(# my_processor\.py.*?)```", readme, re.S).group(1)
    (tmp_path / "my_processor.py").write_text(source)
    mesh = UpMesh("up-readme-processor", "my_processor:provider", extra_path=[tmp_path])
    try:
        client = openai.OpenAI(base_url=f"{mesh.base_url}/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(model="tiny", max_tokens=5,
                                                messages=[{"role": "user", "content": "hello there"}])
        assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 5
        assert answer.choices[0].message.content.strip()
        chunks = list(client.chat.completions.create(model="tiny", max_tokens=3, stream=True,
                                                     messages=[{"role": "user", "content": "hi"}]))
        assert chunks[-1].choices[0].finish_reason == "length"
        assert "".join(c.choices[0].delta.content or "" for c in chunks).strip()
    finally:
        mesh.proc.stop()
