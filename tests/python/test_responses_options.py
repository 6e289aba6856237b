"""The Responses API's output options through the official `openai` SDK against `kvmesh up
--dyn-tool-call-parser hermes`: `include: ["message.output_text.logprobs"]` and `top_logprobs` put
log probabilities on the output_text parts (unary and streamed), `max_tool_calls` caps the
function_call items, `truncation: "auto"` and the include values kvmesh cannot honour are refused,
and the response object echoes the request's tools, tool_choice and the fields accepted with no
effect."""
import openai
import pytest

from test_admission import start_up

LOGPROBS = "message.output_text.logprobs"
TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather forecast",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"type": "function", "name": "get_time", "description": "Local time",
     "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}},
]
BOTH = "Use get_weather for Paris and get_time for Paris."


@pytest.fixture(scope="module")
def mesh():
    mesh = start_up("up-responses-options", ["--dyn-tool-call-parser", "hermes", "--speedup-ratio", "100"],
                    workers=1)
    yield mesh
    mesh.stop()


def client(mesh):
    return openai.OpenAI(base_url=f"{mesh.base_url}/v1", api_key="unused", max_retries=0)


def text_part(response):
    message = next(item for item in response.output if item.type == "message")
    return message.content[0]


def test_include_logprobs_puts_one_entry_per_token_on_the_output_text(mesh):
    response = client(mesh).responses.create(model="tiny", input="Tell me about caches.", max_output_tokens=8,
                                             temperature=0, include=[LOGPROBS], top_logprobs=3)
    part = text_part(response)
    assert len(part.logprobs) == response.usage.output_tokens == 8
    for entry in part.logprobs:
        assert entry.logprob <= 0 and isinstance(entry.bytes, list)
        assert len(entry.top_logprobs) == 3
        assert all(top.logprob <= 0 for top in entry.top_logprobs)
    assert "".join(entry.token for entry in part.logprobs) == part.text
    assert response.top_logprobs == 3
    plain = client(mesh).responses.create(model="tiny", input="Tell me about caches.", max_output_tokens=8,
                                          temperature=0)
    assert text_part(plain).logprobs is None and plain.top_logprobs == 0
    # top_logprobs alone asks for them too.
    implied = client(mesh).responses.create(model="tiny", input="Tell me about caches.", max_output_tokens=8,
                                            temperature=0, top_logprobs=2)
    assert [len(entry.top_logprobs) for entry in text_part(implied).logprobs] == [2] * 8


def test_streamed_logprobs_add_up_to_the_unary_ones(mesh):
    args = dict(model="tiny", input="Tell me about caches.", max_output_tokens=10, temperature=0,
                include=[LOGPROBS], top_logprobs=1)
    unary = text_part(client(mesh).responses.create(**args))
    with client(mesh).responses.stream(**args) as stream:
        events = list(stream)
    streamed = [entry for event in events if event.type == "response.output_text.delta"
                for entry in event.logprobs]
    assert [entry.token for entry in streamed] == [entry.token for entry in unary.logprobs]
    done = next(event for event in events if event.type == "response.output_text.done")
    assert len(done.logprobs) == 10
    final = events[-1].response
    assert [entry.token for entry in text_part(final).logprobs] == [entry.token for entry in unary.logprobs]


def test_max_tool_calls_caps_the_function_call_items(mesh):
    def calls(response):
        return [item.name for item in response.output if item.type == "function_call"]

    both = client(mesh).responses.create(model="tiny", input=BOTH, tools=TOOLS, max_output_tokens=300)
    assert calls(both) == ["get_weather", "get_time"]
    capped = client(mesh).responses.create(model="tiny", input=BOTH, tools=TOOLS, max_output_tokens=300,
                                           max_tool_calls=1)
    assert calls(capped) == ["get_weather"] and capped.max_tool_calls == 1
    with client(mesh).responses.stream(model="tiny", input=BOTH, tools=TOOLS, max_output_tokens=300,
                                       max_tool_calls=1) as stream:
        events = list(stream)
    added = [event.item.name for event in events
             if event.type == "response.output_item.added" and event.item.type == "function_call"]
    assert added == ["get_weather"] and calls(events[-1].response) == ["get_weather"]


def test_the_response_echoes_tools_tool_choice_and_the_no_effect_fields(mesh):
    echoed = dict(user="u-1", service_tier="auto", safety_identifier="hashed-user", prompt_cache_key="tenant-7")
    forced = {"type": "function", "name": "get_time"}
    response = client(mesh).responses.create(model="tiny", input="What time is it?", tools=TOOLS, tool_choice=forced,
                                             max_output_tokens=200, truncation="disabled", **echoed)
    assert [tool.name for tool in response.tools] == ["get_weather", "get_time"]
    assert response.tools[0].parameters == TOOLS[0]["parameters"]
    assert response.tool_choice.type == "function" and response.tool_choice.name == "get_time"
    assert response.truncation == "disabled"
    for field, value in echoed.items():
        assert getattr(response, field) == value, field
    with client(mesh).responses.stream(model="tiny", input="hi", max_output_tokens=4, tool_choice="none",
                                       tools=TOOLS, user="u-2") as stream:
        events = list(stream)
    for event in (events[0], events[-1]):
        assert event.response.tool_choice == "none" and event.response.user == "u-2"
        assert len(event.response.tools) == 2
    plain = client(mesh).responses.create(model="tiny", input="hi", max_output_tokens=2)
    assert plain.tool_choice == "auto" and plain.tools == [] and plain.truncation == "disabled"


def test_what_kvmesh_cannot_honour_is_refused_naming_it(mesh):
    for field, value, named in [("truncation", "auto", "'truncation'")]:
        with pytest.raises(openai.APIStatusError) as err:
            client(mesh).responses.create(model="tiny", input="x", **{field: value})
        assert err.value.status_code == 501 and named in err.value.body["message"], field
    for field, value in [("include", ["message.nonsense"]), ("top_logprobs", 21), ("max_tool_calls", -1),
                         ("truncation", "sometimes")]:
        with pytest.raises(openai.BadRequestError) as err:
            client(mesh).responses.create(model="tiny", input="x", **{field: value})
        assert err.value.body["param"] == field
    # Include values for items kvmesh never produces change nothing.
    quiet = client(mesh).responses.create(model="tiny", input="hi", max_output_tokens=2,
                                          include=["web_search_call.action.sources", "file_search_call.results",
                                                   "reasoning.encrypted_content"])
    assert quiet.status == "incomplete"
