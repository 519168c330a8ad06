"""Tiny, seeded, random-weight GGUF models: one per llama.cpp KV-cache structural class.

Why: tests of the KV/memory code paths need real model files that the pinned llama.cpp
loads *and decodes*, covering each memory layout it implements -- dense GQA cache
(``llama``), sliding-window ISWA cache (``gemma2``), MLA K-only cache (``deepseek2``),
Mamba2 + attention hybrid (``falcon-h1``) and gated-delta-net + attention hybrid
(``qwen3next``), recurrent-only Mamba2 (``mamba2``) -- and the weight layouts popular
architectures add on top: Q/K/V biases (``qwen2``), Q/K norms (``qwen3``), routed experts
(``qwen3moe``), fused QKV and gate+up projections (``phi3``); plus one file skippy must refuse
(``llada``: llama.cpp builds no KV memory for it) -- without downloading real checkpoints. Each file is at most a few MB,
writes and loads in milliseconds, and is byte-identical for the same
(family, seed, GENERATOR_VERSION) under the same numpy.

Tensor names and ggml shapes follow the ``create_tensor`` calls of the pinned llama.cpp
(``src/models/<arch>.cpp``) and the key names of ``src/llama-arch.cpp``, not gguf-py's
tables. gguf-py stores numpy shapes reversed relative to ggml (a ggml ``{n_embd, n_vocab}``
tensor is a numpy ``(n_vocab, n_embd)`` array); the helpers below take ggml order.
Attention head size is 64 everywhere (576/512 for MLA) so that GPU flash-attention
kernels accept the models too.
"""

from __future__ import annotations

import os
import pathlib
import string
import tempfile
import zlib
from collections.abc import Callable

import gguf
import numpy as np

from ..errors import InvalidInputError, UnknownFamilyError

FAMILIES: tuple[str, ...] = (
    "llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next",  # one per KV class of the original five
    "qwen2", "qwen3", "qwen3moe", "phi3", "mamba2",  # more architectures: biases, q/k norms, MoE, fused, recurrent-only
)
GENERATOR_VERSION: int = 1  # bump when output bytes change

N_VOCAB = 512
N_CTX_TRAIN = 4096
N_EMBD = 128
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 64
N_FF = 256
RMS_EPS = 1e-6
WEIGHT_STD = 0.1  # large enough that layers dominate the residual: greedy output is not degenerate
NORM_STD = 0.02  # norm weights are 1 + N(0, NORM_STD)
# Small embeddings keep the residual stream dominated by the layers. With tied embeddings
# (gemma2, which also scales them by sqrt(n_embd)) a large token_embd makes every token
# predict itself, and greedy decoding repeats one token forever.
EMBD_STD = 0.01

# Words whose "▁"-prefixed spellings (and every prefix of them, so SPM merges can reach
# them) become vocab pieces after the single characters.
_WORDS = """
    the Once upon time there was small robot and he she it to of in on that with for is
    said day little one they had his her you not but at be from have this were what when
    would could about people world happy big friend play went saw very named house
""".split()


def _vocab() -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-style vocab: specials, 256 byte-fallback tokens, then pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256

    pieces = ["▁"] + [chr(c) for c in range(33, 127)] + [f"▁{c}" for c in string.ascii_letters]
    for word in _WORDS:
        spelled = "▁" + word
        pieces += [spelled[:end] for end in range(3, len(spelled) + 1)]
    pieces = list(dict.fromkeys(pieces))[: N_VOCAB - len(tokens)]
    if len(tokens) + len(pieces) != N_VOCAB:
        raise AssertionError("word list too short to fill the vocab")

    scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
    return tokens + pieces, scores, [int(t) for t in types] + [int(gguf.TokenType.NORMAL)] * len(pieces)


