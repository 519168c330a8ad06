"""Run by bench.gate.peers in vLLM's venv (transformers lives there, not in the project's):

    <vllm venv>/bin/python _vllm_weights.py MODEL.gguf OUT_DIR

The GGUF's weights dequantized by transformers' GGUF reader, copied into a model built from its
config without the GGUF's quantization_config (transformers refuses save_pretrained on the
GGUF-loaded weights, and vLLM a "gguf" method on a HF directory), saved fp32 as safetensors with
the tokenizer and the GGUF's chat template."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def main(gguf: str, out: str) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, dst = Path(gguf).resolve(), Path(out)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    if not getattr(tok, "chat_template", None):
        tok.chat_template = _chat_template(src)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, torch_dtype=torch.float32)
    config = loaded.config
    config.__dict__.pop("quantization_config", None)  # plain fp32 now: vLLM refuses a "gguf" method on a HF dir
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in loaded.state_dict().items()}
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if "lm_head" not in k]  # tied to the embeddings
    if missing:
        raise SystemExit(f"weights missing after the copy: {missing[:8]}")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    tmp.rename(dst)
    print(dst)
    return 0


def _chat_template(src: Path) -> str | None:
    from gguf import GGUFReader

    field = GGUFReader(src).fields.get("tokenizer.chat_template")
    return field.contents() if field is not None else None


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
