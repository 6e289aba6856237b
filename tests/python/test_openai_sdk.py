"""The official openai SDK against `kvmesh up` started from the built binary."""
import json

import openai
import pytest
import requests


def chat(mesh, **kwargs):
    args = dict(model="tiny", messages=[{"role": "user", "content": "Say something about caches."}],
                max_tokens=12)
    args.update(kwargs)
    return mesh.client().chat.completions.create(**args)


def test_models_lists_tiny(kvmesh_up):
    models = kvmesh_up.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].object == "model"


def test_chat_unary(kvmesh_up):
    resp = chat(kvmesh_up, max_tokens=12)
    assert resp.object == "chat.completion"
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert resp.usage.completion_tokens == 12
    assert resp.usage.prompt_tokens > 5
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_chat_stream_with_usage(kvmesh_up):
    stream = chat(kvmesh_up, max_tokens=10, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    content_chunks = [c for c in chunks if c.choices]
    assert content_chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in content_chunks if c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert all(c.usage is None for c in content_chunks)
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 10
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    assert text


def test_stream_and_unary_give_same_text_for_same_request_id(kvmesh_up):
    headers = {"x-request-id": "fixed-request-1"}
    unary = chat(kvmesh_up, max_tokens=16, extra_headers=headers).choices[0].message.content
    stream = chat(kvmesh_up, max_tokens=16, stream=True, extra_headers=headers)
    streamed = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    assert unary == streamed


def test_stop_string_is_not_returned(kvmesh_up):
    headers = {"x-request-id": "fixed-request-2"}
    full = chat(kvmesh_up, max_tokens=40, extra_headers=headers).choices[0].message.content
    assert len(full) > 12
    stop = full[8:12]
    cut = full[: full.index(stop)]
    resp = chat(kvmesh_up, max_tokens=40, stop=[stop], extra_headers=headers)
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.content == cut
    stream = chat(kvmesh_up, max_tokens=40, stop=stop, stream=True, extra_headers=headers)
    chunks = [c for c in stream if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completions_unary_and_stream(kvmesh_up):
    client = kvmesh_up.client()
    resp = client.completions.create(model="tiny", prompt="The cache holds", max_tokens=8)
    assert resp.object == "text_completion"
    assert resp.choices[0].text
    assert resp.usage.completion_tokens == 8
    chunks = list(client.completions.create(model="tiny", prompt="The cache holds", max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    tokens = client.completions.create(model="tiny", prompt=[1, 2, 3, 4, 5], max_tokens=4)
    assert tokens.usage.prompt_tokens == 5


def test_completions_stream_echo_usage_and_nvext(kvmesh_up):
    client = kvmesh_up.client()
    headers = {"x-request-id": "fixed-request-echo"}
    extra = {"nvext": {"extra_fields": ["worker_id"]}}
    unary = client.completions.create(model="tiny", prompt="The cache holds", max_tokens=6,
                                      extra_headers=headers)
    chunks = list(client.completions.create(model="tiny", prompt="The cache holds", max_tokens=6, echo=True,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_headers=headers, extra_body=extra))
    # The echoed prompt opens the stream, with the worker in nvext; no later chunk repeats nvext.
    assert chunks[0].choices[0].text == "The cache holds"
    assert chunks[0].model_extra["nvext"]["worker_id"]["decode_worker_id"] > 0
    assert all("nvext" not in (c.model_extra or {}) for c in chunks[1:])
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks[1:]) == unary.choices[0].text
    assert [c.choices[0].finish_reason for c in text_chunks if c.choices[0].finish_reason] == ["length"]
    assert all(c.usage is None for c in text_chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == unary.usage.prompt_tokens


def test_chat_stream_opens_with_role_and_nvext(kvmesh_up):
    stream = chat(kvmesh_up, max_tokens=4, stream=True, extra_body={"nvext": {"extra_fields": ["worker_id"]}})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].model_extra["nvext"]["worker_id"]["decode_worker_id"] > 0
    assert all("nvext" not in (c.model_extra or {}) for c in chunks[1:])
    assert chunks[-1].choices[0].finish_reason == "length"


def test_max_completion_tokens_wins(kvmesh_up):
    resp = chat(kvmesh_up, max_tokens=20, extra_body={"max_completion_tokens": 3})
    assert resp.usage.completion_tokens == 3


def test_request_id_is_echoed(kvmesh_up):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = requests.post(f"{kvmesh_up.base_url}/v1/chat/completions", json=body,
                      headers={"x-request-id": "my-request-42"})
    assert r.headers["x-request-id"] == "my-request-42"
    assert r.json()["id"] == "chatcmpl-my-request-42"
    generated = requests.post(f"{kvmesh_up.base_url}/v1/chat/completions", json=body).headers["x-request-id"]
    assert len(generated) == 36


def test_worker_id_in_nvext(kvmesh_up):
    r = requests.post(f"{kvmesh_up.base_url}/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "nvext": {"extra_fields": ["worker_id"]}})
    assert r.status_code == 200, r.text
    worker = r.json()["nvext"]["worker_id"]
    assert worker["decode_worker_id"] > 0


def post(mesh, path, data, headers=None):
    h = {"content-type": "application/json"}
    h.update(headers or {})
    return requests.post(f"{mesh.base_url}{path}", data=data, headers=h, timeout=30)


def assert_openai_error(r, status, needle):
    assert r.status_code == status, r.text
    body = r.json()
    assert needle in body["error"]["message"], body
    assert body["error"]["type"]
    assert body["message"] == body["error"]["message"]


def test_bad_input_gets_openai_errors_and_server_keeps_serving(kvmesh_up):
    m = kvmesh_up
    assert_openai_error(post(m, "/v1/chat/completions", b"{not json"), 400, "JSON")
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({"model": "tiny"})), 400, "messages")
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({"model": "tiny", "messages": "hi"})), 400,
                        "invalid type")
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({"model": "tiny", "messages": []})), 400,
                        "messages")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({**body, "max_tokens": 0})), 400, "max_tokens")
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({**body, "temperature": 3})), 400,
                        "temperature")
    # Valid but not served by this release: 501, not the client's mistake.
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({**body, "n": 2})), 501, "n = 2")
    assert_openai_error(post(m, "/v1/completions", json.dumps({"model": "tiny", "prompt": ["a", "b"]})), 501,
                        "2 prompts")
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({**body, "stop": ["a", "b", "c", "d", "e"]})),
                        400, "stop")
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({**body, "model": "nope"})), 404, "nope")
    assert post(m, "/v1/chat/completions", json.dumps({**body, "model": "nope"})).json()["error"]["code"] == \
        "model_not_found"
    assert_openai_error(post(m, "/v1/completions", json.dumps({"model": "tiny", "prompt": 5})), 400, "prompt")
    assert_openai_error(post(m, "/v1/completions", json.dumps({"model": "tiny", "prompt": [1, 4294967295]})), 400,
                        "vocabulary")
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({**body, "stop": "x" * 2000})), 400, "stop")
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({**body, "stop_token_ids": list(range(300))})),
                        400, "stop_token_ids")
    wrong_method = requests.get(f"{m.base_url}/v1/chat/completions", timeout=10)
    assert_openai_error(wrong_method, 405, "GET")
    assert "POST" in wrong_method.headers.get("allow", "")
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({**body, "max_tokens": 10_000_000})), 400,
                        "context")
    big = json.dumps({**body, "padding": "x" * (2 * 1024 * 1024)})
    assert_openai_error(post(m, "/v1/chat/completions", big), 413, "limit")
    with pytest.raises(openai.NotFoundError):
        m.client().chat.completions.create(model="missing", messages=[{"role": "user", "content": "x"}])
    # Still serving.
    assert chat(m, max_tokens=2).choices[0].message.content


