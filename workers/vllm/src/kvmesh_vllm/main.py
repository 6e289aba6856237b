"""`kvmesh-vllm-worker`: start vLLM, serve the Worker contract, register, publish load, stop cleanly.

The steps are the mesh's service lifecycle (docs/ARCHITECTURE.md, "Service lifecycle"): serve,
register once ready, wait for a signal or a lost registration, then stop: revoke the registration,
drain requests in flight, stop the server, the bridge and the engine.
"""
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import grpc
import nats
import xxhash

from kvmesh_vllm import names, security
from kvmesh_vllm.bridge import KvBridge, find_bridge
from kvmesh_vllm.contracts import discovery_pb2, worker_pb2_grpc
from kvmesh_vllm.discovery import LeaseLost, open_discovery, record_json
from kvmesh_vllm.load import LoadBoard, logger_factory
from kvmesh_vllm.options import parse
from kvmesh_vllm.plugin import WORKER_PID_ENV
from kvmesh_vllm.service import VllmWorker

log = logging.getLogger("kvmesh_vllm")

# Dynamo's model-type bits: Chat | Completions.
MODEL_TYPE_CHAT_COMPLETIONS = 1 | 2


def engine_args(engine_argv: list[str], bridge: KvBridge | None):
    """vLLM's engine arguments, with KV events pointed at the bridge."""
    from vllm.config.kv_events import KVEventsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    vllm_parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser(prog="vllm engine arguments"))
    args = AsyncEngineArgs.from_cli_args(vllm_parser.parse_args(engine_argv))
    if bridge is not None:
        if args.kv_events_config is not None:
            raise SystemExit("--kv-events-config: the worker points vLLM's KV events at its bridge itself "
                             "(pass --kv-events false to the worker to manage them yourself)")
        args.kv_events_config = KVEventsConfig(**bridge.events_config())
        if args.enable_prefix_caching is False:
            raise SystemExit("--no-enable-prefix-caching: KV events need prefix caching")
    return args


def model_card(model_name: str, source: str, vllm_config, options) -> discovery_pb2.ModelCard:
    cache, scheduler = vllm_config.cache_config, vllm_config.scheduler_config
    card = discovery_pb2.ModelCard(
        display_name=model_name,
        source_path=source,
        context_length=vllm_config.model_config.max_model_len,
        kv_cache_block_size=cache.block_size,
        migration_limit=options.migration_limit,
        model_type=MODEL_TYPE_CHAT_COMPLETIONS,
        model_input="Tokens",
    )
    runtime = card.runtime_config
    runtime.total_kv_blocks = cache.num_gpu_blocks or 0
    runtime.max_num_seqs = scheduler.max_num_seqs
    runtime.max_num_batched_tokens = scheduler.max_num_batched_tokens
    runtime.data_parallel_size = 1
    if options.dyn_tool_call_parser:
        runtime.tool_call_parser = options.dyn_tool_call_parser
    if options.dyn_reasoning_parser:
        runtime.reasoning_parser = options.dyn_reasoning_parser
    return card


def card_checksum(card: discovery_pb2.ModelCard) -> str:
    """xxh3_64 of the card's canonical JSON (keys sorted), as the mesh writes it."""
    canonical = json.dumps(json.loads(record_json(card)), sort_keys=True, separators=(",", ":"))
    return f"{xxhash.xxh3_64_intdigest(canonical.encode()):016x}"


async def publish_load(board: LoadBoard, nats_url: str, subject: str, interval: float) -> None:
    """Publishes the load on the event plane whenever it changed, at most every `interval`."""
    client = await nats.connect(nats_url, max_reconnect_attempts=-1, **security.nats_options())
    try:
        while True:
            await asyncio.get_running_loop().run_in_executor(None, board.changed.wait, 1.0)
            if board.changed.is_set():
                board.changed.clear()
                await client.publish(subject, board.snapshot().SerializeToString())
            await asyncio.sleep(interval)
    finally:
        await client.close()


