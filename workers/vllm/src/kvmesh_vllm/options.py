"""Command line of `kvmesh-vllm-worker`: the mock engine's discovery and event-plane options, the
worker's own, and vLLM's engine arguments after `--`."""
import argparse
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class EndpointPath:
    """`dyn://{namespace}.{component}.{endpoint}`: where the worker registers."""

    namespace: str
    component: str
    endpoint: str


def parse_endpoint(text: str) -> EndpointPath:
    body = text.removeprefix("dyn://")
    parts = body.split(".")
    if len(parts) != 3 or not all(parts):
        raise argparse.ArgumentTypeError(f"expected dyn://namespace.component.endpoint, got {text!r}")
    return EndpointPath(*parts)


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def _env(name: str, default=None):
    return os.environ.get(name, default)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvmesh-vllm-worker",
        description="A kvmesh worker serving a vLLM engine. vLLM's engine arguments follow `--`.",
        epilog="example: kvmesh-vllm-worker --model-name tiny -- --model ./tiny --block-size 32")
    p.add_argument("--discovery-backend", choices=["etcd", "file"], default=_env("DYN_DISCOVERY_BACKEND", "etcd"))
    p.add_argument("--etcd-endpoints", default=_env("ETCD_ENDPOINTS", "http://localhost:2379"),
                   help="comma-separated etcd client URLs (ETCD_ENDPOINTS)")
    p.add_argument("--file-kv", type=Path, default=_env("DYN_FILE_KV"), help="root of the file backend (DYN_FILE_KV)")
    p.add_argument("--nats-server", default=_env("NATS_SERVER", "nats://localhost:4222"), help="NATS URL (NATS_SERVER)")
    p.add_argument("--endpoint", type=parse_endpoint,
                   default=parse_endpoint(_env("KVMESH_VLLM_ENDPOINT", "dyn://dynamo.backend.generate")),
                   help="where to register: dyn://namespace.component.endpoint")
    p.add_argument("--namespace", default=_env("DYN_NAMESPACE"), help="overrides the endpoint's namespace")
    p.add_argument("--model-name", default=_env("KVMESH_VLLM_MODEL_NAME"),
                   help="served model name (default: vLLM's --served-model-name, else --model)")
    p.add_argument("--tcp-rpc-host", default=_env("DYN_TCP_RPC_HOST", "127.0.0.1"), help="gRPC listen host")
    p.add_argument("--tcp-rpc-port", type=int, default=int(_env("DYN_TCP_RPC_PORT", "0")), help="gRPC port (0: any)")
    p.add_argument("--kv-events", type=_bool, default=_bool(_env("KVMESH_VLLM_KV_EVENTS", "true")),
                   help="relay the engine's KV events through kvmesh-kv-bridge (needed by --router-mode kv)")
    p.add_argument("--kv-bridge-bin", default=_env("KVMESH_KV_BRIDGE_BIN"), help="path of kvmesh-kv-bridge")
    p.add_argument("--dyn-tool-call-parser", default=_env("DYN_TOOL_CALL_PARSER"),
                   help="tool-call syntax published in the model card")
    p.add_argument("--dyn-reasoning-parser", default=_env("DYN_REASONING_PARSER"),
                   help="reasoning syntax published in the model card")
    p.add_argument("--migration-limit", type=int, default=int(_env("DYN_MIGRATION_LIMIT", "0")),
                   help="published in the model card: how often a request may move to another worker")
    p.add_argument("--load-interval", type=float, default=float(_env("KVMESH_VLLM_LOAD_INTERVAL", "0.1")),
                   help="seconds between load reports when the load changed")
    p.add_argument("--tcp-tls-cert-path", default=_env("DYN_TCP_TLS_CERT_PATH"),
                   help="PEM certificate of the worker's gRPC server (TLS)")
    p.add_argument("--tcp-tls-key-path", default=_env("DYN_TCP_TLS_KEY_PATH"), help="its PEM private key")
    p.add_argument("--tcp-tls-client-ca-cert-path", default=_env("DYN_TCP_TLS_CLIENT_CA_CERT_PATH"),
                   help="PEM CA client certificates must chain to (mutual TLS)")
    p.add_argument("--log-level", default=_env("KVMESH_VLLM_LOG_LEVEL", "INFO"))
    return p


def parse(argv: list[str]):
    """(worker options, vLLM's arguments)."""
    if "--" in argv:
        split = argv.index("--")
        ours, engine = argv[:split], argv[split + 1:]
    else:
        ours, engine = argv, []
    options = parser().parse_args(ours)
    if options.namespace:
        options.endpoint.namespace = options.namespace
    options.etcd_endpoints = [e.strip() for e in options.etcd_endpoints.split(",") if e.strip()]
    return options, engine
