"""Tool calls through the official openai SDK against `kvmesh up --dyn-tool-call-parser X`: the
mock engine writes calls in the parser's syntax, the frontend reads them out of the output
(unary `message.tool_calls`, streamed `delta.tool_calls`) with `finish_reason: "tool_calls"`.
Each parser's syntax, split at every boundary, is covered by the kvmesh-llm unit tests."""
import json

import jsonschema
import openai
import pytest

from test_admission import start_up

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "unit"],
}
TIME_SCHEMA = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER_SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time", "parameters": TIME_SCHEMA}},
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
PARSERS = ["hermes", "llama3_json", "mistral", "pythonic", "deepseek_v3"]


def ask(text):
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module", params=PARSERS)
def parser_mesh(request):
    mesh = start_up(f"up-{request.param}", ["--dyn-tool-call-parser", request.param, "--speedup-ratio", "100"], workers=1)
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module")
def hermes_mesh():
    mesh = start_up("up-hermes", ["--dyn-tool-call-parser", "hermes", "--speedup-ratio", "100"], workers=1)
    yield mesh
    mesh.stop()


def chat(mesh, **kwargs):
    args = dict(model="tiny", messages=ask("What is the weather in Paris?"), tools=TOOLS, max_tokens=200)
    args.update(kwargs)
    return mesh.client().chat.completions.create(**args)


