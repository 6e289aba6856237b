"""The built-in `sglang` chat processor (`--dyn-chat-processor sglang`).

Each chat request is validated by SGLang's own `ChatCompletionRequest` (a request SGLang's server
would refuse gets 400 with SGLang's message), its messages go through SGLang's content handling
for the model's chat template and SGLang's tokenizer loader, and the sampling parameters are
SGLang's `to_sampling_params` mapped onto the preprocessed request. The workers' tokens are
turned into text incrementally, and the text goes through SGLang's reasoning parser and
tool-call parser for the parsers the model's card names, so thinking arrives as
`reasoning_content` and calls as `tool_calls`, as behind SGLang's own server.

Imported only when `--dyn-chat-processor sglang` is selected and the `sglang` package is
importable in the host's Python (`import sglang` loads torch: seconds, once).
"""
import asyncio
import copy
import json
import time
import uuid

from .llm import PythonAsyncEngine
from .llm.exceptions import InvalidArgument
from .stops import StopStrings

# Worker finish reasons to OpenAI's.
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", "content_filter": "content_filter"}

# The parser names workers publish in their card (Dynamo's) where SGLang spells them otherwise.
PARSER_NAMES = {
    "deepseek_r1": "deepseek-r1",
    "deepseek_v3": "deepseekv3",
    "deepseek_v31": "deepseekv31",
    "gpt_oss": "gpt-oss",
    "llama3_json": "llama3",
    "minimax_m2": "minimax-m2",
}


def sglang_parser_name(name, known, what):
    """SGLang's name of the card's parser `name`, or a ValueError naming SGLang's parsers."""
    if not name:
        return None
    for candidate in (name, PARSER_NAMES.get(name), name.replace("_", "-")):
        if candidate in known:
            return candidate
    raise ValueError(f"SGLang has no {what} parser {name!r}; it has: {', '.join(sorted(known))}")


class Detokenizer:
    """Output tokens to text a piece at a time, as SGLang's detokenizer does it: the text of the
    tokens since the last surrounding offset is decoded again with the new ones, and what it
    gained goes out unless it ends inside a character still being spelled."""

    def __init__(self, tokenizer, skip_special_tokens):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = []
        self.surr_offset = 0
        self.read_offset = 0

    def push(self, token_ids):
        self.ids.extend(token_ids)
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)  # noqa: E731
        surrounding = decode(self.ids[self.surr_offset:self.read_offset])
        text = decode(self.ids[self.surr_offset:])
        if len(text) > len(surrounding) and not text.endswith("\ufffd"):
            self.surr_offset = self.read_offset
            self.read_offset = len(self.ids)
            return text[len(surrounding):]
        return ""


