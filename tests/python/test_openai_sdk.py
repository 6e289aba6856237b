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
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({**body, "messages": image})), 501, "image")
    assert_openai_error(post(m, "/v1/chat/completions", json.dumps({**body, "n": 129})), 400, "n = 129")
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
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]
    assert requests.post(f"{kvmesh_up.base_url}/v1/chat/completions", timeout=10, json={
        "model": "tiny", "messages": image}).status_code == 501
    # A client-chosen model name never becomes a label value.
    assert "no-such-model" not in requests.get(f"{kvmesh_up.base_url}/metrics", timeout=5).text
    assert [count(unknown_validation), count(unknown_not_found), count(tiny_not_implemented)] == \
        [b + 1 for b in before]


def test_embeddings_shapes_determinism_and_encodings(kvmesh_up):
    import base64
    import struct

    def f32(vector):
        # JSON carries the shortest text of each f32; base64 its exact bits.
        return list(struct.unpack(f"<{len(vector)}f", struct.pack(f"<{len(vector)}f", *vector)))

    client = kvmesh_up.client()
    texts = ["the cache holds the prefix", "a different sentence", "the cache holds the prefix"]
    resp = client.embeddings.create(model="tiny", input=texts, encoding_format="float")
    assert resp.object == "list" and resp.model == "tiny"
    assert [d.index for d in resp.data] == [0, 1, 2]
    vectors = [d.embedding for d in resp.data]
    assert len({len(v) for v in vectors}) == 1 and len(vectors[0]) > 8
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]
    assert abs(sum(x * x for x in vectors[1]) - 1.0) < 1e-4
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > 0
    # The SDK asks for base64 by default and decodes it; a raw base64 answer decodes to the same
    # floats the float encoding gives.
    assert f32(client.embeddings.create(model="tiny", input=texts[0]).data[0].embedding) == f32(vectors[0])
    raw = requests.post(f"{kvmesh_up.base_url}/v1/embeddings", timeout=10, json={
        "model": "tiny", "input": texts[0], "encoding_format": "base64"}).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(packed) // 4}f", packed)) == f32(vectors[0])
    short = client.embeddings.create(model="tiny", input=texts, dimensions=16, encoding_format="float")
    assert all(len(d.embedding) == 16 for d in short.data)
    tokens = client.embeddings.create(model="tiny", input=[[5, 6, 7], [5, 6, 7]], encoding_format="float")
    assert tokens.data[0].embedding == tokens.data[1].embedding and tokens.usage.prompt_tokens == 6


def test_embeddings_reject_bad_input(kvmesh_up):
    client = kvmesh_up.client()
    for kwargs, param in [(dict(input=[]), "input"), (dict(input="x", dimensions=0), "dimensions"),
                          (dict(input="x", encoding_format="hex"), "encoding_format"),
                          (dict(input=[[10**9]]), "input")]:
        with pytest.raises(openai.BadRequestError) as error:
            client.embeddings.create(model="tiny", **kwargs)
        assert error.value.body["param"] == param, kwargs
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")


DYNAMO_SERIES = [
    "dynamo_frontend_requests_total", "dynamo_frontend_queued_requests",
    "dynamo_frontend_active_requests", "dynamo_frontend_inflight_requests",
    "dynamo_frontend_disconnected_clients", "dynamo_frontend_request_duration_seconds_count",
    "dynamo_frontend_input_sequence_tokens_count", "dynamo_frontend_output_sequence_tokens_count",
    "dynamo_frontend_output_tokens_total", "dynamo_frontend_time_to_first_token_seconds_count",
    "dynamo_frontend_inter_token_latency_seconds_count", "dynamo_frontend_cached_tokens_count",
    "dynamo_frontend_kv_hit_rate_count", "dynamo_frontend_tokenizer_latency_ms_count",
    "dynamo_frontend_model_total_kv_blocks", "dynamo_frontend_model_max_num_seqs",
    "dynamo_frontend_model_max_num_batched_tokens", "dynamo_frontend_model_context_length",
    "dynamo_frontend_model_kv_cache_block_size", "dynamo_frontend_model_migration_limit",
    "dynamo_frontend_model_cancellation_total",
    "dynamo_frontend_worker_last_time_to_first_token_seconds",
    "dynamo_frontend_worker_last_input_sequence_tokens",
    "dynamo_frontend_worker_last_inter_token_latency_seconds",
    "dynamo_frontend_router_queue_pending_requests", "dynamo_frontend_stage_duration_seconds_count",
    "dynamo_component_router_requests_total",
    "dynamo_component_router_time_to_first_token_seconds_count",
    "dynamo_component_router_inter_token_latency_seconds_count",
    "dynamo_component_router_input_sequence_tokens_count",
    "dynamo_component_router_output_sequence_tokens_count",
    "dynamo_component_router_kv_hit_rate_count",
    "dynamo_router_overhead_block_hashing_ms_count", "dynamo_router_overhead_scheduling_ms_count",
    "dynamo_router_overhead_total_ms_count", "router_active_sequence_stride_mismatches_total",
]