class _Model:
    """A GGUFWriter plus seeded tensor helpers; tensor shapes are given in ggml order."""

    def __init__(self, arch: str, seed: int, n_layer: int) -> None:
        self.arch = arch
        self.seed = seed
        self.n_layer = n_layer
        self.writer = gguf.GGUFWriter(None, arch)

    def hparams(self, values: dict[str, int | float | bool]) -> None:
        """Add ``<arch>.<key>`` entries: bool -> bool, int -> uint32, float -> float32."""
        for key, value in values.items():
            full = f"{self.arch}.{key}"
            if isinstance(value, bool):
                self.writer.add_bool(full, value)
            elif isinstance(value, int):
                self.writer.add_uint32(full, value)
            else:
                self.writer.add_float32(full, float(value))

    def _rng(self, name: str) -> np.random.Generator:
        # the per-tensor stream depends only on (seed, tensor name): stable under reordering
        return np.random.default_rng((self.seed, zlib.crc32(name.encode())))

    def _add(self, name: str, data: np.ndarray) -> None:
        self.writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))

    def normal(self, name: str, *ggml_shape: int, mean: float = 0.0, std: float = WEIGHT_STD) -> None:
        self._add(name, mean + std * self._rng(name).standard_normal(ggml_shape[::-1]))

    def norm(self, name: str, *ggml_shape: int) -> None:
        self.normal(name, *ggml_shape, mean=1.0, std=NORM_STD)

    def negative(self, name: str, *ggml_shape: int) -> None:
        """SSM decay rates A = -exp(U(0, 2)), i.e. in [-7.4, -1]: state decays, never grows."""
        self._add(name, -np.exp(self._rng(name).uniform(0.0, 2.0, ggml_shape[::-1])))

    def write(self, path: str) -> None:
        self.writer.write_header_to_file(pathlib.Path(path))
        self.writer.write_kv_data_to_file()
        self.writer.write_tensors_to_file()
        self.writer.close()


# ---------------------------------------------------------------- shared pieces


def _common(
    m: _Model,
    *,
    n_layer: int,
    n_head: int = N_HEAD,
    n_head_kv: int = N_HEAD_KV,
    key_length: int = HEAD_DIM,
    value_length: int = HEAD_DIM,
    n_rot: int = HEAD_DIM,
    tied: bool = False,
    attention: bool = True,
    name: str | None = None,
) -> None:
    """Vocab, the hparams every family reads, embeddings and the output head.
    `attention=False` (a recurrent-only model) writes no attention or rope keys."""
    w = m.writer
    w.add_name(name or f"skippy-synth-{m.arch}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, scores, types = _vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    keys = {
        "context_length": N_CTX_TRAIN,
        "embedding_length": N_EMBD,
        "block_count": n_layer,
        "feed_forward_length": N_FF,
        "attention.head_count": n_head,
        "attention.head_count_kv": n_head_kv,
        "attention.key_length": key_length,
        "attention.value_length": value_length,
        "attention.layer_norm_rms_epsilon": RMS_EPS,
        "rope.dimension_count": n_rot,
        "rope.freq_base": 10000.0,
    }
    general = ("context_length", "embedding_length", "block_count", "attention.layer_norm_rms_epsilon")
    m.hparams({k: v for k, v in keys.items() if attention or k in general})

    m.normal("token_embd.weight", N_EMBD, N_VOCAB, std=EMBD_STD)
    m.norm("output_norm.weight", N_EMBD)
    if not tied:
        m.normal("output.weight", N_EMBD, N_VOCAB)


def _attention(m: _Model, i: int, *, q_width: int = N_HEAD * HEAD_DIM, n_head: int = N_HEAD,
               n_head_kv: int = N_HEAD_KV, bias: bool = False) -> None:
    """Separate Q/K/V/O projections of a GQA block (create_tensor_qkv + wo); `bias`: Q/K/V biases."""
    p = f"blk.{i}."
    kv_width = n_head_kv * HEAD_DIM
    m.normal(p + "attn_q.weight", N_EMBD, q_width)
    m.normal(p + "attn_k.weight", N_EMBD, kv_width)
    m.normal(p + "attn_v.weight", N_EMBD, kv_width)
    if bias:
        m.normal(p + "attn_q.bias", q_width)
        m.normal(p + "attn_k.bias", kv_width)
        m.normal(p + "attn_v.bias", kv_width)
    m.normal(p + "attn_output.weight", n_head * HEAD_DIM, N_EMBD)


