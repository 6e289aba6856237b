"""Reasoning and tool use across the chat, Anthropic Messages and Responses APIs, with the
official SDKs, against `kvmesh up --dyn-reasoning-parser P --dyn-tool-call-parser hermes`: the
mock engine thinks between P's markers, the frontend splits the thinking off (`reasoning_content`,
thinking blocks, reasoning items) and reads tool calls out (`tool_calls`, `tool_use` blocks,
`function_call` items)."""
import json
import shutil

import anthropic
import jsonschema
import openai
import pytest

from conftest import TINY_MODEL
from test_admission import start_up

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
}
MARKERS = ["<think>", "</think>", "<|channel|>", "<|message|>", "<|end|>"]


def ask(text="Tell me about the river town."):
    return [{"role": "user", "content": text}]


def start(name, parser, *extra):
    return start_up(name, ["--dyn-reasoning-parser", parser, "--dyn-tool-call-parser", "hermes",
                           "--enable-anthropic-api", "--speedup-ratio", "100", *extra], workers=1)


@pytest.fixture(scope="module", params=["deepseek_r1", "qwen3", "gpt_oss"])
def reasoning_mesh(request):
    mesh = start(f"up-{request.param}", request.param)
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module")
def mesh():
    mesh = start("up-r1", "deepseek_r1")
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module")
def switch_mesh(tmp_path_factory):
    """The tiny model with a hybrid reasoning model's switch in its chat template (Qwen3's):
    `enable_thinking: false` renders an empty thinking section after the generation prompt."""
    model = tmp_path_factory.mktemp("hybrid") / "tiny"
    shutil.copytree(TINY_MODEL, model)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] += ("{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking %}"
                                "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}")
    config_path.write_text(json.dumps(config))
    mesh = start("up-r1-switch", "deepseek_r1", "--model-path", str(model), "--model-name", "tiny")
    yield mesh
    mesh.stop()


def words(text):
    return text.split()


def assert_clean(text):
    assert not any(marker in text for marker in MARKERS), text


def test_reasoning_and_content_are_separated_unary_and_streamed(reasoning_mesh):
    client = reasoning_mesh.client()
    resp = client.chat.completions.create(model="tiny", messages=ask(), max_tokens=80, temperature=0)
    message = resp.choices[0].message
    reasoning = message.reasoning_content
    assert words(reasoning) and words(message.content)
    assert_clean(reasoning)
    assert_clean(message.content)
    stream = client.chat.completions.create(model="tiny", messages=ask(), max_tokens=80, temperature=0, stream=True)
    streamed_reasoning, streamed_content = "", ""
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            streamed_reasoning += getattr(delta, "reasoning_content", None) or ""
            streamed_content += delta.content or ""
    assert words(streamed_reasoning) == words(reasoning)
    assert words(streamed_content) == words(message.content)


def test_max_thinking_tokens_caps_the_thinking(mesh):
    def thinking(**extra):
        resp = mesh.client().chat.completions.create(model="tiny", messages=ask(), max_tokens=100, temperature=0,
                                                     extra_body=extra)
        return resp.choices[0].message
    free = thinking()
    capped = thinking(max_thinking_tokens=5)
    assert len(words(free.reasoning_content)) > 5
    assert len(words(capped.reasoning_content)) == 5
    assert len(words(capped.content)) > len(words(free.content))
    # Dynamo's nvext spelling caps alike; the top-level field wins over it.
    assert thinking(nvext={"max_thinking_tokens": 5}).reasoning_content == capped.reasoning_content
    assert len(words(thinking(max_thinking_tokens=3, nvext={"max_thinking_tokens": 5}).reasoning_content)) == 3


def test_reasoning_field_name_reasoning():
    mesh = start("up-reasoning-field", "deepseek_r1", "--reasoning-field-name", "reasoning")
    try:
        message = mesh.client().chat.completions.create(model="tiny", messages=ask(), max_tokens=60).choices[0].message
        assert words(message.model_extra.get("reasoning") or "")
        assert "reasoning_content" not in message.model_extra
    finally:
        mesh.stop()


