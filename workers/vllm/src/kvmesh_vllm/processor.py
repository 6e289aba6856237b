"""The built-in `vllm` chat processor (`--dyn-chat-processor vllm`) of kvmesh's processor host.

Chat requests are validated, templated, tokenized and turned into sampling parameters by vLLM's
own code (its OpenAI `ChatCompletionRequest`, its tokenizer and the model's chat template), and the
worker's tokens are turned back into text by vLLM's incremental detokenizer, so a model behaves as
it does behind vLLM's own server while the mesh routes it. The host runs this module when the
worker package is installed in its Python (`VIRTUAL_ENV`); the entry point `vllm` of group
`kvmesh.frontend.chat_processors` names it.

Stop strings are matched here (the frontend does not see the text of processor requests): text
that could be the start of a stop string is held back until it is not, and a match ends the
stream with `finish_reason: stop` and cancels the worker call.
"""
import asyncio
import time
import uuid

from kvmesh.llm import PythonAsyncEngine
from kvmesh.llm.exceptions import InvalidArgument
from kvmesh.stops import StopStrings

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop", "content_filter": "content_filter"}


def _sampling_dict(params) -> dict:
    """The processor contract's `sampling_options` for vLLM's `SamplingParams`."""
    out = {name: getattr(params, name) for name in (
        "temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed")}
    out["top_k"] = params.top_k if params.top_k and params.top_k > 0 else None
    guided = params.structured_outputs
    if guided is not None:
        if guided.json is not None:
            out["guided_decoding"] = {"json": guided.json}
        elif guided.regex is not None:
            out["guided_decoding"] = {"regex": guided.regex}
        elif guided.choice is not None:
            out["guided_decoding"] = {"choice": list(guided.choice)}
        elif guided.json_object:
            out["guided_decoding"] = {"json": {"type": "object"}}
        else:
            raise InvalidArgument("this structured output form is not supported by the mesh's workers")
    return {k: v for k, v in out.items() if v is not None}


class VllmChatProcessor:
    """One model's processor: vLLM's request handling around the mesh's routed engine."""

    def __init__(self, routed_engine, mdc):
        from vllm.tokenizers import get_tokenizer

        self.routed_engine = routed_engine
        self.tokenizer = get_tokenizer(mdc.local_dir())
        self.context_length = int(mdc.context_length() or 0)
        eos = self.tokenizer.eos_token_id
        self.eos_token_ids = [eos] if eos is not None else []

    def _prompt(self, request: dict) -> list[int]:
        try:
            ids = self.tokenizer.apply_chat_template(
                request["messages"], tools=request.get("tools"), add_generation_prompt=True, tokenize=True,
                **(request.get("chat_template_kwargs") or {}))
        except Exception as error:  # noqa: BLE001 - a template that fails on the messages is the client's
            raise InvalidArgument(f"the chat template failed on these messages: {error}") from error
        if not isinstance(ids, list):
            # Recent transformers answer a BatchEncoding.
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    async def generate(self, request, context=None):
        from pydantic import ValidationError
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        try:
            parsed = ChatCompletionRequest.model_validate(request)
        except ValidationError as error:
            raise InvalidArgument(str(error)) from error
        if parsed.n not in (None, 1):
            raise InvalidArgument("n > 1 is not supported by the vllm processor")
        prompt = self._prompt(request)
        room = (self.context_length - len(prompt)) if self.context_length else None
        if room is not None and room <= 0:
            raise InvalidArgument(f"the prompt has {len(prompt)} tokens, the context {self.context_length}")
        max_tokens = parsed.max_completion_tokens or parsed.max_tokens or room or 16
        try:
            params = parsed.to_sampling_params(max_tokens, {})
        except ValueError as error:
            raise InvalidArgument(str(error)) from error
        stops = StopStrings(params.stop or [], params.include_stop_str_in_output)
        preprocessed = {
            "model": request["model"],
            "token_ids": prompt,
            "stop_conditions": {"max_tokens": params.max_tokens, "min_tokens": params.min_tokens,
                                "stop_token_ids": list(params.stop_token_ids or []),
                                "ignore_eos": params.ignore_eos},
            "sampling_options": _sampling_dict(params),
            "output_options": {"skip_special_tokens": params.skip_special_tokens},
            "eos_token_ids": [] if params.ignore_eos else self.eos_token_ids,
            "routing": (request.get("nvext") or {}).get("routing"),
        }
        async for chunk in self._stream(request["model"], prompt, preprocessed, params, stops, context):
            yield chunk

    async def _stream(self, model, prompt, preprocessed, params, stops, context):
        from vllm.tokenizers.detokenizer_utils import detokenize_incrementally

        chunk_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        all_ids = list(prompt)
        tokens, prefix_offset, read_offset = None, 0, 0
        generated = 0
        first = True

        def chunk(delta, finish=None, usage=None):
            body = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage is not None:
                body["usage"] = usage
            return body

        stream = await self.routed_engine.generate(preprocessed, context=context)
        finish = None
        async for item in stream:
            output = item.data()
            text = ""
            for token in output.get("token_ids", []):
                all_ids.append(token)
                generated += 1
                new_tokens, piece, prefix_offset, read_offset = detokenize_incrementally(
                    self.tokenizer, all_ids, tokens, prefix_offset, read_offset,
                    skip_special_tokens=params.skip_special_tokens)
                tokens = new_tokens if tokens is None else tokens + new_tokens
                text += piece
            emit, matched = stops.feed(text)
            reason = output.get("finish_reason")
            if isinstance(reason, dict):
                raise RuntimeError(reason.get("error", "the worker failed"))
            if matched:
                finish = "stop"
            elif reason is not None:
                emit += stops.flush()
                finish = FINISH.get(reason, "stop")
            if emit or first:
                delta = {"content": emit}
                if first:
                    delta["role"] = "assistant"
                    first = False
                yield chunk(delta)
            if finish is not None:
                break
        usage = {"prompt_tokens": len(prompt), "completion_tokens": generated,
                 "total_tokens": len(prompt) + generated}
        yield chunk({}, finish or "stop", usage)


def provider(config, options):
    """The host's provider: a factory of one processor per model."""

    async def chat_engine_factory(instance_id, mdc, routed_engine):
        processor = VllmChatProcessor(routed_engine, mdc)
        return PythonAsyncEngine(processor.generate, asyncio.get_running_loop())

    return chat_engine_factory
