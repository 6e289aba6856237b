"""Maps the contract's `GenerateRequest` onto vLLM's sampling parameters and back.

Every field of the request is honoured or refused: a field vLLM cannot honour here raises
`Unsupported`, which the service answers `UNIMPLEMENTED` naming the field, never silently ignored.
"""
from dataclasses import dataclass

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from kvmesh_vllm.contracts import llm_pb2


class Unsupported(Exception):
    """A request field this worker cannot honour (answered UNIMPLEMENTED)."""


class Invalid(Exception):
    """A request that breaks the contract (answered INVALID_ARGUMENT)."""


@dataclass
class EnginePrompt:
    """What vLLM's `generate` takes for one request."""

    prompt: dict
    params: SamplingParams


def sampling_params(request: llm_pb2.GenerateRequest, max_model_len: int) -> SamplingParams:
    """vLLM's parameters for a request: sampling, stop conditions and outputs."""
    sampling = request.sampling
    stop = request.stop
    kwargs: dict = {
        # Only the new tokens of each step: the contract streams deltas.
        "output_kind": RequestOutputKind.DELTA,
        # The frontend detokenizes and matches stop strings (llm.proto, StopConditions.stop).
        "detokenize": False,
        "skip_special_tokens": request.output.skip_special_tokens,
    }
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty"):
        if sampling.HasField(name):
            kwargs[name] = getattr(sampling, name)
    if sampling.HasField("top_k"):
        kwargs["top_k"] = 0 if sampling.top_k < 0 else sampling.top_k
    if sampling.HasField("seed"):
        kwargs["seed"] = sampling.seed
    if sampling.greedy:
        kwargs["temperature"] = 0.0
    guided = _structured_outputs(sampling)
    if guided is not None:
        kwargs["structured_outputs"] = guided
    room = max(1, max_model_len - len(request.token_ids))
    kwargs["max_tokens"] = min(stop.max_tokens, room) if stop.HasField("max_tokens") else room
    if stop.HasField("min_tokens"):
        kwargs["min_tokens"] = stop.min_tokens
    if stop.stop_token_ids:
        kwargs["stop_token_ids"] = list(stop.stop_token_ids)
    kwargs["ignore_eos"] = stop.ignore_eos
    if stop.HasField("max_thinking_tokens"):
        kwargs["thinking_token_budget"] = stop.max_thinking_tokens
    if request.output.HasField("logprobs"):
        kwargs["logprobs"] = request.output.logprobs
    if request.output.HasField("prompt_logprobs"):
        # The response has no field for prompt log probabilities.
        raise Unsupported("output.prompt_logprobs is not returned by this worker")
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as error:
        raise Invalid(str(error)) from error


def _structured_outputs(sampling: llm_pb2.SamplingOptions) -> StructuredOutputsParams | None:
    chosen = [name for name, present in (
        ("guided_json_schema", sampling.HasField("guided_json_schema")),
        ("guided_regex", sampling.HasField("guided_regex")),
        ("guided_choice", bool(sampling.guided_choice)),
    ) if present]
    if len(chosen) > 1:
        raise Invalid(f"at most one of guided_json_schema, guided_regex and guided_choice may be set, got {chosen}")
    if not chosen:
        return None
    if chosen[0] == "guided_json_schema":
        return StructuredOutputsParams(json=sampling.guided_json_schema)
    if chosen[0] == "guided_regex":
        return StructuredOutputsParams(regex=sampling.guided_regex)
    return StructuredOutputsParams(choice=list(sampling.guided_choice))


def engine_prompt(request: llm_pb2.GenerateRequest, max_model_len: int) -> EnginePrompt:
    """The prompt and parameters of one request, or `Invalid`/`Unsupported`."""
    if not request.token_ids:
        raise Invalid("token_ids must not be empty")
    if len(request.token_ids) >= max_model_len:
        raise Invalid(f"prompt of {len(request.token_ids)} tokens does not fit the context of {max_model_len}")
    if request.lora_name:
        raise Unsupported("lora_name: this worker serves no LoRA adapters")
    if request.routing.HasField("dp_rank") and request.routing.dp_rank != 0:
        raise Invalid(f"dp_rank {request.routing.dp_rank} out of range (worker has 1 rank)")
    prompt: dict = {"prompt_token_ids": list(request.token_ids)}
    if request.cache_salt:
        prompt["cache_salt"] = request.cache_salt
    return EnginePrompt(prompt=prompt, params=sampling_params(request, max_model_len))


def finish_reason(reason: str | None, stop_reason, ignore_eos: bool) -> int:
    """The contract's finish reason for vLLM's `finish_reason`/`stop_reason` pair."""
    if reason == "length":
        return llm_pb2.FINISH_REASON_LENGTH
    if reason == "abort":
        return llm_pb2.FINISH_REASON_CANCELLED
    if reason == "stop":
        # No stop_reason: the model's EOS token ended it.
        return llm_pb2.FINISH_REASON_EOS if stop_reason is None else llm_pb2.FINISH_REASON_STOP
    if reason == "error":
        return llm_pb2.FINISH_REASON_ERROR
    return llm_pb2.FINISH_REASON_STOP