class SglangChatProcessor:
    """One model's processor: SGLang's request handling and output parsers around the mesh's
    routed engine."""

    def __init__(self, routed_engine, mdc):
        from sglang.srt.function_call.function_call_parser import FunctionCallParser
        from sglang.srt.parser.jinja_template_utils import detect_jinja_template_content_format
        from sglang.srt.parser.reasoning_parser import ReasoningParser
        from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

        self.routed_engine = routed_engine
        self.tokenizer = get_tokenizer(mdc.local_dir())
        self.content_format = detect_jinja_template_content_format(self.tokenizer.chat_template or "")
        self.context_length = int(mdc.context_length() or 0)
        eos = self.tokenizer.eos_token_id
        self.eos_token_ids = [eos] if eos is not None else []
        runtime = mdc.runtime_config() or {}
        self.tool_parser = sglang_parser_name(
            runtime.get("tool_call_parser"), FunctionCallParser.ToolCallParserEnum, "tool-call")
        self.reasoning_parser = sglang_parser_name(
            runtime.get("reasoning_parser"), ReasoningParser.DetectorMap, "reasoning")

    def _prompt(self, parsed, request, tools):
        from sglang.srt.parser.jinja_template_utils import process_content_for_template_format

        messages = []
        for message in copy.deepcopy(request["messages"]):
            # Templates read a past call's arguments as a mapping, as SGLang's server hands them.
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                if isinstance(function.get("arguments"), str):
                    try:
                        function["arguments"] = json.loads(function["arguments"])
                    except ValueError:
                        pass
            messages.append(process_content_for_template_format(message, self.content_format, [], [], [], []))
        kwargs = dict(parsed.chat_template_kwargs or {})
        if tools:
            kwargs["tools"] = [tool.model_dump() for tool in tools]
        try:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
        except Exception as error:  # noqa: BLE001 - a template that fails on the messages is the client's
            raise InvalidArgument(f"the chat template failed on these messages: {error}") from error
        ids = getattr(ids, "input_ids", ids)
        if isinstance(ids, dict):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def _parsers(self, parsed, tools):
        """The request's tool-call parser (and the guided JSON it needs), and its reasoning parser."""
        from sglang.srt.entrypoints.openai.protocol import ToolChoice
        from sglang.srt.function_call.function_call_parser import FunctionCallParser
        from sglang.srt.function_call.json_array_parser import JsonArrayParser
        from sglang.srt.function_call.utils import get_json_schema_constraint
        from sglang.srt.parser.reasoning_parser import ReasoningParser

        tool_parser, guided = None, None
        choice = parsed.tool_choice
        if tools and choice != "none":
            if choice == "required" or isinstance(choice, ToolChoice):
                # As SGLang: the output is constrained to a JSON array of calls and read as one.
                guided = get_json_schema_constraint(tools, choice, parallel_tool_calls=parsed.parallel_tool_calls)
                tool_parser = JsonArrayParser()
            elif self.tool_parser:
                tool_parser = FunctionCallParser(tools=tools, tool_call_parser=self.tool_parser)
        reasoning = None
        if self.reasoning_parser and parsed.separate_reasoning:
            reasoning = ReasoningParser(model_type=self.reasoning_parser, stream_reasoning=True, request=parsed)
        return tool_parser, guided, reasoning

    async def generate(self, request, context=None):
        from pydantic import ValidationError
        from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

        try:
            parsed = ChatCompletionRequest.model_validate(request)
        except ValidationError as error:
            raise InvalidArgument(str(error)) from error
        if parsed.n not in (None, 1):
            raise InvalidArgument("n > 1 is not supported by the sglang processor")
        tools = parsed.tools if parsed.tool_choice != "none" else None
        prompt = self._prompt(parsed, request, tools)
        room = (self.context_length - len(prompt)) if self.context_length else None
        if room is not None and room <= 0:
            raise InvalidArgument(f"the prompt has {len(prompt)} tokens, the context {self.context_length}")
        tool_parser, guided, reasoning = self._parsers(parsed, tools)
        stop = [parsed.stop] if isinstance(parsed.stop, str) else list(parsed.stop or [])
        params = parsed.to_sampling_params(stop, {})
        preprocessed = self._preprocessed(request, prompt, params, room, guided)
        if tools and tool_parser is not None and guided is None:
            # The mesh's mock engine decides its calls from the offered tools (a real one reads
            # them in the prompt); kvmesh's contract carries them.
            for key in ("tools", "tool_choice", "parallel_tool_calls"):
                if request.get(key) is not None:
                    preprocessed[key] = request[key]
        stream = await self.routed_engine.generate(preprocessed, context=context)
        async for chunk in self._chunks(request["model"], len(prompt), stream, params, tool_parser, tools,
                                        reasoning):
            yield chunk

    def _preprocessed(self, request, prompt, params, room, guided):
        sampling = {
            "temperature": params.get("temperature"), "top_p": params.get("top_p"),
            "min_p": params.get("min_p"), "repetition_penalty": params.get("repetition_penalty"),
            "presence_penalty": params.get("presence_penalty"),
            "frequency_penalty": params.get("frequency_penalty"), "seed": params.get("sampling_seed"),
        }
        if (params.get("top_k") or -1) > 0:
            sampling["top_k"] = params["top_k"]
        if guided is not None:
            sampling["guided_decoding"] = {"json": guided}
        elif params.get("json_schema"):
            sampling["guided_decoding"] = {"json": json.loads(params["json_schema"])}
        elif params.get("regex"):
            sampling["guided_decoding"] = {"regex": params["regex"]}
        elif params.get("ebnf") or params.get("structural_tag"):
            raise InvalidArgument("EBNF and structural-tag constraints are not supported by the mesh's workers")
        ignore_eos = bool(params.get("ignore_eos"))
        return {
            "model": request["model"],
            "token_ids": prompt,
            "stop_conditions": {
                "max_tokens": params.get("max_new_tokens") or room or 16,
                "min_tokens": params.get("min_new_tokens") or 0,
                "stop": params.get("stop") or [],
                "stop_token_ids": list(params.get("stop_token_ids") or []),
                "ignore_eos": ignore_eos,
            },
            "sampling_options": {k: v for k, v in sampling.items() if v is not None},
            "output_options": {"skip_special_tokens": params.get("skip_special_tokens", True)},
            "eos_token_ids": [] if ignore_eos else self.eos_token_ids,
            "routing": (request.get("nvext") or {}).get("routing"),
        }

    async def _chunks(self, model, num_prompt, stream, params, tool_parser, tools, reasoning):
        from sglang.srt.function_call.function_call_parser import FunctionCallParser

        chunk_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        detokenizer = Detokenizer(self.tokenizer, params.get("skip_special_tokens", True))
        calls = {}
        generated = 0
        first = True

        def chunk(delta, finish=None, usage=None):
            body = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage is not None:
                body["usage"] = usage
            return body

        def parse_tools(text):
            if tool_parser is None or not text:
                return text, []
            if isinstance(tool_parser, FunctionCallParser):
                text, found = tool_parser.parse_stream_chunk(text)
            else:
                result = tool_parser.parse_streaming_increment(text, tools)
                text, found = result.normal_text, result.calls
            return text, [call_delta(item) for item in found]

        def call_delta(item):
            fragment = {"index": item.tool_index, "function": {"arguments": item.parameters or ""}}
            if item.tool_index not in calls and item.name:
                calls[item.tool_index] = f"call_{uuid.uuid4().hex[:24]}"
                fragment.update(id=calls[item.tool_index], type="function")
                fragment["function"]["name"] = item.name
            return fragment

        def delta_of(text):
            """The chunk delta of new text: reasoning split off first, then calls read out."""
            nonlocal first
            thinking = ""
            if reasoning is not None and text:
                thinking, text = reasoning.parse_stream_chunk(text)
                thinking, text = thinking or "", text or ""
            text, tool_calls = parse_tools(text)
            delta = {"role": "assistant", "content": ""} if first else {}
            first = False
            if thinking:
                delta["reasoning_content"] = thinking
            if text:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            return delta or None

        # Workers may ignore stop strings (SGLang's scheduler matches them): matched here, the
        # stop string itself dropped unless `no_stop_trim`.
        stops = StopStrings(params.get("stop") or [], bool(params.get("no_stop_trim")))
        finish = None
        async for item in stream:
            output = item.data()
            reason = output.get("finish_reason")
            if isinstance(reason, dict):
                raise RuntimeError(reason.get("error", "the worker failed"))
            token_ids = output.get("token_ids") or []
            generated += len(token_ids)
            text, matched = stops.feed(detokenizer.push(token_ids))
            if matched:
                finish = "stop"
            elif reason is not None:
                text += stops.flush()
                finish = FINISH.get(reason, "stop")
            delta = delta_of(text)
            if delta is not None:
                yield chunk(delta)
            if finish is not None:
                break
        if isinstance(tool_parser, FunctionCallParser):
            text, found = tool_parser.parse_stream_end()
            tail = {}
            if text:
                tail["content"] = text
            if found:
                tail["tool_calls"] = [call_delta(item) for item in found]
            if tail:
                yield chunk(tail)
        if calls and finish == "stop":
            finish = "tool_calls"
        usage = {"prompt_tokens": num_prompt, "completion_tokens": generated, "total_tokens": num_prompt + generated}
        yield chunk({}, finish or "stop", usage)


def provider(config, options):
    """The host's provider: a factory of one SGLang processor per model."""

    async def chat_engine_factory(instance_id, mdc, routed_engine):
        processor = SglangChatProcessor(routed_engine, mdc)
        return PythonAsyncEngine(processor.generate, asyncio.get_running_loop())

    return chat_engine_factory
