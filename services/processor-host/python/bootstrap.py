"""Runs first in the processor host's interpreter: serves the `kvmesh` package from the sources
built into the binary, adds the active virtual environment, and makes `dynamo.llm` the same
module as `kvmesh.llm` when the real Dynamo package is not importable.

`SOURCES` ({module name: (is package, source)}) is set by the host before this runs.
"""
import importlib.abc
import importlib.util
import logging
import os
import site
import sys
import types


class EmbeddedSources(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the modules built into the host binary."""

    def __init__(self, sources):
        self.sources = sources

    def find_spec(self, name, path=None, target=None):
        if name not in self.sources:
            return None
        is_package = self.sources[name][0]
        return importlib.util.spec_from_loader(name, self, origin=f"<kvmesh-processor-host>/{name}",
                                               is_package=is_package)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        source = self.sources[module.__name__][1]
        exec(compile(source, module.__spec__.origin, "exec"), module.__dict__)


def add_virtual_env():
    """The packages of `$VIRTUAL_ENV` come before the base interpreter's."""
    venv = os.environ.get("VIRTUAL_ENV")
    if not venv:
        return
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    packages = os.path.join(venv, "lib", version, "site-packages")
    if not os.path.isdir(packages):
        return
    before = list(sys.path)
    site.addsitedir(packages)
    added = [p for p in sys.path if p not in before]
    rest = before
    first_site = next((i for i, p in enumerate(rest) if p.endswith("site-packages")), len(rest))
    sys.path[:] = rest[:first_site] + added + rest[first_site:]


def alias_dynamo():
    """`dynamo.llm`, `dynamo.llm.exceptions` and `dynamo.frontend` as kvmesh's, only when no
    real `dynamo` package is importable."""
    if importlib.util.find_spec("dynamo") is not None:
        return False
    import kvmesh.frontend
    import kvmesh.llm
    import kvmesh.llm.exceptions
    package = types.ModuleType("dynamo", "kvmesh's stand-in for the Dynamo package (dynamo.llm, dynamo.frontend)")
    package.__path__ = []
    package.llm = kvmesh.llm
    package.frontend = kvmesh.frontend
    sys.modules["dynamo"] = package
    sys.modules["dynamo.llm"] = kvmesh.llm
    sys.modules["dynamo.llm.exceptions"] = kvmesh.llm.exceptions
    sys.modules["dynamo.frontend"] = kvmesh.frontend
    return True


if not getattr(sys, "argv", None):
    sys.argv = ["kvmesh-processor-host"]
sys.meta_path.insert(0, EmbeddedSources(SOURCES))  # noqa: F821 - set by the host
add_virtual_env()
logging.basicConfig(level=os.environ.get("KVMESH_PYTHON_LOG", "INFO"),
                    format="%(asctime)s %(levelname)s %(name)s: %(message)s")
DYNAMO_ALIASED = alias_dynamo()
