"""The `Worker` gRPC service (worker.proto) on vLLM's async engine."""
import asyncio
import logging

import grpc

from kvmesh_vllm.contracts import llm_pb2, worker_pb2, worker_pb2_grpc
from kvmesh_vllm.load import LoadBoard
from kvmesh_vllm.requests import Invalid, Unsupported, engine_prompt, finish_reason

log = logging.getLogger(__name__)

# The metadata key that carries the mesh's error code beside the gRPC status (the Rust services
# read it back exactly; a peer that ignores it reads the status code alone).
ERROR_CODE_KEY = "kvmesh-error-code"


async def _abort(context, status: grpc.StatusCode, code: str, message: str):
    context.set_trailing_metadata(((ERROR_CODE_KEY, code),))
    await context.abort(status, message)


class VllmWorker(worker_pb2_grpc.WorkerServicer):
    """Generates with one vLLM engine; dropping a `Generate` stream aborts its request."""

    def __init__(self, engine, board: LoadBoard, max_model_len: int):
        self.engine = engine
        self.board = board
        self.max_model_len = max_model_len
        self.inflight = 0
        self.draining = False
        self.idle = asyncio.Event()
        self.idle.set()

    async def Generate(self, request, context):
        if self.draining:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "unavailable", "worker is shutting down")
        try:
            prepared = engine_prompt(request, self.max_model_len)
        except Invalid as error:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", str(error))
        except Unsupported as error:
            await _abort(context, grpc.StatusCode.UNIMPLEMENTED, "not_implemented", str(error))
        request_id = request.request_id or f"kvmesh-{id(request):x}"
        self.inflight += 1
        self.idle.clear()
        self.board.prefill_started(request_id, len(request.token_ids))
        first = True
        completion_tokens = 0
        finished = False
        try:
            # The token prompt goes through vLLM's renderer (length checks, cache salt) as the
            # engine's own servers send it.
            (engine_input,) = await self.engine.renderer.render_cmpl_async([prepared.prompt])
            async for output in self.engine.generate(engine_input, prepared.params, request_id):
                if first:
                    self.board.prefill_done(request_id)
                completion = output.outputs[0]
                completion_tokens += len(completion.token_ids)
                response = llm_pb2.GenerateResponse(token_ids=completion.token_ids)
                if first:
                    response.worker.worker_id = self.board.worker_id
                    response.worker.dp_rank = 0
                    first = False
                if completion.logprobs:
                    response.logprobs.extend(_logprobs(completion.token_ids, completion.logprobs))
                if output.finished:
                    finished = True
                    response.finish_reason = finish_reason(completion.finish_reason, completion.stop_reason,
                                                           request.stop.ignore_eos)
                    if isinstance(completion.stop_reason, int):
                        response.matched_stop_token_id = completion.stop_reason
                    response.usage.prompt_tokens = len(request.token_ids)
                    response.usage.completion_tokens = completion_tokens
                    response.usage.cached_tokens = output.num_cached_tokens or 0
                yield response
        except (ValueError, TypeError) as error:
            # vLLM validates the request when it is added (a token id past the vocabulary, say).
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", str(error))
        finally:
            self.board.prefill_done(request_id)
            if not finished:
                # The caller dropped the stream (or the engine failed): free the sequence.
                await self.engine.abort(request_id)
            self.inflight -= 1
            if self.inflight == 0:
                self.idle.set()

    async def GetLoad(self, request, context):
        return worker_pb2.GetLoadResponse(ranks=[self.board.snapshot()])

    async def ClearKvBlocks(self, request, context):
        before = self.board.snapshot()
        ok = await self.engine.reset_prefix_cache()
        if not ok:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, "invalid_argument",
                         "vLLM refused to reset the prefix cache while requests run")
        # vLLM does not say how many blocks it dropped; the blocks not held by running requests
        # (every cached one) is the closest figure it gives.
        return worker_pb2.ClearKvBlocksResponse(num_blocks_cleared=before.kv_total_blocks - before.kv_used_blocks)

    async def Embed(self, request, context):
        await _abort(context, grpc.StatusCode.UNIMPLEMENTED, "not_implemented",
                     "Embed: this worker serves a generative model")


def _logprobs(token_ids, logprobs) -> list:
    """The contract's per-token log probabilities from vLLM's per-position dicts."""
    out = []
    for token_id, position in zip(token_ids, logprobs):
        chosen = position.get(token_id)
        entry = llm_pb2.TokenLogprob(token_id=token_id, logprob=chosen.logprob if chosen else 0.0)
        ranked = sorted(position.items(), key=lambda item: item[1].rank or 0)
        for alt_id, alt in ranked:
            entry.top.add(token_id=alt_id, logprob=alt.logprob)
        out.append(entry)
    return out