def test_client_disconnect_cancels(kvmesh_up):
    with requests.post(f"{kvmesh_up.base_url}/v1/chat/completions", stream=True, timeout=30, json={
            "model": "tiny", "messages": [{"role": "user", "content": "long"}], "max_tokens": 5000,
            "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(4)]
        assert any(l.startswith(b"data: ") for l in got)

    def metric(name):
        text = requests.get(f"{kvmesh_up.base_url}/metrics").text
        for line in text.splitlines():
            if line.startswith(name) and 'model="tiny"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    from conftest import wait_until
    wait_until(lambda: metric("dynamo_frontend_disconnected_clients") >= 1, timeout=10, what="disconnect counted")
    wait_until(lambda: metric("dynamo_frontend_inflight_requests") == 0, timeout=10, what="inflight back to 0")


def test_embedded_indexer_sees_the_workers_blocks(kvmesh_up):
    import grpc
    from conftest import proto_stubs, wait_until
    stubs = proto_stubs()
    prompt = [(i * 37) % 2900 + 7 for i in range(200)]  # three full 64-token blocks
    r = requests.post(f"{kvmesh_up.base_url}/v1/completions", json={
        "model": "tiny", "prompt": prompt, "max_tokens": 2, "nvext": {"extra_fields": ["worker_id"]}})
    assert r.status_code == 200, r.text
    worker = r.json()["nvext"]["worker_id"]["decode_worker_id"]

    def answer():
        with grpc.insecure_channel(kvmesh_up.indexer_rpc) as channel:
            stub = stubs["indexer_pb2_grpc"].IndexerStub(channel)
            return stub.FindMatches(stubs["indexer_pb2"].FindMatchesRequest(model="tiny", token_ids=prompt),
                                    timeout=5)

    scores = wait_until(lambda: answer().scores or None, timeout=10, what="indexed blocks")
    assert [(s.worker_id, s.device_blocks) for s in scores] == [(worker, 3)]
    with grpc.insecure_channel(kvmesh_up.indexer_rpc) as channel:
        status = stubs["indexer_pb2_grpc"].IndexerStub(channel).Status(stubs["indexer_pb2"].StatusRequest(), timeout=5)
    assert status.state == stubs["indexer_pb2"].INDEXER_STATE_SERVING
    assert status.models[0].model == "tiny" and status.models[0].blocks >= 3


def test_failures_before_a_model_is_resolved_are_counted(kvmesh_up):
    def count(labels):
        series = "dynamo_frontend_requests_total{" + labels + "}"
        for line in requests.get(f"{kvmesh_up.base_url}/metrics", timeout=5).text.splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    unknown_validation = ('endpoint="chat_completions",error_type="validation",model="unknown",'
                          'request_type="unary",status="error"')
    unknown_not_found = ('endpoint="completions",error_type="not_found",model="unknown",'
                         'request_type="stream",status="error"')
    tiny_not_implemented = ('endpoint="chat_completions",error_type="not_implemented",model="tiny",'
                            'request_type="unary",status="error"')
    before = [count(unknown_validation), count(unknown_not_found), count(tiny_not_implemented)]
    assert post(kvmesh_up, "/v1/chat/completions", b"{not json").status_code == 400
    assert requests.post(f"{kvmesh_up.base_url}/v1/completions", timeout=10, json={
        "model": "no-such-model", "prompt": "x", "stream": True}).status_code == 404
    assert requests.post(f"{kvmesh_up.base_url}/v1/chat/completions", timeout=10, json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 2}).status_code == 501
    # A client-chosen model name never becomes a label value.
    assert "no-such-model" not in requests.get(f"{kvmesh_up.base_url}/metrics", timeout=5).text
    assert [count(unknown_validation), count(unknown_not_found), count(tiny_not_implemented)] == \
        [b + 1 for b in before]
