"""The mesh's protobuf messages and gRPC stubs, compiled into the package at build time."""
from kvmesh_vllm._proto.kvmesh.v1 import discovery_pb2, events_pb2, llm_pb2, worker_pb2, worker_pb2_grpc

__all__ = ["discovery_pb2", "events_pb2", "llm_pb2", "worker_pb2", "worker_pb2_grpc"]
