#!/usr/bin/env python3
"""Writes a long-context copy of the bundled tiny model: the same tokenizer and chat template, a
config with a 128 k-token context window. `kvmesh up --model-path OUT --model-name tiny-128k`
serves it (benchmarks and the long-prompt tests use it).

    scripts/make_long_context_model.py OUT_DIR [--context 131072]
"""
import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--context", type=int, default=131072)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for source in (ROOT / "models" / "tiny").iterdir():
        shutil.copy(source, args.out / source.name)
    config = json.loads((args.out / "config.json").read_text())
    config["max_position_embeddings"] = args.context
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer_config = json.loads((args.out / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = args.context
    (args.out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
