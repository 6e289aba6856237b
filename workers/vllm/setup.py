"""Builds the package with the mesh's protobuf contracts compiled in.

The messages are generated from the repository's `proto/` directory with grpcio-tools' protoc (no
hand-written copies). protoc writes modules that import each other as `kvmesh.v1.*`; they are
rewritten to import as `kvmesh_vllm._proto.kvmesh.v1.*`, so the worker never claims the top-level
name `kvmesh` (the processor host's built-in package).
"""
import re
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
# Closed under imports: events.proto imports router.proto (a synced free's TerminalPath).
CONTRACTS = ["llm", "events", "worker", "discovery", "router"]
PACKAGE = "kvmesh_vllm._proto"


def compile_contracts(out_dir: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    target = out_dir / "kvmesh_vllm" / "_proto"
    target.mkdir(parents=True, exist_ok=True)
    include = Path(grpc_tools.__file__).parent / "_proto"
    files = [f"kvmesh/v1/{name}.proto" for name in CONTRACTS]
    rc = protoc.main(["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={target}",
                      f"--grpc_python_out={target}", *files])
    if rc != 0:
        raise RuntimeError(f"protoc failed ({rc}) on {files} under {PROTO_ROOT}")
    for package_dir in (target, target / "kvmesh", target / "kvmesh" / "v1"):
        (package_dir / "__init__.py").touch()
    for module in (target / "kvmesh" / "v1").glob("*.py"):
        text = module.read_text()
        text = re.sub(r"^from kvmesh\.v1 import", f"from {PACKAGE}.kvmesh.v1 import", text, flags=re.M)
        module.write_text(text)


class BuildWithContracts(build_py):
    def run(self):
        super().run()
        compile_contracts(Path(self.build_lib))


setup(cmdclass={"build_py": BuildWithContracts})
