"""kvmesh-vllm-worker: a kvmesh `Worker` (proto/kvmesh/v1/worker.proto) around vLLM's engine.

It shows that a mesh service can be written in another language from the protobuf contracts
alone: it registers in discovery like the mock engine, serves `Generate` over gRPC, publishes its
load on the event plane and has its engine's KV events relayed by `kvmesh-kv-bridge`.
"""
