"""The Anthropic Messages API (official `anthropic` SDK) and the OpenAI Responses API (official
`openai` SDK) against `kvmesh up --enable-anthropic-api`, plus raw SSE checks of both streams'
event order and `event:`/`type` agreement."""
import json

import anthropic
import openai
import pytest
import requests

from test_admission import start_up


@pytest.fixture(scope="module")
def mesh():
    mesh = start_up("up-anthropic", ["--enable-anthropic-api"])
    yield mesh
    mesh.stop()


def claude(mesh):
    return anthropic.Anthropic(base_url=mesh.base_url, api_key="unused", max_retries=0)


def user(text="Tell me about caches."):
    return [{"role": "user", "content": text}]


def sse_events(response):
    """(event name, data) pairs of a raw SSE body; every message must have both lines."""
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        assert "event" in lines and "data" in lines, block
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_messages_create_answers_with_usage_and_stop_reason(mesh):
    message = claude(mesh).messages.create(model="tiny", max_tokens=7, messages=user(),
                                           system="Be brief.")
    assert message.type == "message" and message.role == "assistant" and message.model == "tiny"
    assert message.id.startswith("msg_")
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert message.usage.output_tokens == 7
    assert message.usage.input_tokens > 5
    assert message.usage.cache_read_input_tokens is not None


def test_messages_stream_accumulates_to_the_unary_text(mesh):
    headers = {"x-request-id": "anthropic-fixed-1"}
    client = claude(mesh)
    unary = client.messages.create(model="tiny", max_tokens=12, messages=user(), extra_headers=headers)
    with client.messages.stream(model="tiny", max_tokens=12, messages=user(),
                                extra_headers=headers) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == unary.content[0].text
    assert final.content[0].text == streamed
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12


def test_stop_sequence_is_reported_and_not_returned(mesh):
    headers = {"x-request-id": "anthropic-fixed-2"}
    client = claude(mesh)
    full = client.messages.create(model="tiny", max_tokens=40, messages=user(),
                                  extra_headers=headers).content[0].text
    assert len(full) > 12
    stop = full[8:12]
    cut = full[: full.index(stop)]
    message = client.messages.create(model="tiny", max_tokens=40, messages=user(),
                                     stop_sequences=[stop], extra_headers=headers)
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == stop
    assert message.content[0].text == cut


def test_count_tokens_counts_the_rendered_prompt(mesh):
    client = claude(mesh)
    short = client.messages.count_tokens(model="tiny", messages=user("hi"))
    longer = client.messages.count_tokens(model="tiny", messages=user("hi there, how are the caches"),
                                          system="Be brief.")
    assert 0 < short.input_tokens < longer.input_tokens
    created = client.messages.create(model="tiny", max_tokens=1, messages=user("hi"))
    assert created.usage.input_tokens == short.input_tokens


