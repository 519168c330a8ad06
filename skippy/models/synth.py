"""Tiny, seeded, random-weight GGUF models: one per llama.cpp KV-cache structural class.

Why: tests of the KV/memory code paths need real model files that the pinned llama.cpp
loads *and decodes*, covering each memory layout it implements -- dense GQA cache
(``llama``), sliding-window ISWA cache (``gemma2``), MLA K-only cache (``deepseek2``),
Mamba2 + attention hybrid (``falcon-h1``) and gated-delta-net + attention hybrid
(``qwen3next``), recurrent-only Mamba2 (``mamba2``) -- and the weight layouts popular
architectures add on top: Q/K/V biases (``qwen2``), Q/K norms (``qwen3``), routed experts
(``qwen3moe``), fused QKV and gate+up projections (``phi3``), embedding/residual/attention/logit
multipliers (``granite``), post-norms with full-width Q/K norms (``olmo2``), LayerNorm with biases
and a GELU FFN (``starcoder2``), attention sinks over sliding-window layers with a biased MoE
(``gpt-oss``); plus one file skippy must refuse
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

import itertools
import os
import pathlib
import string
import tempfile
import zlib
from collections.abc import Callable
from typing import Any

import attrs
import gguf
import gguf.quants
import numpy as np

from ..errors import InvalidInputError, UnknownFamilyError

FAMILIES: tuple[str, ...] = (
    "llama", "gemma2", "deepseek2", "falcon-h1", "qwen3next",  # one per KV class of the original five
    "qwen2", "qwen3", "qwen3moe", "phi3", "mamba2",  # more architectures: biases, q/k norms, MoE, fused, recurrent-only
    "granite", "olmo2", "starcoder2", "gpt-oss",  # scaling multipliers, post-norms, LayerNorm + biases, sinks + SWA MoE
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
Q8_0_BLOCK = 32
WEIGHT_STD = 0.1  # large enough that layers dominate the residual: greedy output is not degenerate
NORM_STD = 0.02  # norm weights are 1 + N(0, NORM_STD)
# Small embeddings keep the residual stream dominated by the layers. With tied embeddings
# (gemma2, which also scales them by sqrt(n_embd)) a large token_embd makes every token
# predict itself, and greedy decoding repeats one token forever.
EMBD_STD = 0.01



@attrs.frozen
class Dims:
    """The shape of one model: tiny by default (the module constants); `extra` holds each
    family's own dims (SSM, MLA, experts), read with `_Model.x` and its tiny default."""

    n_vocab: int = N_VOCAB
    n_embd: int = N_EMBD
    n_head: int = N_HEAD
    n_head_kv: int = N_HEAD_KV
    head_dim: int = HEAD_DIM
    n_ff: int = N_FF
    weight_std: float = WEIGHT_STD
    extra: dict[str, Any] = attrs.field(factory=dict, hash=False)


TINY = Dims()

# Words whose "▁"-prefixed spellings (and every prefix of them, so SPM merges can reach
# them) become vocab pieces after the single characters.
_WORDS = """
    the Once upon time there was small robot and he she it to of in on that with for is
    said day little one they had his her you not but at be from have this were what when
    would could about people world happy big friend play went saw very named house
""".split()


def _vocab(n_vocab: int = N_VOCAB) -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-style vocab: specials, 256 byte-fallback tokens, then pieces; past the
    tiny 512, filler pieces "▁aa", "▁ab", ... up to `n_vocab` (a realistic output head)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256

    pieces = ["▁"] + [chr(c) for c in range(33, 127)] + [f"▁{c}" for c in string.ascii_letters]
    for word in _WORDS:
        spelled = "▁" + word
        pieces += [spelled[:end] for end in range(3, len(spelled) + 1)]
    pieces = list(dict.fromkeys(pieces))[: N_VOCAB - len(tokens)]
    if n_vocab > N_VOCAB:
        pieces += _filler(set(pieces), n_vocab - N_VOCAB)
    if len(tokens) + len(pieces) != n_vocab:
        raise AssertionError("word list too short to fill the vocab")

    scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
    return tokens + pieces, scores, [int(t) for t in types] + [int(gguf.TokenType.NORMAL)] * len(pieces)


