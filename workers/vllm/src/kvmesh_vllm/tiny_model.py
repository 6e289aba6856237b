"""Makes a tiny random-weight Qwen2 model that vLLM's CPU build can serve, for tests and trials.

It takes its tokenizer from an existing model directory (the repository's `models/tiny`, the mock
engine's model), so the frontend, the mock engine and vLLM agree on the vocabulary. The shape is
the smallest the CPU attention kernels accept (head dimension 32); the weights are random, so the
text is noise but every token id is real. No network access.

usage: python -m kvmesh_vllm.tiny_model OUT_DIR --tokenizer-from models/tiny
"""
import argparse
import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def make(out: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, out / name)
    source = json.loads((tokenizer_from / "config.json").read_text())
    config = Qwen2Config(
        vocab_size=source["vocab_size"], hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=source.get("bos_token_id"), eos_token_id=source.get("eos_token_id"),
        tie_word_embeddings=True, torch_dtype="float32")
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer-from", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(make(a.out, a.tokenizer_from, a.seed))


if __name__ == "__main__":
    main()
