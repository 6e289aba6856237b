#!/usr/bin/env bash
# Installs SGLang into a virtual environment for the processor host's built-in `sglang` chat
# processor (docs/processors.md), from PyPI alone and without a GPU.
#
# `pip install sglang` pulls CUDA kernels (flashinfer, sglang-kernel, ...) the processor never
# loads. So: SGLang's wheel without its dependencies, then the packages its tokenizer, template,
# request and parser modules import (scripts/sglang-requirements.txt, SGLang's pins where it has
# them; torch is PyPI's build, which runs on the CPU). About 3 minutes and 6 GB on 2 cores, cold.
#
# usage: scripts/install_sglang_cpu.sh VENV
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:?usage: install_sglang_cpu.sh VENV}
pins=scripts/sglang-requirements.txt
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q -U pip
"$py" -m pip install -q --no-deps "$(grep '^sglang==' "$pins")"
# pip lists every kernel SGLang requires and this leaves out: noise, filtered.
"$py" -m pip install -q -r <(grep -v '^sglang==' "$pins") 2>&1 |
  { grep -v -e '^sglang .* requires' -e "dependency resolver" || true; }
"$py" -c "
import sglang.srt.function_call.function_call_parser, sglang.srt.parser.reasoning_parser
import sglang.srt.parser.jinja_template_utils, sglang.srt.entrypoints.openai.protocol
import sglang.srt.utils.hf_transformers.tokenizer
print('sglang', sglang.__version__)"