def _filler(taken: set[str], count: int) -> list[str]:
    """`count` new "▁"-prefixed lowercase pieces, shortest first, none already in `taken`."""
    out: list[str] = []
    for length in itertools.count(2):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            piece = "▁" + "".join(letters)
            if piece not in taken:
                out.append(piece)
                if len(out) == count:
                    return out
    raise AssertionError("unreachable")


def _quantizable(name: str, shape: tuple[int, ...]) -> bool:
    """llama-quantize's rule (src/llama-quant.cpp): matrices and expert stacks named *weight, not
    norms, routers or SSM convolutions, whose rows fill whole blocks."""
    n_dims = len(shape) - next((i for i, n in enumerate(shape) if n > 1), len(shape))  # ggml_n_dims
    excluded = ("_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d")
    return (n_dims >= 2 and name.endswith("weight") and not any(x in name for x in excluded)
            and shape[-1] % Q8_0_BLOCK == 0)


class _Model:
    """A GGUFWriter plus seeded tensor helpers; tensor shapes are given in ggml order."""

    def __init__(self, arch: str, seed: int, n_layer: int, dims: Dims = TINY, q8_0: bool = False) -> None:
        self.arch = arch
        self.seed = seed
        self.n_layer = n_layer
        self.d = dims
        self.q8_0 = q8_0  # matrices stored as Q8_0 (gguf.quants), vectors stay F32
        self.writer = gguf.GGUFWriter(None, arch)

    def x(self, name: str, tiny: Any) -> Any:
        """A family-specific dim: the size's value, else the tiny model's."""
        return self.d.extra.get(name, tiny)

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
        data = np.ascontiguousarray(data, dtype=np.float32)
        if self.q8_0 and _quantizable(name, data.shape):
            q = gguf.GGMLQuantizationType.Q8_0
            self.writer.add_tensor(name, gguf.quants.quantize(data, q), raw_dtype=q)
        else:
            self.writer.add_tensor(name, data)

    def normal(self, name: str, *ggml_shape: int, mean: float = 0.0, std: float | None = None) -> None:
        std = self.d.weight_std if std is None else std
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
    n_head: int | None = None,
    n_head_kv: int | None = None,
    key_length: int | None = None,
    value_length: int | None = None,
    n_rot: int | None = None,
    tied: bool = False,
    attention: bool = True,
    name: str | None = None,
) -> None:
    """Vocab, the hparams every family reads, embeddings and the output head.
    `attention=False` (a recurrent-only model) writes no attention or rope keys. Head counts and
    sizes default to the model's dims."""
    d = m.d
    n_head = d.n_head if n_head is None else n_head
    n_head_kv = d.n_head_kv if n_head_kv is None else n_head_kv
    key_length = d.head_dim if key_length is None else key_length
    value_length = d.head_dim if value_length is None else value_length
    n_rot = d.head_dim if n_rot is None else n_rot
    w = m.writer
    w.add_name(name or f"skippy-synth-{m.arch}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if m.q8_0 else gguf.LlamaFileType.ALL_F32)
    tokens, scores, types = _vocab(d.n_vocab)
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
        "embedding_length": d.n_embd,
        "block_count": n_layer,
        "feed_forward_length": d.n_ff,
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

    m.normal("token_embd.weight", d.n_embd, d.n_vocab, std=EMBD_STD)
    m.norm("output_norm.weight", d.n_embd)
    if not tied:
        m.normal("output.weight", d.n_embd, d.n_vocab)


def _attention(m: _Model, i: int, *, q_width: int | None = None, n_head: int | None = None,
               n_head_kv: int | None = None, bias: bool = False) -> None:
    """Separate Q/K/V/O projections of a GQA block (create_tensor_qkv + wo); `bias`: Q/K/V biases.
    Widths default to the model's dims."""
    p, d = f"blk.{i}.", m.d
    n_head = d.n_head if n_head is None else n_head
    n_head_kv = d.n_head_kv if n_head_kv is None else n_head_kv
    q_width = n_head * d.head_dim if q_width is None else q_width
    kv_width = n_head_kv * d.head_dim
    m.normal(p + "attn_q.weight", d.n_embd, q_width)
    m.normal(p + "attn_k.weight", d.n_embd, kv_width)
    m.normal(p + "attn_v.weight", d.n_embd, kv_width)
    if bias:
        m.normal(p + "attn_q.bias", q_width)
        m.normal(p + "attn_k.bias", kv_width)
        m.normal(p + "attn_v.bias", kv_width)
    m.normal(p + "attn_output.weight", n_head * d.head_dim, d.n_embd)


def _swiglu_ffn(m: _Model, i: int, n_ff: int | None = None, suffix: str = "") -> None:
    """Gate/up/down of a SwiGLU FFN; suffix "_shexp" gives the shared-expert variant."""
    p, n_embd = f"blk.{i}.", m.d.n_embd
    n_ff = m.d.n_ff if n_ff is None else n_ff
    m.normal(p + f"ffn_gate{suffix}.weight", n_embd, n_ff)
    m.normal(p + f"ffn_up{suffix}.weight", n_embd, n_ff)
    m.normal(p + f"ffn_down{suffix}.weight", n_ff, n_embd)


def _moe_ffn(m: _Model, i: int, n_expert: int, n_ff_exp: int) -> None:
    """Router and routed experts (gate/up/down stacked per expert)."""
    p, n_embd = f"blk.{i}.", m.d.n_embd
    m.normal(p + "ffn_gate_inp.weight", n_embd, n_expert)
    m.normal(p + "ffn_gate_exps.weight", n_embd, n_ff_exp, n_expert)
    m.normal(p + "ffn_up_exps.weight", n_embd, n_ff_exp, n_expert)
    m.normal(p + "ffn_down_exps.weight", n_ff_exp, n_embd, n_expert)


# ---------------------------------------------------------------- one builder per family


def _build_llama(m: _Model) -> None:
    """Dense GQA: 4 query heads share 2 KV heads."""
    n_layer = m.n_layer
    _common(m, n_layer=n_layer)
    for i in range(n_layer):
        m.norm(f"blk.{i}.attn_norm.weight", m.d.n_embd)
        _attention(m, i)
        m.norm(f"blk.{i}.ffn_norm.weight", m.d.n_embd)
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
        m.norm(p + "attn_norm.weight", m.d.n_embd)
        _attention(m, i)
        m.norm(p + "post_attention_norm.weight", m.d.n_embd)
        m.norm(p + "ffn_norm.weight", m.d.n_embd)
        _swiglu_ffn(m, i)
        m.norm(p + "post_ffw_norm.weight", m.d.n_embd)


def _build_deepseek2(m: _Model) -> None:
    """MLA: the cache holds one 576-wide K row (latent + rope) per token. Tiny: all layers dense;
    with `n_expert` (base) the layers after `n_dense_lead` are MoE with shared experts, as in V2-Lite."""
    n_layer, n_head = m.n_layer, m.x("n_head", 2)
    kv_lora_rank, n_rot = m.x("kv_lora_rank", 512), m.x("n_rot", 64)
    k_mla, v_mla = m.x("k_mla", 128), m.x("v_mla", 64)  # tiny: per-head q/k = 64 nope + 64 rope; v = 64
    n_expert, n_ff_exp, n_shared = m.x("n_expert", 0), m.x("n_ff_exp", 64), m.x("n_expert_shared", 1)
    n_dense = m.x("n_dense_lead", n_layer)
    _common(
        m, n_layer=n_layer, n_head=n_head, n_head_kv=1,
        key_length=kv_lora_rank + n_rot, value_length=kv_lora_rank, n_rot=n_rot,
    )
    m.hparams({
        "attention.q_lora_rank": 0,
        "attention.kv_lora_rank": kv_lora_rank,
        "attention.key_length_mla": k_mla,
        "attention.value_length_mla": v_mla,
        "leading_dense_block_count": n_dense,
        "expert_feed_forward_length": n_ff_exp,  # read unconditionally, unused without MoE layers
        "expert_shared_count": n_shared,
    })
    if n_expert:
        m.hparams({"expert_count": n_expert, "expert_used_count": m.x("n_expert_used", 2),
                   "expert_weights_scale": 1.0})
    for i in range(n_layer):
        p = f"blk.{i}."
        m.norm(p + "attn_norm.weight", m.d.n_embd)
        m.normal(p + "attn_q.weight", m.d.n_embd, n_head * k_mla)
        m.normal(p + "attn_kv_a_mqa.weight", m.d.n_embd, kv_lora_rank + n_rot)
        m.norm(p + "attn_kv_a_norm.weight", kv_lora_rank)
        m.normal(p + "attn_k_b.weight", k_mla - n_rot, kv_lora_rank, n_head)
        m.normal(p + "attn_v_b.weight", kv_lora_rank, v_mla, n_head)
        m.normal(p + "attn_output.weight", n_head * v_mla, m.d.n_embd)
        m.norm(p + "ffn_norm.weight", m.d.n_embd)
        if i < n_dense:
            _swiglu_ffn(m, i)
        else:
            _moe_ffn(m, i, n_expert, n_ff_exp)
            _swiglu_ffn(m, i, n_ff_exp * n_shared, suffix="_shexp")


def _build_falcon_h1(m: _Model) -> None:
    """Every layer runs attention and a Mamba2 mixer in parallel (KV cache + recurrent state)."""
    n_layer = m.n_layer
    d_conv, d_state, n_group = m.x("d_conv", 4), m.x("d_state", 128), m.x("n_group", 1)
    d_inner, n_ssm_head = m.x("d_inner", 128), m.x("n_ssm_head", 8)
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
        m.norm(p + "attn_norm.weight", m.d.n_embd)
        _attention(m, i)
        m.normal(p + "ssm_in.weight", m.d.n_embd, d_inner + conv_dim + n_ssm_head)  # z | xBC | dt
        m.normal(p + "ssm_conv1d.weight", d_conv, conv_dim)
        m.normal(p + "ssm_conv1d.bias", conv_dim)  # without it the first decode segfaults
        m.normal(p + "ssm_dt.bias", n_ssm_head)
        m.negative(p + "ssm_a", 1, n_ssm_head)
        m.norm(p + "ssm_d", 1, n_ssm_head)
        m.norm(p + "ssm_norm.weight", d_inner // n_group, n_group)
        m.normal(p + "ssm_out.weight", d_inner, m.d.n_embd)
        m.norm(p + "ffn_norm", m.d.n_embd)  # no ".weight" suffix for falcon-h1
        _swiglu_ffn(m, i)


def _build_qwen3next(m: _Model) -> None:
    """Even layers are gated delta-net (recurrent), odd layers gated attention; MoE FFN."""
    n_layer, interval = m.n_layer, m.x("full_attention_interval", 2)
    d_conv, d_state, n_k_head, n_v_head = m.x("d_conv", 4), m.x("d_state", 32), m.x("n_k_head", 2), m.x("n_v_head", 4)
    key_dim, value_dim = d_state * n_k_head, d_state * n_v_head
    n_expert, n_ff_exp, n_ff_shexp = m.x("n_expert", 4), m.x("n_ff_exp", 64), m.x("n_ff_shexp", 128)
    _common(m, n_layer=n_layer, n_rot=m.d.head_dim // 4)  # partial rotary, as in the real model
    m.hparams({
        "full_attention_interval": interval,
        "ssm.conv_kernel": d_conv,
        "ssm.inner_size": value_dim,  # must equal state_size * time_step_rank
        "ssm.state_size": d_state,
        "ssm.time_step_rank": n_v_head,
        "ssm.group_count": n_k_head,
        "expert_count": n_expert,
        "expert_used_count": m.x("n_expert_used", 2),
        "expert_feed_forward_length": n_ff_exp,
        "expert_shared_feed_forward_length": n_ff_shexp,
    })
    for i in range(n_layer):
        p = f"blk.{i}."
        m.norm(p + "attn_norm.weight", m.d.n_embd)
        m.norm(p + "post_attention_norm.weight", m.d.n_embd)
        if (i + 1) % interval == 0:
            _attention(m, i, q_width=2 * m.d.n_head * m.d.head_dim)  # query and output gate
            m.norm(p + "attn_q_norm.weight", m.d.head_dim)
            m.norm(p + "attn_k_norm.weight", m.d.head_dim)
        else:
            m.normal(p + "attn_qkv.weight", m.d.n_embd, 2 * key_dim + value_dim)
            m.normal(p + "attn_gate.weight", m.d.n_embd, value_dim)
            m.normal(p + "ssm_conv1d.weight", d_conv, 2 * key_dim + value_dim)
            m.normal(p + "ssm_dt.bias", n_v_head)
            m.negative(p + "ssm_a", n_v_head)
            m.normal(p + "ssm_ba.weight", m.d.n_embd, 2 * n_v_head)
            m.norm(p + "ssm_norm.weight", d_state)
            m.normal(p + "ssm_out.weight", value_dim, m.d.n_embd)
        _moe_ffn(m, i, n_expert, n_ff_exp)
        m.normal(p + "ffn_gate_inp_shexp.weight", m.d.n_embd)
        _swiglu_ffn(m, i, n_ff_shexp, suffix="_shexp")


def _build_qwen2(m: _Model) -> None:
    """Dense GQA with Q/K/V biases; Q is n_embd wide, so 2 query heads of 64 over 1 KV head."""
    n_layer, n_head = m.n_layer, m.d.n_embd // m.d.head_dim
    _common(m, n_layer=n_layer, n_head=n_head, n_head_kv=1)
    for i in range(n_layer):
        m.norm(f"blk.{i}.attn_norm.weight", m.d.n_embd)
        _attention(m, i, q_width=m.d.n_embd, n_head=n_head, n_head_kv=1, bias=True)
        m.norm(f"blk.{i}.ffn_norm.weight", m.d.n_embd)
        _swiglu_ffn(m, i)


def _qk_norm_attention(m: _Model, i: int) -> None:
    """Qwen3's attention: GQA with per-head RMS norms on Q and K."""
    p = f"blk.{i}."
    m.norm(p + "attn_norm.weight", m.d.n_embd)
    _attention(m, i)
    m.norm(p + "attn_q_norm.weight", m.d.head_dim)
    m.norm(p + "attn_k_norm.weight", m.d.head_dim)
    m.norm(p + "ffn_norm.weight", m.d.n_embd)


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
        m.normal(p + "ffn_gate_inp.weight", m.d.n_embd, n_expert)
        m.normal(p + "ffn_gate_exps.weight", m.d.n_embd, n_ff_exp, n_expert)
        m.normal(p + "ffn_up_exps.weight", m.d.n_embd, n_ff_exp, n_expert)
        m.normal(p + "ffn_down_exps.weight", n_ff_exp, m.d.n_embd, n_expert)


def _build_phi3(m: _Model) -> None:
    """Fused projections: one attn_qkv matrix (MHA, 2 heads of 64) and one ffn_up holding gate and up."""
    n_layer, n_head = m.n_layer, m.d.n_embd // m.d.head_dim
    # a general.name containing "phi3" makes llama.cpp's vocab loader look up "<|endoftext|>",
    # which this vocab lacks (the load fails): the name must not say phi3
    _common(m, n_layer=n_layer, n_head=n_head, n_head_kv=n_head, name="skippy-synth-fused-qkv")
    for i in range(n_layer):
        p = f"blk.{i}."
        m.norm(p + "attn_norm.weight", m.d.n_embd)
        m.normal(p + "attn_qkv.weight", m.d.n_embd, 3 * m.d.n_embd)
        m.normal(p + "attn_output.weight", m.d.n_embd, m.d.n_embd)
        m.norm(p + "ffn_norm.weight", m.d.n_embd)
        m.normal(p + "ffn_up.weight", m.d.n_embd, 2 * m.d.n_ff)
        m.normal(p + "ffn_down.weight", m.d.n_ff, m.d.n_embd)


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
        m.norm(p + "attn_norm.weight", m.d.n_embd)
        m.normal(p + "ssm_in.weight", m.d.n_embd, d_inner + conv_dim + n_ssm_head)  # z | xBC | dt
        m.normal(p + "ssm_conv1d.weight", d_conv, conv_dim)
        m.normal(p + "ssm_conv1d.bias", conv_dim)
        m.normal(p + "ssm_dt.bias", n_ssm_head)
        m.negative(p + "ssm_a", 1, n_ssm_head)
        m.norm(p + "ssm_d", 1, n_ssm_head)
        m.norm(p + "ssm_norm.weight", d_inner // n_group, n_group)
        m.normal(p + "ssm_out.weight", d_inner, m.d.n_embd)


def _build_granite(m: _Model) -> None:
    """Llama's layout with Granite's four multipliers: embeddings scaled up, each sublayer's output
    scaled down before the residual add, a fixed attention scale and logits divided by a constant."""
    _common(m, n_layer=m.n_layer)
    m.hparams({"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.03125, "logit_scale": 4.0})
    for i in range(m.n_layer):
        m.norm(f"blk.{i}.attn_norm.weight", m.d.n_embd)
        _attention(m, i)
        m.norm(f"blk.{i}.ffn_norm.weight", m.d.n_embd)
        _swiglu_ffn(m, i)


def _build_olmo2(m: _Model) -> None:
    """No pre-norms: RMS norms after attention and after the FFN, and Q/K norms over the whole
    projection (n_embd wide), not per head; MHA, 2 heads of 64."""
    n_head = m.d.n_embd // m.d.head_dim
    _common(m, n_layer=m.n_layer, n_head=n_head, n_head_kv=n_head)
    for i in range(m.n_layer):
        p = f"blk.{i}."
        _attention(m, i, q_width=m.d.n_embd, n_head=n_head, n_head_kv=n_head)
        m.norm(p + "attn_q_norm.weight", m.d.n_embd)
        m.norm(p + "attn_k_norm.weight", n_head * m.d.head_dim)
        m.norm(p + "post_attention_norm.weight", m.d.n_embd)
        _swiglu_ffn(m, i)
        m.norm(p + "post_ffw_norm.weight", m.d.n_embd)


def _layer_norm(m: _Model, name: str) -> None:
    """A LayerNorm's weight and bias."""
    m.norm(f"{name}.weight", m.d.n_embd)
    m.normal(f"{name}.bias", m.d.n_embd, std=NORM_STD)


def _build_starcoder2(m: _Model) -> None:
    """LayerNorm (weight + bias) instead of RMS norm, biases on every projection, and a GELU FFN
    without a gate; GQA, 2 query heads of 64 over 1 KV head."""
    n_head = m.d.n_embd // m.d.head_dim
    _common(m, n_layer=m.n_layer, n_head=n_head, n_head_kv=1)
    m.hparams({"attention.layer_norm_epsilon": 1e-5})
    m.normal("output_norm.bias", m.d.n_embd, std=NORM_STD)
    for i in range(m.n_layer):
        p = f"blk.{i}."
        _layer_norm(m, p + "attn_norm")
        _attention(m, i, q_width=m.d.n_embd, n_head=n_head, n_head_kv=1, bias=True)
        m.normal(p + "attn_output.bias", m.d.n_embd)
        _layer_norm(m, p + "ffn_norm")
        m.normal(p + "ffn_up.weight", m.d.n_embd, m.d.n_ff)
        m.normal(p + "ffn_up.bias", m.d.n_ff)
        m.normal(p + "ffn_down.weight", m.d.n_ff, m.d.n_embd)
        m.normal(p + "ffn_down.bias", m.d.n_embd)


def _build_gpt_oss(m: _Model) -> None:
    """gpt-oss: a learnt attention sink per head, sliding-window (8 tokens) even layers and global
    odd ones (an ISWA cache), Q/K/V and output biases, and a routed MoE with biases everywhere
    (4 experts, 2 used, OpenAI's clamped SwiGLU)."""
    n_expert, n_ff_exp = 4, 64
    _common(m, n_layer=m.n_layer)
    m.hparams({"attention.sliding_window": 8, "expert_count": n_expert, "expert_used_count": 2,
               "expert_feed_forward_length": n_ff_exp})
    for i in range(m.n_layer):
        p = f"blk.{i}."
        m.norm(p + "attn_norm.weight", m.d.n_embd)
        _attention(m, i, bias=True)
        m.normal(p + "attn_output.bias", m.d.n_embd)
        m.normal(p + "attn_sinks.weight", m.d.n_head, std=1.0)
        m.norm(p + "post_attention_norm.weight", m.d.n_embd)
        _moe_ffn(m, i, n_expert, n_ff_exp)
        m.normal(p + "ffn_gate_inp.bias", n_expert)
        m.normal(p + "ffn_gate_exps.bias", n_ff_exp, n_expert)
        m.normal(p + "ffn_up_exps.bias", n_ff_exp, n_expert)
        m.normal(p + "ffn_down_exps.bias", m.d.n_embd, n_expert)


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
    "granite": _build_granite,
    "olmo2": _build_olmo2,
    "starcoder2": _build_starcoder2,
    "gpt-oss": _build_gpt_oss,
}
assert tuple(_BUILDERS) == FAMILIES

# Files llama.cpp loads and skippy refuses, for the tests of that refusal: LLaDA is a diffusion
# model with llama's tensors, for which llama.cpp builds no KV memory at all.
REFUSED_FAMILIES: tuple[str, ...] = ("llada",)
_BUILDERS["llada"] = _build_llama


# layers of each family's model; `deep` variants have enough layers to split into 3 stages
N_LAYER: dict[str, int] = {"llama": 2, "gemma2": 2, "deepseek2": 2, "falcon-h1": 2, "qwen3next": 4,
                           "qwen2": 2, "qwen3": 2, "qwen3moe": 2, "phi3": 2, "mamba2": 2, "llada": 2,
                           "granite": 2, "olmo2": 2, "starcoder2": 2, "gpt-oss": 2}
N_LAYER_DEEP: dict[str, int] = {**{f: 6 for f in N_LAYER}, "qwen3next": 8}


# ---------------------------------------------------------------- sizes

SIZES: tuple[str, ...] = ("tiny", "base")
# base: seeded random weights in the dims of a small real model of the family (~200-300M
# parameters), so that per-token compute and KV/state bytes resemble what users run. Vocabularies
# are 32768 pieces (the real ones: 32784 Falcon-H1, 102400 DeepSeek-V2, 151936 Qwen3-Next) to
# keep the output head in proportion; weights are scaled by sqrt(128 / n_embd) so each layer's
# gain matches the tiny models'. llama (SmolLM2) and gemma3 (Gemma-3-270M) have real files.
_BASE_STD = WEIGHT_STD * (N_EMBD / 1024) ** 0.5
BASE: dict[str, tuple[int, Dims]] = {
    # DeepSeek-V2-Lite (2048 wide, 27 layers, 16 heads, MLA kv_lora 512 + rope 64, q/k 128 nope + 64
    # rope, v 128, first layer dense, 64 routed experts of 1408 (6 used) + 2 shared): the MLA dims
    # as they are, width, heads, depth and experts scaled down
    "deepseek2": (12, Dims(n_vocab=32768, n_embd=1024, n_head=8, n_head_kv=1, head_dim=128, n_ff=2816,
                           weight_std=_BASE_STD,
                           extra=dict(n_head=8, kv_lora_rank=512, n_rot=64, k_mla=192, v_mla=128, n_expert=16,
                                      n_expert_used=4, n_ff_exp=256, n_expert_shared=2, n_dense_lead=1))),
    # Falcon-H1-0.5B (1024 wide, 36 layers, 8 heads of 64 over 2 KV heads, FFN 2048, Mamba2 mixer of
    # 1536 inner = 24 heads of 64, state 128, 1 group, conv 4, in parallel with attention in every
    # layer): every dim as it is, 16 of its 36 layers
    "falcon-h1": (16, Dims(n_vocab=32768, n_embd=1024, n_head=8, n_head_kv=2, head_dim=64, n_ff=2048,
                           weight_std=_BASE_STD,
                           extra=dict(d_conv=4, d_inner=1536, d_state=128, n_ssm_head=24, n_group=1))),
    # Qwen3-Next-80B-A3B (2048 wide, 48 layers, full attention every 4th layer, 16 gated heads of 256
    # over 2 KV heads, gated delta-net with 16 K heads and 32 V heads of 128, conv 4, 512 experts of
    # 512 (10 used) + a shared one of 512): the layout and the interval as they are, scaled to 1024 wide
    "qwen3next": (12, Dims(n_vocab=32768, n_embd=1024, n_head=8, n_head_kv=2, head_dim=128, n_ff=512,
                           weight_std=_BASE_STD,
                           extra=dict(full_attention_interval=4, d_conv=4, d_state=128, n_k_head=4, n_v_head=8,
                                      n_expert=16, n_expert_used=4, n_ff_exp=256, n_ff_shexp=512))),
}
BASE_QUANT = "Q4_K_M"  # what users run; Q8_0 (gguf-py) where the native quantizer is not built


def base_quant() -> str:
    """Q4_K_M through the native build's llama_model_quantize, else Q8_0 written by gguf-py."""
    from ._quantize import native_quantizer_available

    return BASE_QUANT if native_quantizer_available() else "Q8_0"


def _check(family: str, seed: int) -> None:
    if family not in _BUILDERS:
        raise UnknownFamilyError(f"unknown family {family!r}; valid families: {', '.join(FAMILIES)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidInputError(f"seed must be a non-negative int, got {seed!r}")


def _write_atomic(model: _Model, out: pathlib.Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        model.write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def write_sized(family: str, path: os.PathLike[str] | str, n_layer: int, dims: Dims, seed: int = 0,
                quant: str | None = None) -> pathlib.Path:
    """Write `family` in any shape, atomically. `quant`: None (F32), "Q8_0" (gguf-py, no native
    code) or a llama.cpp mixture such as "Q4_K_M" (the native quantizer, from an F32 temp file)."""
    _check(family, seed)
    out = pathlib.Path(path)
    if quant in (None, "Q8_0"):
        model = _Model(family, seed, n_layer, dims, q8_0=quant == "Q8_0")
        _BUILDERS[family](model)
        _write_atomic(model, out)
        return out
    from ._quantize import quantize

    with tempfile.TemporaryDirectory(prefix=".synth-", dir=out.parent) as tmp:
        f32 = pathlib.Path(tmp) / "f32.gguf"
        write_sized(family, f32, n_layer, dims, seed)
        staged = pathlib.Path(tmp) / "quant.gguf"
        quantize(f32, staged, quant)
        os.chmod(staged, 0o644)
        os.replace(staged, out)
    return out


def write_synthetic(family: str, path: os.PathLike[str] | str, seed: int = 0, deep: bool = False,
                    size: str = "tiny", quant: str | None = None) -> pathlib.Path:
    """Write the model for `family` to `path` (atomically: temp file + os.replace).

    size "tiny" (default): the few-MB F32 model; same (family, seed, deep, GENERATOR_VERSION) ->
    byte-identical file. size "base": BASE's realistic shape, quantized (`quant`, default
    base_quant()); seconds to write. Unknown family -> UnknownFamilyError (a ValueError)
    naming the valid ones.
    """
    if size not in SIZES:
        raise InvalidInputError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    if size == "tiny":
        _check(family, seed)
        return write_sized(family, path, (N_LAYER_DEEP if deep else N_LAYER)[family], TINY, seed, quant)
    if family not in BASE:
        raise UnknownFamilyError(f"no base size for {family!r}; base families: {', '.join(BASE)} (llama and "
                                 "gemma3 have real small models: `skippy models fetch smollm2|gemma3`)")
    if deep:
        raise InvalidInputError("the base size has one depth; deep applies to tiny models")
    n_layer, dims = BASE[family]
    return write_sized(family, path, n_layer, dims, seed, quant or base_quant())