def series_totals(mesh):
    """Sum of every sample of each series name in /metrics."""
    totals = {}
    for line in requests.get(f"{mesh.base_url}/metrics", timeout=5).text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def test_metrics_use_dynamos_names_and_kvmesh_prefix_for_its_own(kvmesh_up):
    before = series_totals(kvmesh_up)
    chat(kvmesh_up, max_tokens=6)
    after = series_totals(kvmesh_up)
    missing = [name for name in DYNAMO_SERIES if name not in after]
    assert missing == []
    for name in ["dynamo_component_router_requests_total", "dynamo_frontend_kv_hit_rate_count",
                 "dynamo_component_router_output_sequence_tokens_count",
                 "dynamo_router_overhead_total_ms_count"]:
        assert after[name] == before.get(name, 0.0) + 1, name
    assert after["dynamo_component_router_output_sequence_tokens_sum"] - before.get(
        "dynamo_component_router_output_sequence_tokens_sum", 0.0) == 6
    assert after["dynamo_frontend_queued_requests"] == 0 and after["dynamo_frontend_active_requests"] == 0
    assert after["dynamo_frontend_worker_last_input_sequence_tokens"] > 0
    assert "kvmesh_tokenizer_prefix_cache_hits_total" in after and "kvmesh_preprocess_workers" in after
    assert not any(name.startswith("dynamo_frontend_tokenizer_prefix_cache") for name in after)
    foreign = [n for n in after if not n.startswith(("dynamo_", "kvmesh_", "router_active_sequence"))]
    assert foreign == []


def test_fields_this_release_cannot_serve_are_501s_naming_them(kvmesh_up):
    """No documented field is silently ignored: each one not served answers 501 naming it, and
    best_of below n is the client's mistake (400 naming best_of)."""
    m = kvmesh_up
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    for field, value in [("modalities", ["text", "audio"]), ("audio", {"voice": "alloy", "format": "wav"}),
                         ("prediction", {"type": "content", "content": "x"}), ("web_search_options", {})]:
        assert_openai_error(post(m, "/v1/chat/completions", json.dumps({**body, field: value})), 501, f"'{field}'")
    completion = {"model": "tiny", "prompt": "x", "max_tokens": 2}
    assert_openai_error(post(m, "/v1/completions", json.dumps({**completion, "best_of": 2})), 501, "'best_of'")
    r = post(m, "/v1/completions", json.dumps({**completion, "n": 2, "best_of": 1}))
    assert_openai_error(r, 400, "'best_of'")
    assert r.json()["error"]["param"] == "best_of"
    assert_openai_error(post(m, "/v1/completions", json.dumps({**completion, "suffix": "end"})), 501, "'suffix'")
    assert post(m, "/v1/completions", json.dumps({**completion, "n": 2, "best_of": 2})).status_code == 200


def test_fields_with_no_effect_on_generation_are_accepted(kvmesh_up):
    """docs/http-api.md lists these as accepted with no effect; the greedy answer is unchanged."""
    plain = chat(kvmesh_up, temperature=0).choices[0].message.content
    extra = {"store": True, "metadata": {"team": "cache"}, "service_tier": "auto", "prompt_cache_key": "k",
             "safety_identifier": "s", "user": "u", "verbosity": "low", "modalities": ["text"]}
    same = chat(kvmesh_up, temperature=0, extra_body=extra).choices[0].message.content
    assert same == plain


def test_nvext_greed_sampling_is_greedy_and_a_raw_prompt_is_a_501(kvmesh_up):
    greedy = chat(kvmesh_up, temperature=0, max_tokens=16).choices[0].message.content
    forced = chat(kvmesh_up, temperature=1.5, max_tokens=16, extra_body={"nvext": {"greed_sampling": True}})
    assert forced.choices[0].message.content == greedy
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    for field, value in [("use_raw_prompt", True), ("token_data", [1, 2]), ("annotations", ["query_instance_id:1"])]:
        r = post(kvmesh_up, "/v1/chat/completions", json.dumps({**body, "nvext": {field: value}}))
        assert_openai_error(r, 501, f"'nvext.{field}'")