def test_count_tokens_leaves_out_the_tools_a_none_choice_leaves_out(mesh):
    """tool_choice none drops the tools from the prompt (--exclude-tools-when-tool-choice-none,
    on by default): count_tokens must count that prompt, not one with the tools printed."""
    client = claude(mesh)
    tools = [{"name": "get_weather", "description": "The weather in a city.",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    request = dict(model="tiny", messages=user("Weather in Oslo?"), tools=tools)
    for choice in [{"type": "none"}, {"type": "auto"}]:
        counted = client.messages.count_tokens(**request, tool_choice=choice).input_tokens
        used = client.messages.create(**request, tool_choice=choice, max_tokens=1).usage.input_tokens
        assert counted == used, choice
    without_tools = client.messages.count_tokens(model="tiny", messages=user("Weather in Oslo?")).input_tokens
    assert client.messages.count_tokens(**request, tool_choice={"type": "none"}).input_tokens == without_tools
    assert client.messages.count_tokens(**request, tool_choice={"type": "auto"}).input_tokens > without_tools


def test_stop_sequences_are_not_held_to_the_limit_of_openai_stop(mesh):
    """Anthropic sets no limit on stop_sequences (OpenAI allows 4 `stop` entries); kvmesh's own
    bound is a 400 that names stop_sequences."""
    client = claude(mesh)
    stops = [f"never-{i}" for i in range(6)]
    message = client.messages.create(model="tiny", max_tokens=3, messages=user(), stop_sequences=stops)
    assert message.stop_reason == "max_tokens"
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="tiny", max_tokens=3, messages=user(),
                               stop_sequences=[f"never-{i}" for i in range(257)])
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "'stop_sequences' may hold at most 256" in err.value.body["error"]["message"]


def test_anthropic_errors_have_the_anthropic_shape(mesh):
    client = claude(mesh)
    with pytest.raises(anthropic.BadRequestError) as missing:
        # The SDK's create() insists on max_tokens itself; its generic post sends the body as is.
        client.post("/v1/messages", body={"model": "tiny", "messages": user()},
                    cast_to=anthropic.types.Message)
    assert missing.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in missing.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", max_tokens=4, messages=user())
    assert unknown.value.body["type"] == "error"
    assert unknown.value.body["error"]["type"] == "not_found_error"
    raw = requests.post(f"{mesh.base_url}/v1/messages", data=b"{not json", timeout=10,
                        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"


def test_messages_stream_event_order(mesh):
    r = requests.post(f"{mesh.base_url}/v1/messages", timeout=30, json={
        "model": "tiny", "max_tokens": 6, "messages": user(), "stream": True},
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events if name != "ping"]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"]["input_tokens"] > 0
    deltas = [data for name, data in events if name == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
    final = dict(events)["message_delta"]
    assert final["delta"]["stop_reason"] == "max_tokens" and final["usage"]["output_tokens"] == 6


def test_messages_off_without_the_flag(kvmesh_up):
    r = requests.post(f"{kvmesh_up.base_url}/v1/messages", timeout=10,
                      json={"model": "tiny", "max_tokens": 4, "messages": user()})
    assert r.status_code == 404


def responses_client(mesh):
    return openai.OpenAI(base_url=f"{mesh.base_url}/v1", api_key="unused", max_retries=0)


def test_responses_unary_and_incomplete(mesh):
    client = responses_client(mesh)
    response = client.responses.create(model="tiny", input="Tell me about caches.",
                                       instructions="Be brief.", max_output_tokens=6)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].type == "message" and response.output_text
    assert response.usage.output_tokens == 6
    assert response.usage.total_tokens == response.usage.input_tokens + 6
    plain = client.responses.create(model="tiny", input="Tell me about caches.", max_output_tokens=6)
    assert response.usage.input_tokens > plain.usage.input_tokens


def test_responses_stream_accumulates_to_the_unary_text(mesh):
    client = responses_client(mesh)
    headers = {"x-request-id": "responses-fixed-1"}
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Tell me about caches."}]}]
    unary = client.responses.create(model="tiny", input=items, max_output_tokens=10,
                                    extra_headers=headers)
    with client.responses.stream(model="tiny", input=items, max_output_tokens=10,
                                 extra_headers=headers) as stream:
        events = list(stream)
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert "".join(deltas) == unary.output_text
    # At max_output_tokens the stream ends with response.incomplete, as OpenAI's does (the
    # SDK's get_final_response() waits for response.completed only).
    final = events[-1]
    assert final.type == "response.incomplete"
    assert final.response.output_text == unary.output_text
    assert final.response.usage.output_tokens == 10


def test_responses_function_call_items_are_accepted(mesh):
    response = responses_client(mesh).responses.create(model="tiny", max_output_tokens=4, input=[
        {"role": "user", "content": "What is the weather?"},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ])
    assert response.usage.output_tokens == 4


def test_responses_refuses_state(mesh):
    with pytest.raises(openai.BadRequestError) as stateful:
        responses_client(mesh).responses.create(model="tiny", input="x", previous_response_id="resp_1")
    assert stateful.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as conversation:
        responses_client(mesh).responses.create(model="tiny", input="x", conversation="conv_1")
    assert conversation.value.body["param"] == "conversation"
    for field, value in [("background", True), ("prompt", {"id": "pmpt_1"})]:
        with pytest.raises(openai.APIStatusError) as err:
            responses_client(mesh).responses.create(model="tiny", input="x", **{field: value})
        assert err.value.status_code == 501 and f"'{field}'" in err.value.body["message"], field


def test_responses_stream_event_order(mesh):
    r = requests.post(f"{mesh.base_url}/v1/responses", timeout=30, json={
        "model": "tiny", "input": "hi", "max_output_tokens": 5, "stream": True})
    events = sse_events(r)
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert set(names[4:-4]) == {"response.output_text.delta"}
    assert "[DONE]" not in r.text
    done = dict(events)["response.output_text.done"]["text"]
    assert done == "".join(d["delta"] for n, d in events if n == "response.output_text.delta")


def test_a_failed_tool_result_is_rendered_as_an_error(mesh):
    """tool_result is_error: true puts "Error: " before the result the model reads."""
    client = claude(mesh)

    def counted(is_error):
        messages = [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                               "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": is_error,
                                          "content": "city not found"}]},
        ]
        return client.messages.count_tokens(model="tiny", messages=messages).input_tokens

    assert counted(True) > counted(False)
    plain = client.messages.count_tokens(model="tiny", messages=user("city not found")).input_tokens
    prefixed = client.messages.count_tokens(model="tiny", messages=user("Error: city not found")).input_tokens
    assert counted(True) - counted(False) == prefixed - plain