def assert_valid_calls(tool_calls, names):
    assert [c.function.name for c in tool_calls] == names
    assert len({c.id for c in tool_calls}) == len(tool_calls)
    for call in tool_calls:
        assert call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_forced_call_unary_and_streamed_in_every_syntax(parser_mesh):
    forced = {"type": "function", "function": {"name": "get_weather"}}
    # Greedy, so the stream below draws the same arguments as this unary call.
    resp = chat(parser_mesh, tool_choice=forced, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert_valid_calls(choice.message.tool_calls, ["get_weather"])
    # The SDK's stream helper reassembles the streamed fragments into the same call.
    with parser_mesh.client().chat.completions.stream(
            model="tiny", messages=ask("What is the weather in Paris?"), tools=TOOLS, max_tokens=200,
            tool_choice=forced, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    streamed = final.choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert not streamed.message.content
    assert_valid_calls(streamed.message.tool_calls, ["get_weather"])
    assert streamed.message.tool_calls[0].function.arguments == choice.message.tool_calls[0].function.arguments
    # No half-written call marker ever went out as content.
    assert not any(e.type == "content.delta" and e.delta for e in events)


def test_required_calls_a_tool_and_auto_follows_the_question(hermes_mesh):
    required = chat(hermes_mesh, messages=ask("Hello there."), tool_choice="required").choices[0]
    assert required.finish_reason == "tool_calls"
    assert_valid_calls(required.message.tool_calls, ["get_weather"])
    asked = chat(hermes_mesh, messages=ask("Please call get_time for Tokyo.")).choices[0]
    assert_valid_calls(asked.message.tool_calls, ["get_time"])
    plain = chat(hermes_mesh, messages=ask("Tell me a story.")).choices[0]
    assert plain.finish_reason in ("stop", "length")
    assert plain.message.tool_calls is None and plain.message.content


def test_required_streams_a_call_the_sdk_reassembles(hermes_mesh):
    """tool_choice "required" with a question that names no tool, streamed: the SDK's stream
    helper rebuilds the same call as the unary answer from the delta.tool_calls fragments, and no
    text goes out as content."""
    args = dict(model="tiny", messages=ask("Hello there."), tools=TOOLS, max_tokens=200,
                tool_choice="required", temperature=0)
    unary = hermes_mesh.client().chat.completions.create(**args).choices[0]
    assert_valid_calls(unary.message.tool_calls, ["get_weather"])
    with hermes_mesh.client().chat.completions.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    streamed = final.choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert not streamed.message.content
    assert_valid_calls(streamed.message.tool_calls, ["get_weather"])
    assert streamed.message.tool_calls[0].function.arguments == unary.message.tool_calls[0].function.arguments
    assert any(e.type == "tool_calls.function.arguments.done" for e in events)
    assert not any(e.type == "content.delta" and e.delta for e in events)


def test_a_parallel_pair_and_parallel_tool_calls_false(hermes_mesh):
    question = ask("Use get_weather for Paris and get_time for Paris.")
    pair = chat(hermes_mesh, messages=question).choices[0]
    assert_valid_calls(pair.message.tool_calls, ["get_weather", "get_time"])
    stream = chat(hermes_mesh, messages=question, stream=True)
    calls = {}
    for chunk in stream:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "get_time"]
    for entry in calls.values():
        jsonschema.validate(json.loads(entry["arguments"]), SCHEMAS[entry["name"]])
    single = chat(hermes_mesh, messages=question, parallel_tool_calls=False).choices[0]
    assert_valid_calls(single.message.tool_calls, ["get_weather"])


def test_tool_choice_none_answers_in_text_without_the_tools_in_the_prompt(hermes_mesh):
    question = ask("Use get_weather for Paris.")
    auto = chat(hermes_mesh, messages=question)
    none = chat(hermes_mesh, messages=question, tool_choice="none")
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content
    no_tools = hermes_mesh.client().chat.completions.create(model="tiny", messages=question, max_tokens=200)
    assert none.usage.prompt_tokens == no_tools.usage.prompt_tokens < auto.usage.prompt_tokens


def test_without_the_exclude_flag_tool_choice_none_keeps_the_tools_in_the_prompt():
    mesh = start_up("up-keep-tools", ["--dyn-tool-call-parser", "hermes", "--speedup-ratio", "100",
                                      "--no-exclude-tools-when-tool-choice-none"], workers=1)
    try:
        question = ask("Use get_weather for Paris.")
        auto = chat(mesh, messages=question)
        none = chat(mesh, messages=question, tool_choice="none")
        assert none.usage.prompt_tokens == auto.usage.prompt_tokens
        assert none.choices[0].message.tool_calls is None
    finally:
        mesh.stop()


def test_a_bad_tool_choice_is_a_400_naming_it(hermes_mesh):
    with pytest.raises(openai.BadRequestError) as err:
        chat(hermes_mesh, tool_choice={"type": "function", "function": {"name": "missing"}})
    assert err.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as err:
        chat(hermes_mesh, tools=None, tool_choice="required")
    assert err.value.body["param"] == "tool_choice"


def test_a_conversation_continues_after_the_tool_result(hermes_mesh):
    first = chat(hermes_mesh, tool_choice="required").choices[0].message
    call = first.tool_calls[0]
    messages = ask("What is the weather in Paris?") + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    answer = chat(hermes_mesh, messages=messages).choices[0]
    assert answer.message.tool_calls is None and answer.message.content


def test_legacy_functions_and_function_call_are_read_as_tools(hermes_mesh):
    """The deprecated `functions`/`function_call` spelling: the answer still comes as tool_calls."""
    functions = [tool["function"] for tool in TOOLS]
    client = hermes_mesh.client()
    forced = client.chat.completions.create(model="tiny", messages=ask("Hello there."), max_tokens=200,
                                            functions=functions, function_call={"name": "get_time"}).choices[0]
    assert forced.finish_reason == "tool_calls"
    assert_valid_calls(forced.message.tool_calls, ["get_time"])
    asked = client.chat.completions.create(model="tiny", messages=ask("What is the weather in Paris? Use get_weather."),
                                           max_tokens=200, functions=functions).choices[0]
    assert_valid_calls(asked.message.tool_calls, ["get_weather"])
    none = client.chat.completions.create(model="tiny", messages=ask("Use get_weather for Paris."), max_tokens=200,
                                          functions=functions, function_call="none").choices[0]
    assert none.message.tool_calls is None and none.message.content
    with pytest.raises(openai.BadRequestError) as err:
        chat(hermes_mesh, functions=functions)
    assert err.value.body["param"] == "functions"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=ask("x"), functions=functions,
                                       function_call="required")
    assert err.value.body["param"] == "function_call"
