"""The worker's load, as the mock engine reports it (events.proto, `WorkerLoad`).

vLLM's scheduler reports running and waiting requests and the KV cache's usage after each step to
its stat loggers; `LoadLogger` is one, registered with the engine, that keeps the latest figures.
`waiting_prefill_tokens` is not in vLLM's statistics: the worker counts it itself, as the uncached
prompt tokens of its requests that have not produced a first token yet.
"""
import threading
import time

from vllm.v1.metrics.loggers import StatLoggerBase

from kvmesh_vllm.contracts import events_pb2


class LoadBoard:
    """The latest load figures, written by the engine's stat logger and the service."""

    def __init__(self, total_blocks: int):
        self.total_blocks = total_blocks
        self.worker_id = 0
        self._lock = threading.Lock()
        self._running = 0
        self._waiting = 0
        self._usage = 0.0
        self._prefill_tokens: dict[str, int] = {}
        self.changed = threading.Event()

    def record_scheduler(self, running: int, waiting: int, usage: float) -> None:
        with self._lock:
            before = (self._running, self._waiting, self._usage)
            self._running, self._waiting, self._usage = running, waiting, usage
        if before != (running, waiting, usage):
            self.changed.set()

    def prefill_started(self, request_id: str, tokens: int) -> None:
        with self._lock:
            self._prefill_tokens[request_id] = tokens
        self.changed.set()

    def prefill_done(self, request_id: str) -> None:
        with self._lock:
            gone = self._prefill_tokens.pop(request_id, None)
        if gone is not None:
            self.changed.set()

    def snapshot(self) -> events_pb2.WorkerLoad:
        with self._lock:
            used = round(self._usage * self.total_blocks)
            return events_pb2.WorkerLoad(
                worker_id=self.worker_id,
                dp_rank=0,
                kv_used_blocks=used,
                kv_total_blocks=self.total_blocks,
                num_running=self._running,
                num_waiting=self._waiting,
                waiting_prefill_tokens=sum(self._prefill_tokens.values()),
                published_at_ms=int(time.time() * 1000),
            )


def logger_factory(board: LoadBoard):
    """A stat-logger factory for `AsyncLLM.from_engine_args(stat_loggers=[...])`."""

    class LoadLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                board.record_scheduler(scheduler_stats.num_running_reqs,
                                       scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs,
                                       scheduler_stats.kv_cache_usage)

        def log_engine_initialized(self):
            pass

    return LoadLogger
