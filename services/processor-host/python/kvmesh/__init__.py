"""kvmesh's Python API for chat processors, served by the processor host (`kvmesh-processor-host`).

`kvmesh.llm` holds what processors written for Dynamo import from `dynamo.llm`; when the real
Dynamo package is not installed the host makes `dynamo.llm` the same module.
"""