def claude(mesh):
    return anthropic.Anthropic(base_url=mesh.base_url, api_key="unused", max_retries=0)


def test_anthropic_thinking_blocks_unary_and_streamed(mesh):
    message = claude(mesh).messages.create(model="tiny", max_tokens=80, messages=ask(), extra_body={"temperature": 0})
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert words(message.content[0].thinking) and words(message.content[1].text)
    with claude(mesh).messages.stream(model="tiny", max_tokens=80, messages=ask(), extra_body={"temperature": 0}) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert words(final.content[0].thinking) == words(message.content[0].thinking)
    assert words(final.content[1].text) == words(message.content[1].text)


def test_anthropic_forced_tool_use(mesh):
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
    message = claude(mesh).messages.create(model="tiny", max_tokens=200, messages=ask("Weather in Paris?"),
                                           tools=tools, tool_choice={"type": "tool", "name": "get_weather"})
    assert message.stop_reason == "tool_use"
    (block,) = [b for b in message.content if b.type == "tool_use"]
    assert block.name == "get_weather" and isinstance(block.input, dict)
    jsonschema.validate(block.input, WEATHER)
    with claude(mesh).messages.stream(model="tiny", max_tokens=200, messages=ask("Weather in Paris?"), tools=tools,
                                      tool_choice={"type": "any"}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert streamed.name == "get_weather"
    jsonschema.validate(streamed.input, WEATHER)


def test_responses_function_call_and_reasoning_items(mesh):
    client = mesh.client()
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    # Greedy, so the stream below draws the same arguments.
    resp = client.responses.create(model="tiny", input="Weather in Paris? Use get_weather.", tools=tools,
                                   max_output_tokens=200, temperature=0)
    calls = [item for item in resp.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    with client.responses.stream(model="tiny", input="Weather in Paris? Use get_weather.", tools=tools,
                                 max_output_tokens=200, temperature=0) as stream:
        final = stream.get_final_response()
    streamed = [item for item in final.output if item.type == "function_call"]
    assert [c.name for c in streamed] == ["get_weather"]
    assert streamed[0].arguments == calls[0].arguments
    thought = client.responses.create(model="tiny", input="Tell me about caches.", max_output_tokens=80, temperature=0)
    assert [item.type for item in thought.output] == ["reasoning", "message"]
    assert words(thought.output[0].content[0].text) and words(thought.output_text)
    # The output ends at max_output_tokens: the stream ends with response.incomplete, which the
    # SDK's get_final_response does not accept, so the last event is read instead.
    with client.responses.stream(model="tiny", input="Tell me about caches.", max_output_tokens=80,
                                 temperature=0) as stream:
        last = list(stream)[-1]
    assert last.type == "response.incomplete"
    assert [item.type for item in last.response.output] == ["reasoning", "message"]
    assert last.response.output[0].content[0].text == thought.output[0].content[0].text


def test_anthropic_thinking_budget_caps_the_thinking(mesh):
    def blocks(thinking):
        message = claude(mesh).messages.create(model="tiny", max_tokens=100, messages=ask(), thinking=thinking,
                                               extra_body={"temperature": 0})
        return {block.type: block for block in message.content}
    capped = blocks({"type": "enabled", "budget_tokens": 5})
    assert len(words(capped["thinking"].thinking)) == 5
    with pytest.raises(anthropic.BadRequestError) as err:
        blocks({"type": "enabled"})
    assert "budget_tokens" in err.value.body["error"]["message"]


def test_anthropic_thinking_disabled_turns_the_template_switch_off(switch_mesh):
    """thinking disabled reaches the chat template as enable_thinking false, which this template
    answers with an empty thinking section: a longer prompt, counted alike by count_tokens and by
    chat with the variable set directly; thinking enabled leaves the switch alone."""
    client = claude(switch_mesh)

    def used(**extra):
        return client.messages.create(model="tiny", max_tokens=1, messages=ask(), **extra).usage.input_tokens

    def counted(**extra):
        return client.messages.count_tokens(model="tiny", messages=ask(), **extra).input_tokens

    default = used()
    disabled = used(thinking={"type": "disabled"})
    assert disabled > default
    assert used(thinking={"type": "enabled", "budget_tokens": 5}) == default
    assert counted(thinking={"type": "disabled"}) == disabled
    assert counted() == default
    chat = switch_mesh.client().chat.completions.create(
        model="tiny", messages=ask(), max_tokens=1, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert chat.usage.prompt_tokens == disabled


def test_single_call_switches_on_anthropic_and_responses(mesh):
    """Anthropic's disable_parallel_tool_use and Responses' parallel_tool_calls both keep one call
    of a turn that names two tools; Responses echoes the value it applied."""
    question = "Use get_weather for Paris and get_time for Paris."
    time_schema = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
    anthropic_tools = [{"name": "get_weather", "input_schema": WEATHER},
                       {"name": "get_time", "input_schema": time_schema}]
    def tool_uses(choice):
        message = claude(mesh).messages.create(model="tiny", max_tokens=300, messages=ask(question),
                                               tools=anthropic_tools, tool_choice=choice)
        return [block.name for block in message.content if block.type == "tool_use"]
    assert tool_uses({"type": "auto"}) == ["get_weather", "get_time"]
    assert tool_uses({"type": "auto", "disable_parallel_tool_use": True}) == ["get_weather"]
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER},
             {"type": "function", "name": "get_time", "parameters": time_schema}]
    client = mesh.client()
    def calls(**extra):
        resp = client.responses.create(model="tiny", input=question, tools=tools, max_output_tokens=300, **extra)
        return resp, [item.name for item in resp.output if item.type == "function_call"]
    both, names = calls(metadata={"team": "cache"})
    assert names == ["get_weather", "get_time"]
    assert both.parallel_tool_calls is True and both.metadata == {"team": "cache"}
    single, names = calls(parallel_tool_calls=False)
    assert names == ["get_weather"]
    assert single.parallel_tool_calls is False and single.metadata == {}


def test_anthropic_server_tools_are_501s_naming_their_type(mesh):
    with pytest.raises(anthropic.APIStatusError) as err:
        claude(mesh).messages.create(model="tiny", max_tokens=10, messages=ask(),
                                     tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}])
    assert err.value.status_code == 501
    assert "web_search_20250305" in err.value.body["error"]["message"]
    accepted = claude(mesh).messages.create(model="tiny", max_tokens=4, messages=ask(), metadata={"user_id": "u"},
                                            service_tier="auto")
    assert accepted.usage.output_tokens == 4


def test_responses_hosted_tool_choices_are_501s_and_allowed_function_tools_filter(mesh):
    client = mesh.client()
    time_schema = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER},
             {"type": "function", "name": "get_time", "parameters": time_schema}]
    for choice in [{"type": "web_search_preview"}, {"type": "file_search"},
                   {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "mcp", "server_label": "wiki"}]}]:
        with pytest.raises(openai.APIStatusError) as err:
            client.responses.create(model="tiny", input="What time is it?", tools=tools, tool_choice=choice)
        assert err.value.status_code == 501, choice
        kind = choice["tools"][0]["type"] if choice["type"] == "allowed_tools" else choice["type"]
        assert f"'{kind}'" in err.value.body["message"]
    # A required call among the allowed tools only: get_time, though get_weather is listed first.
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]}
    resp = client.responses.create(model="tiny", input="Tell me something.", tools=tools, tool_choice=allowed,
                                   max_output_tokens=300)
    assert [item.name for item in resp.output if item.type == "function_call"] == ["get_time"]
    unfiltered = client.responses.create(model="tiny", input="Tell me something.", tools=tools,
                                         tool_choice="required", max_output_tokens=300)
    assert [item.name for item in unfiltered.output if item.type == "function_call"][0] == "get_weather"