def _swiglu_ffn(m: _Model, i: int, n_ff: int = N_FF, suffix: str = "") -> None:
    """Gate/up/down of a SwiGLU FFN; suffix "_shexp" gives the shared-expert variant."""
    p = f"blk.{i}."
    m.normal(p + f"ffn_gate{suffix}.weight", N_EMBD, n_ff)
    m.normal(p + f"ffn_up{suffix}.weight", N_EMBD, n_ff)
    m.normal(p + f"ffn_down{suffix}.weight", n_ff, N_EMBD)


# ---------------------------------------------------------------- one builder per family


def _build_llama(m: _Model) -> None:
    """Dense GQA: 4 query heads share 2 KV heads."""
    n_layer = m.n_layer
    _common(m, n_layer=n_layer)
    for i in range(n_layer):
        m.norm(f"blk.{i}.attn_norm.weight", N_EMBD)
        _attention(m, i)
        m.norm(f"blk.{i}.ffn_norm.weight", N_EMBD)
        _swiglu_ffn(m, i)


def _build_gemma2(m: _Model) -> None:
    """ISWA: even layers sliding-window (8 tokens), odd layers global; tied embeddings."""
    n_layer = m.n_layer
    _common(m, n_layer=n_layer, tied=True)  # gemma2 never reads output.weight: it must be absent
    m.hparams({
        "attention.sliding_window": 8,
        "attention.sliding_window_pattern": 2,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    })
    for i in range(n_layer):
        p = f"blk.{i}."
        m.norm(p + "attn_norm.weight", N_EMBD)
        _attention(m, i)
        m.norm(p + "post_attention_norm.weight", N_EMBD)
        m.norm(p + "ffn_norm.weight", N_EMBD)
        _swiglu_ffn(m, i)
        m.norm(p + "post_ffw_norm.weight", N_EMBD)


def _build_deepseek2(m: _Model) -> None:
    """MLA, all layers dense: the cache holds one 576-wide K row (latent + rope) per token."""
    n_layer, n_head = m.n_layer, 2
    kv_lora_rank, n_rot = 512, 64
    k_mla, v_mla = 128, 64  # per-head q/k = 64 nope + 64 rope; per-head v = 64
    _common(
        m, n_layer=n_layer, n_head=n_head, n_head_kv=1,
        key_length=kv_lora_rank + n_rot, value_length=kv_lora_rank, n_rot=n_rot,
    )
    m.hparams({
        "attention.q_lora_rank": 0,
        "attention.kv_lora_rank": kv_lora_rank,
        "attention.key_length_mla": k_mla,
        "attention.value_length_mla": v_mla,
        "leading_dense_block_count": n_layer,
        "expert_feed_forward_length": 64,  # read unconditionally, unused without MoE layers
        "expert_shared_count": 1,
    })
    for i in range(n_layer):
        p = f"blk.{i}."
        m.norm(p + "attn_norm.weight", N_EMBD)
        m.normal(p + "attn_q.weight", N_EMBD, n_head * k_mla)
        m.normal(p + "attn_kv_a_mqa.weight", N_EMBD, kv_lora_rank + n_rot)
        m.norm(p + "attn_kv_a_norm.weight", kv_lora_rank)
        m.normal(p + "attn_k_b.weight", k_mla - n_rot, kv_lora_rank, n_head)
        m.normal(p + "attn_v_b.weight", kv_lora_rank, v_mla, n_head)
        m.normal(p + "attn_output.weight", n_head * v_mla, N_EMBD)
        m.norm(p + "ffn_norm.weight", N_EMBD)
        _swiglu_ffn(m, i)


