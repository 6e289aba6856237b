"""The processor host's built-in `sglang` chat processor (`--dyn-chat-processor sglang`): SGLang's
own request model, chat-template handling and tokenizer preprocess, and SGLang's reasoning and
tool-call parsers read the output of mock workers that think (`qwen3` markers) and call tools
(`hermes` syntax). Real frontend, host and mocker processes over real etcd and NATS, the host in
the SGLang environment scripts/test.sh installs (`KVMESH_SGLANG_PYTHON`), driven by the openai
SDK. Without the package, the host refuses to start naming it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from conftest import BIN_DIR, start_distributed, wait_until
from test_processor import chat

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time",
                                      "parameters": {"type": "object", "properties": {}}}},
]


def sglang_venv() -> Path:
    python = os.environ.get("KVMESH_SGLANG_PYTHON")
    if not python or not Path(python).exists():
        pytest.fail("KVMESH_SGLANG_PYTHON is not set: scripts/test.sh installs SGLang and sets it")
    return Path(python).parent.parent


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_a_builtin_processor_without_its_package_stops_the_host_naming_it(name):
    # This test's own environment has neither package.
    env = dict(os.environ, VIRTUAL_ENV=sys.prefix)
    failed = subprocess.run([str(BIN_DIR / "kvmesh-processor-host"), "--dyn-chat-processor", name,
                             "--discovery-backend", "mem"], env=env, capture_output=True, text=True, timeout=60)
    assert failed.returncode == 2, failed.stderr
    assert f"needs the '{name}' Python package" in failed.stderr, failed.stderr


@pytest.fixture(scope="module")
def sglang_mesh():
    env = {"VIRTUAL_ENV": str(sglang_venv()), "HF_HUB_OFFLINE": "1"}
    mesh = start_distributed("etcd", env, num_workers=1,
                             mocker_args=("--dyn-tool-call-parser", "hermes", "--dyn-reasoning-parser", "qwen3"),
                             frontend_args=("--dyn-chat-processor", "sglang"))
    try:
        # The host imports SGLang (and torch) before it registers, then builds the engine.
        wait_until(lambda: chat(mesh, "ready?").status_code == 200, timeout=180, what="sglang processor ready")
    except BaseException:
        mesh.print_logs()
        mesh.stop()
        raise
    yield mesh
    mesh.stop()


def test_sglang_splits_the_thinking_off_unary_and_streaming(sglang_mesh):
    client = sglang_mesh.client()
    messages = [{"role": "user", "content": "think first"}]
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40)
    message = reply.choices[0].message
    thinking = message.model_extra.get("reasoning_content")
    assert thinking and "<think>" not in thinking and "</think>" not in thinking, message
    assert "<think>" not in (message.content or "") and "</think>" not in (message.content or ""), message
    assert reply.usage.completion_tokens == 40 and reply.choices[0].finish_reason == "length"
    chunks = [c for c in client.chat.completions.create(model="tiny", messages=messages, max_tokens=40, stream=True)
              if c.choices]
    streamed_thinking = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed_thinking.strip() and "</think>" not in streamed_thinking + streamed
    assert chunks[0].choices[0].delta.role == "assistant"


def test_sglang_reads_tool_calls_unary_and_streaming(sglang_mesh):
    client = sglang_mesh.client()
    messages = [{"role": "user", "content": "What is the weather in Paris? Use get_weather."}]
    reply = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=200)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    assert isinstance(json.loads(choice.message.tool_calls[0].function.arguments)["city"], str)
    assert "<tool_call>" not in (choice.message.content or "")
    chunks = [c for c in client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                                        max_tokens=200, stream=True) if c.choices]
    fragments = [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])]
    assert fragments and fragments[0].id and fragments[0].function.name == "get_weather"
    arguments = "".join(f.function.arguments or "" for f in fragments)
    assert isinstance(json.loads(arguments)["city"], str)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks)
    # A turn that names no tool is answered in text.
    text = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                          tools=TOOLS, max_tokens=20)
    assert text.choices[0].message.tool_calls is None and text.choices[0].finish_reason == "length"
    # `required` is SGLang's JSON array of calls, constrained by guided decoding and read back.
    forced = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                            tools=TOOLS, tool_choice="required", max_tokens=200)
    calls = forced.choices[0].message.tool_calls
    assert calls and all(c.function.name in ("get_weather", "get_time") for c in calls), forced
    assert all(isinstance(json.loads(c.function.arguments), dict) for c in calls)


def test_sglang_refuses_what_its_server_refuses(sglang_mesh):
    client = sglang_mesh.client()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4, n=2)
    assert "n > 1" in str(refused.value)
    # A value kvmesh passes on and SGLang's own request model refuses, with SGLang's message.
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       reasoning_effort="bogus")
    assert "reasoning_effort" in str(refused.value) and "'minimal'" in str(refused.value)


def test_sglang_matches_stop_strings_the_workers_ignore(sglang_mesh):
    client = sglang_mesh.client()
    messages = [{"role": "user", "content": "tell me about caches"}]
    full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40, temperature=0)
    text = full.choices[0].message.content
    thinking = full.choices[0].message.model_extra.get("reasoning_content") or ""
    # A stop string from the middle of the (greedy, so repeatable) answer, not in the thinking.
    stop = next(text[i:i + 4] for i in range(len(text) // 2, len(text) - 4)
                if text[i:i + 4].strip() == text[i:i + 4] and text[i:i + 4] not in thinking + "</think>")
    for stream in (False, True):
        if stream:
            chunks = [c for c in client.chat.completions.create(model="tiny", messages=messages, max_tokens=40,
                                                                temperature=0, stop=[stop], stream=True) if c.choices]
            content = "".join(c.choices[0].delta.content or "" for c in chunks)
            finish = chunks[-1].choices[0].finish_reason
        else:
            cut = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40, temperature=0,
                                                 stop=[stop])
            content, finish = cut.choices[0].message.content, cut.choices[0].finish_reason
        assert finish == "stop" and content == text[:text.index(stop)], (stop, content, text)