async def run(options, engine_argv: list[str]) -> int:
    from vllm.v1.engine.async_llm import AsyncLLM

    run_dir = Path(tempfile.mkdtemp(prefix="kvmesh-vllm-"))
    bridge = KvBridge(find_bridge(options.kv_bridge_bin), run_dir) if options.kv_events else None
    args = engine_args(engine_argv, bridge)
    source = os.path.abspath(args.model) if os.path.isdir(args.model) else args.model
    served = args.served_model_name
    model_name = options.model_name or (served[0] if isinstance(served, list) and served else served) or args.model

    # vLLM's engine process exits with this one (plugin.py reads it in that process).
    os.environ[WORKER_PID_ENV] = str(os.getpid())
    board = LoadBoard(total_blocks=0)
    log.info("starting vLLM for %s", model_name)
    engine = AsyncLLM.from_engine_args(args, stat_loggers=[logger_factory(board)])
    vllm_config = engine.vllm_config
    board.total_blocks = vllm_config.cache_config.num_gpu_blocks or 0
    service = VllmWorker(engine, board, vllm_config.model_config.max_model_len)

    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    tls = security.server_tls(options)
    listen = f"{options.tcp_rpc_host}:{options.tcp_rpc_port}"
    port = server.add_secure_port(listen, tls.credentials()) if tls else server.add_insecure_port(listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {options.tcp_rpc_host}:{options.tcp_rpc_port}")
    await server.start()
    address = f"{options.tcp_rpc_host}:{port}"

    endpoint = options.endpoint
    discovery = open_discovery(options.discovery_backend, options.etcd_endpoints, options.file_kv)
    worker_id = await discovery.start()
    board.worker_id = worker_id
    if bridge is not None:
        bridge.start(worker_id, endpoint.namespace, model_name, vllm_config.cache_config.block_size, dict(os.environ))
    card = model_card(model_name, source, vllm_config, options)
    model_record = discovery_pb2.ModelRecord(
        namespace=endpoint.namespace, model=model_name, instance_id=worker_id, component=endpoint.component,
        endpoint=endpoint.endpoint, card=card, card_checksum=card_checksum(card))
    instance = discovery_pb2.InstanceRecord(
        namespace=endpoint.namespace, component=endpoint.component, endpoint=endpoint.endpoint,
        instance_id=worker_id, address=address, transport="grpc", device_type="cpu",
        version="kvmesh-vllm-worker 0.1.0", started_at_ms=_now_ms())
    instance.metadata["engine"] = "vllm"
    await discovery.put(names.model_key(endpoint.namespace, model_name, worker_id), record_json(model_record))
    await discovery.put(names.instance_key(endpoint.namespace, endpoint.component, endpoint.endpoint, worker_id),
                        record_json(instance))
    log.info("vllm worker %x registered at %s for model %s", worker_id, address, model_name)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(discovery.keep_alive(), name="lease"),
             asyncio.create_task(publish_load(board, options.nats_server,
                                              names.load_subject(endpoint.namespace, model_name),
                                              options.load_interval), name="load"),
             asyncio.create_task(_watch_bridge(bridge), name="bridge"),
             asyncio.create_task(stop.wait(), name="signal")]
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    status = 0
    for task in done:
        if task.get_name() != "signal" and task.exception() is not None:
            error = task.exception()
            log.error("%s failed: %s", task.get_name(), error)
            status = 1 if not isinstance(error, LeaseLost) else 2

    log.info("stopping: revoking the registration, then draining %d requests", service.inflight)
    service.draining = True
    await discovery.close()
    grace = float(os.environ.get("DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS", "30"))
    try:
        await asyncio.wait_for(service.idle.wait(), timeout=grace)
    except asyncio.TimeoutError:
        log.warning("%d requests still running after %.0f s; stopping anyway", service.inflight, grace)
    for task in tasks:
        task.cancel()
    await server.stop(1.0)
    if bridge is not None:
        bridge.stop()
    engine.shutdown()
    return status


async def _watch_bridge(bridge: KvBridge | None) -> None:
    if bridge is None:
        await asyncio.Event().wait()
    while True:
        bridge.check()
        await asyncio.sleep(1.0)


def _now_ms() -> int:
    return int(time.time() * 1000)


def main(argv: list[str] | None = None) -> None:
    options, engine_argv = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(asyncio.run(run(options, engine_argv)))


if __name__ == "__main__":
    main()