def _build_falcon_h1(m: _Model) -> None:
    """Every layer runs attention and a Mamba2 mixer in parallel (KV cache + recurrent state)."""
    n_layer = m.n_layer
    d_conv, d_inner, d_state, n_ssm_head, n_group = 4, 128, 128, 8, 1
    conv_dim = d_inner + 2 * n_group * d_state
    _common(m, n_layer=n_layer)
    m.hparams({
        "ssm.conv_kernel": d_conv,
        "ssm.inner_size": d_inner,
        "ssm.state_size": d_state,
        "ssm.time_step_rank": n_ssm_head,
        "ssm.group_count": n_group,
    })
    for i in range(n_layer):
        p = f"blk.{i}."
        m.norm(p + "attn_norm.weight", N_EMBD)
        _attention(m, i)
        m.normal(p + "ssm_in.weight", N_EMBD, d_inner + conv_dim + n_ssm_head)  # z | xBC | dt
        m.normal(p + "ssm_conv1d.weight", d_conv, conv_dim)
        m.normal(p + "ssm_conv1d.bias", conv_dim)  # without it the first decode segfaults
        m.normal(p + "ssm_dt.bias", n_ssm_head)
        m.negative(p + "ssm_a", 1, n_ssm_head)
        m.norm(p + "ssm_d", 1, n_ssm_head)
        m.norm(p + "ssm_norm.weight", d_inner // n_group, n_group)
        m.normal(p + "ssm_out.weight", d_inner, N_EMBD)
        m.norm(p + "ffn_norm", N_EMBD)  # no ".weight" suffix for falcon-h1
        _swiglu_ffn(m, i)


def _build_qwen3next(m: _Model) -> None:
    """Even layers are gated delta-net (recurrent), odd layers gated attention; MoE FFN."""
    n_layer, interval = m.n_layer, 2
    d_conv, d_state, n_k_head, n_v_head = 4, 32, 2, 4
    key_dim, value_dim = d_state * n_k_head, d_state * n_v_head
    n_expert, n_ff_exp, n_ff_shexp = 4, 64, 128
    _common(m, n_layer=n_layer, n_rot=16)  # partial rotary, as in the real model
    m.hparams({
        "full_attention_interval": interval,
        "ssm.conv_kernel": d_conv,
        "ssm.inner_size": value_dim,  # must equal state_size * time_step_rank
        "ssm.state_size": d_state,
        "ssm.time_step_rank": n_v_head,
        "ssm.group_count": n_k_head,
        "expert_count": n_expert,
        "expert_used_count": 2,
        "expert_feed_forward_length": n_ff_exp,
        "expert_shared_feed_forward_length": n_ff_shexp,
    })
    for i in range(n_layer):
        p = f"blk.{i}."
        m.norm(p + "attn_norm.weight", N_EMBD)
        m.norm(p + "post_attention_norm.weight", N_EMBD)
        if (i + 1) % interval == 0:
            _attention(m, i, q_width=2 * N_HEAD * HEAD_DIM)  # query and output gate
            m.norm(p + "attn_q_norm.weight", HEAD_DIM)
            m.norm(p + "attn_k_norm.weight", HEAD_DIM)
        else:
            m.normal(p + "attn_qkv.weight", N_EMBD, 2 * key_dim + value_dim)
            m.normal(p + "attn_gate.weight", N_EMBD, value_dim)
            m.normal(p + "ssm_conv1d.weight", d_conv, 2 * key_dim + value_dim)
            m.normal(p + "ssm_dt.bias", n_v_head)
            m.negative(p + "ssm_a", n_v_head)
            m.normal(p + "ssm_ba.weight", N_EMBD, 2 * n_v_head)
            m.norm(p + "ssm_norm.weight", d_state)
            m.normal(p + "ssm_out.weight", value_dim, N_EMBD)
        m.normal(p + "ffn_gate_inp.weight", N_EMBD, n_expert)
        m.normal(p + "ffn_gate_exps.weight", N_EMBD, n_ff_exp, n_expert)
        m.normal(p + "ffn_up_exps.weight", N_EMBD, n_ff_exp, n_expert)
        m.normal(p + "ffn_down_exps.weight", n_ff_exp, N_EMBD, n_expert)
        m.normal(p + "ffn_gate_inp_shexp.weight", N_EMBD)
        _swiglu_ffn(m, i, n_ff_shexp, suffix="_shexp")


def _build_qwen2(m: _Model) -> None:
    """Dense GQA with Q/K/V biases; Q is n_embd wide, so 2 query heads of 64 over 1 KV head."""
    n_layer, n_head = m.n_layer, N_EMBD // HEAD_DIM
    _common(m, n_layer=n_layer, n_head=n_head, n_head_kv=1)
    for i in range(n_layer):
        m.norm(f"blk.{i}.attn_norm.weight", N_EMBD)
        _attention(m, i, q_width=N_EMBD, n_head=n_head, n_head_kv=1, bias=True)
        m.norm(f"blk.{i}.ffn_norm.weight", N_EMBD)
        _swiglu_ffn(m, i)


def _qk_norm_attention(m: _Model, i: int) -> None:
    """Qwen3's attention: GQA with per-head RMS norms on Q and K."""
    p = f"blk.{i}."
    m.norm(p + "attn_norm.weight", N_EMBD)
    _attention(m, i)
    m.norm(p + "attn_q_norm.weight", HEAD_DIM)
    m.norm(p + "attn_k_norm.weight", HEAD_DIM)
    m.norm(p + "ffn_norm.weight", N_EMBD)


def _build_qwen3(m: _Model) -> None:
    """Dense GQA with Q/K norms (Q wider than n_embd: 4 heads of 64 over a 128 embedding)."""
    _common(m, n_layer=m.n_layer)
    for i in range(m.n_layer):
        _qk_norm_attention(m, i)
        _swiglu_ffn(m, i)


def _build_qwen3moe(m: _Model) -> None:
    """Qwen3 attention + a routed MoE FFN (4 experts, 2 used, no shared expert)."""
    n_expert, n_ff_exp = 4, 64
    _common(m, n_layer=m.n_layer)
    m.hparams({"expert_count": n_expert, "expert_used_count": 2, "expert_feed_forward_length": n_ff_exp})
    for i in range(m.n_layer):
        p = f"blk.{i}."
        _qk_norm_attention(m, i)
        m.normal(p + "ffn_gate_inp.weight", N_EMBD, n_expert)
        m.normal(p + "ffn_gate_exps.weight", N_EMBD, n_ff_exp, n_expert)
        m.normal(p + "ffn_up_exps.weight", N_EMBD, n_ff_exp, n_expert)
        m.normal(p + "ffn_down_exps.weight", n_ff_exp, N_EMBD, n_expert)


def _build_phi3(m: _Model) -> None:
    """Fused projections: one attn_qkv matrix (MHA, 2 heads of 64) and one ffn_up holding gate and up."""
    n_layer, n_head = m.n_layer, N_EMBD // HEAD_DIM
    # a general.name containing "phi3" makes llama.cpp's vocab loader look up "<|endoftext|>",
    # which this vocab lacks (the load fails): the name must not say phi3
    _common(m, n_layer=n_layer, n_head=n_head, n_head_kv=n_head, name="skippy-synth-fused-qkv")
    for i in range(n_layer):
        p = f"blk.{i}."
        m.norm(p + "attn_norm.weight", N_EMBD)
        m.normal(p + "attn_qkv.weight", N_EMBD, 3 * N_EMBD)
        m.normal(p + "attn_output.weight", N_EMBD, N_EMBD)
        m.norm(p + "ffn_norm.weight", N_EMBD)
        m.normal(p + "ffn_up.weight", N_EMBD, 2 * N_FF)
        m.normal(p + "ffn_down.weight", N_FF, N_EMBD)


def _build_mamba2(m: _Model) -> None:
    """Recurrent only: every layer a Mamba2 mixer, no attention and no KV cache at all."""
    d_conv, d_inner, d_state, n_ssm_head, n_group = 4, 128, 128, 8, 1
    conv_dim = d_inner + 2 * n_group * d_state
    _common(m, n_layer=m.n_layer, attention=False)
    m.hparams({
        "ssm.conv_kernel": d_conv,
        "ssm.inner_size": d_inner,
        "ssm.state_size": d_state,
        "ssm.time_step_rank": n_ssm_head,
        "ssm.group_count": n_group,
    })
    for i in range(m.n_layer):
        p = f"blk.{i}."
        m.norm(p + "attn_norm.weight", N_EMBD)
        m.normal(p + "ssm_in.weight", N_EMBD, d_inner + conv_dim + n_ssm_head)  # z | xBC | dt
        m.normal(p + "ssm_conv1d.weight", d_conv, conv_dim)
        m.normal(p + "ssm_conv1d.bias", conv_dim)
        m.normal(p + "ssm_dt.bias", n_ssm_head)
        m.negative(p + "ssm_a", 1, n_ssm_head)
        m.norm(p + "ssm_d", 1, n_ssm_head)
        m.norm(p + "ssm_norm.weight", d_inner // n_group, n_group)
        m.normal(p + "ssm_out.weight", d_inner, N_EMBD)


_BUILDERS: dict[str, Callable[[_Model], None]] = {
    "llama": _build_llama,
    "gemma2": _build_gemma2,
    "deepseek2": _build_deepseek2,
    "falcon-h1": _build_falcon_h1,
    "qwen3next": _build_qwen3next,
    "qwen2": _build_qwen2,
    "qwen3": _build_qwen3,
    "qwen3moe": _build_qwen3moe,
    "phi3": _build_phi3,
    "mamba2": _build_mamba2,
}
assert tuple(_BUILDERS) == FAMILIES

# Files llama.cpp loads and skippy refuses, for the tests of that refusal: LLaDA is a diffusion
# model with llama's tensors, for which llama.cpp builds no KV memory at all.
REFUSED_FAMILIES: tuple[str, ...] = ("llada",)
_BUILDERS["llada"] = _build_llama


# layers of each family's model; `deep` variants have enough layers to split into 3 stages
N_LAYER: dict[str, int] = {"llama": 2, "gemma2": 2, "deepseek2": 2, "falcon-h1": 2, "qwen3next": 4,
                           "qwen2": 2, "qwen3": 2, "qwen3moe": 2, "phi3": 2, "mamba2": 2, "llada": 2}
N_LAYER_DEEP: dict[str, int] = {**{f: 6 for f in N_LAYER}, "qwen3next": 8}


def write_synthetic(family: str, path: os.PathLike[str] | str, seed: int = 0, deep: bool = False) -> pathlib.Path:
    """Write the tiny model for `family` to `path` (atomically: temp file + os.replace).

    Same (family, seed, deep, GENERATOR_VERSION) -> byte-identical file. Unknown family ->
    UnknownFamilyError (a ValueError) naming the valid ones.
    """
    if family not in _BUILDERS:
        raise UnknownFamilyError(f"unknown family {family!r}; valid families: {', '.join(FAMILIES)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidInputError(f"seed must be a non-negative int, got {seed!r}")

    out = pathlib.Path(path)
    model = _Model(family, seed, (N_LAYER_DEEP if deep else N_LAYER)[family])
    _BUILDERS[family](model)

    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        model.write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return out
