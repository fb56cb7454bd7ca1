"""Gemma 3 text models (transformers' Gemma3ForCausalLM, model_type "gemma3_text") in the compact transformer's frame.

Same interface as specdec.models.transformer.Transformer (forward, forward_ragged, new_cache, accounting), and the
same machinery: Linear at fp32/fp16/int8/bf16, the position-addressed fp32 KVCache, the ragged pass padded to
rectangles. What differs from a Llama block, each checked against transformers' modeling_gemma3 by
tests/test_gemma3.py:

  - the embeddings are scaled by sqrt(hidden) (an fp32 product, as transformers computes it at fp32); the table is
    stored scaled, and the tied LM head is built from the unscaled one
  - RMSNorm multiplies by (1 + w): `1 + w` is stored once, so rms_norm() is the Llama one
  - four norms per layer: input; post_attention, on the attention output before the residual add; pre_feedforward;
    post_feedforward, on the MLP output before the add. q and k get an RMSNorm per head, before RoPE
  - GeGLU: gelu (tanh approximation) of the gate, times up
  - scores are scaled by query_pre_attn_scalar^-1/2, not head_dim^-1/2 (the same number for the 270M)
  - sliding-window layers (cfg.layer_types): a query at position p sees keys in (p - window, p]; their RoPE base
    is rope_local_theta (10000), the full layers' is rope_theta (1e6). The full layers of Gemma 3 4B, 12B and 27B
    scale RoPE linearly (rope_scaling_factor 8: their frequencies divided by it); the sliding layers never do

Gemma 2 (Gemma2ForCausalLM, model_type "gemma2") is the same block without the q/k norms, with its attention
scores and its logits soft-capped (cap * tanh(x / cap): cfg.attn_softcap, cfg.final_softcap), alternate layers
sliding and one RoPE base for all; checked against transformers' modeling_gemma2 by tests/test_architectures.py.

At gguf-q16 and gguf-q8 every pass (decode, verify, prefill) runs all the blocks in one call of the native
kernels, as a Llama model's do (Transformer.forward_ragged): the products on the GGUF's own blocks, and the block's
Gemma parts in C++ (kernels/common.h, BlockVariant: q/k norms, the two post-norms, GELU, the scale, the window in
kernels/attention.cpp, and each layer's own RoPE table). Its rows are batch-invariant, so a verify pass equals
one-token passes bit for bit and a prefix cache is exact (exact_kv_reuse). At fp32/fp16/int8/bf16, the torch path
(kernels = None): decode and verify passes use the chunked, batch-invariant attention of attention.attend_decode
with the window added to its mask; prefill uses torch's fused attention; exact_kv_reuse is False. Both caches keep
every position, sliding layers included (a ring of `window` positions would save memory, not reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.errors import SpecdecError
from specdec.inputs import number
from specdec.models.attention import RopeTable, attend_decode, attend_prefill, rms_norm, rotate
from specdec.models.config import ACT_BITS, ModelConfig, check_sizes
from specdec.models.gguf.plane_cache import mapped
from specdec.models.gguf.weights import RowLookup, release_pages
from specdec.models.hugepages import Arena
from specdec.models.kv_cache import slot_picker, write_kv
from specdec.models.linear import GgufLinear, Linear
from specdec.models.transformer import Transformer, tap

MODEL_TYPE = "gemma3_text"
GEMMA2 = "gemma2"  # Gemma 2 runs here too: no q/k norms, soft-capped scores and logits (attn_softcap, ...)
SLIDING, FULL = "sliding_attention", "full_attention"
TORCH_PRECISIONS = ("fp32", "fp16", "int8", "bf16")  # Linear's
GGUF_BLOCK_PRECISIONS = tuple(ACT_BITS)  # GgufLinear's: gguf-q16, gguf-q8 (the exact "gguf" reads no K-quant)


@dataclass(frozen=True)
class Gemma3Config(ModelConfig):
    query_pre_attn_scalar: float = 256.0  # attention scores are scaled by its -1/2 power
    sliding_window: int | None = None  # keys a sliding layer's query sees, its own included (None: all)
    layer_types: tuple[str, ...] = ()  # per layer: SLIDING or FULL
    rope_local_theta: float = 10000.0  # RoPE base of the sliding layers (rope_theta is the full layers')
    rope_scaling_factor: float = 1.0  # the full layers' linear RoPE scaling: frequencies divided by it
    attn_softcap: float = 0.0  # Gemma 2: scores s become cap * tanh(s / cap) before the softmax; 0: none
    final_softcap: float = 0.0  # Gemma 2: the logits likewise
    qk_norm: bool = True  # Gemma 3's RMSNorm on each query and key head (Gemma 2 has none)
    model_type: str = MODEL_TYPE

    @classmethod
    def from_hf(cls, cfg: dict) -> Gemma3Config:
        """From a Gemma3TextConfig's config.json: transformers 5 (rope_parameters per layer type) or 4.x
        (rope_theta, rope_local_base_freq, sliding_window_pattern) spellings."""
        mt = cfg.get("model_type")
        if mt not in (MODEL_TYPE, GEMMA2):
            raise SpecdecError(f"model_type {mt!r} is not {MODEL_TYPE!r} or {GEMMA2!r}")
        gemma2 = mt == GEMMA2
        caps = {}
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if cfg.get(key) is not None and not gemma2:
                raise SpecdecError(f"Gemma 3 with {key} is not covered by specdec's compact implementation")
            caps[key] = number(cfg.get(key), f"config.json: {key}", 0, low_open=True, optional=True) or 0.0
        if cfg.get("use_bidirectional_attention"):
            raise SpecdecError("Gemma 3 with bidirectional attention is not a causal language model")
        act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
        if act != "gelu_pytorch_tanh":
            raise SpecdecError(f"Gemma 3 with activation {act!r} is not covered (only gelu_pytorch_tanh)")
        check_sizes(cfg)
        layers = cfg["num_hidden_layers"]
        types = cfg.get("layer_types")
        if types is None:
            period = cfg.get("sliding_window_pattern", 2 if gemma2 else 6)
            types = [SLIDING if (i + 1) % period else FULL for i in range(layers)]
        if len(types) != layers or set(types) - {SLIDING, FULL}:
            raise SpecdecError(f"layer_types {types!r}: want {layers} of {SLIDING!r} / {FULL!r}")
        rope = cfg.get("rope_parameters") or {}
        if gemma2 and "rope_type" in rope:  # one set for every layer
            rope = {FULL: rope, SLIDING: rope}
        default = 10_000.0 if gemma2 else 1_000_000.0
        theta = {FULL: cfg.get("rope_theta", default), SLIDING: cfg.get("rope_local_base_freq", 10_000.0)}
        if gemma2:
            theta[SLIDING] = theta[FULL]
        legacy = cfg.get("rope_scaling") or {}  # transformers 4.x: the full layers' scaling
        factor = 1.0
        for kind in (FULL, SLIDING):
            params = {**(legacy if kind == FULL else {}), **(rope.get(kind) or {})}
            kind_of = params.get("rope_type", params.get("type", "default"))
            if kind_of == "linear" and kind == FULL:
                factor = float(params.get("factor", 1.0))
            elif kind_of != "default":
                raise SpecdecError(f"rope scaling {kind_of!r} on the {kind} layers is not covered by specdec's "
                                   "compact implementation (it runs linear scaling of the full layers)")
            theta[kind] = params.get("rope_theta", theta[kind])
        if factor <= 0:
            raise SpecdecError(f"linear rope scaling factor {factor}: must be positive")
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta[FULL]),
            max_position_embeddings=cfg.get("max_position_embeddings", 131_072),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", head_dim)),
            sliding_window=cfg.get("sliding_window"),
            layer_types=tuple(types),
            rope_local_theta=float(theta[SLIDING]),
            rope_scaling_factor=factor,
            attn_softcap=float(caps["attn_logit_softcapping"]),
            final_softcap=float(caps["final_logit_softcapping"]),
            qk_norm=not gemma2,
            model_type=mt,
        )


class ScaledRows:
    """A row lookup (gguf_weights.RowLookup) whose rows come back times `scale`: Gemma's embedding on a lean
    folder, the same values as the scaled table of a full one without its 4 bytes a weight (671 MB at 270M)."""

    def __init__(self, rows: RowLookup, scale: torch.Tensor):
        self.rows, self.scale, self.shape = rows, scale, rows.shape

    def __getitem__(self, index) -> torch.Tensor:
        return self.rows[index] * self.scale

    def float(self) -> ScaledRows:
        return self

    def to(self, device) -> ScaledRows:
        return self


class Gemma3Block:
    def __init__(self, cfg: Gemma3Config, w: dict[str, torch.Tensor], i: int, precision: str, gguf=None):
        """`gguf`: (matrices by name, kernels, put) for the GGUF-block precisions, else None."""
        p = f"model.layers.{i}."
        att, mlp = p + "self_attn.", p + "mlp."
        names = {"qkv": [att + "q_proj.weight", att + "k_proj.weight", att + "v_proj.weight"],
                 "o": [att + "o_proj.weight"], "gate_up": [mlp + "gate_proj.weight", mlp + "up_proj.weight"],
                 "down": [mlp + "down_proj.weight"]}
        if gguf is not None:  # fused as the torch path fuses them; qmatrix stacks parts of different types
            quantized, kernels, arena = gguf
            self.qkv, self.o, self.gate_up, self.down = (
                GgufLinear([quantized[n] for n in names[key]], precision, kernels, arena) for key in names)
        else:
            qkv_b = None
            if cfg.attention_bias:
                qkv_b = torch.cat([w[att + "q_proj.bias"], w[att + "k_proj.bias"], w[att + "v_proj.bias"]])
            self.qkv = Linear(torch.cat([w[n] for n in names["qkv"]]), qkv_b, precision)
            self.o = Linear(w[att + "o_proj.weight"], w.get(att + "o_proj.bias"), precision)
            self.gate_up = Linear(torch.cat([w[n] for n in names["gate_up"]]), None, precision)
            self.down = Linear(w[mlp + "down_proj.weight"], None, precision)
        scale = lambda name: (1.0 + w[p + name + ".weight"].float()).contiguous()  # Gemma's norms scale by 1 + w
        self.input_norm, self.post_attention_norm = scale("input_layernorm"), scale("post_attention_layernorm")
        self.pre_ff_norm, self.post_ff_norm = scale("pre_feedforward_layernorm"), scale("post_feedforward_layernorm")
        self.q_norm = self.k_norm = None  # [head_dim] each; Gemma 2 has none
        if cfg.qk_norm:
            self.q_norm, self.k_norm = scale("self_attn.q_norm"), scale("self_attn.k_norm")
        self.sliding = cfg.layer_types[i] == SLIDING
        self.window = cfg.sliding_window if self.sliding else None  # None: every earlier key

    @property
    def linears(self) -> list[Linear | GgufLinear]:
        return [self.qkv, self.o, self.gate_up, self.down]

    @property
    def norms(self) -> list[torch.Tensor]:
        return [n for n in (self.input_norm, self.post_attention_norm, self.pre_ff_norm, self.post_ff_norm,
                            self.q_norm, self.k_norm) if n is not None]


class Gemma3(Transformer):
    """forward / forward_ragged / new_cache are Transformer's (its torch path); _layers is Gemma's."""

    def __init__(self, cfg: Gemma3Config, weights: dict[str, torch.Tensor], precision: str = "fp16",
                 device: str = "cpu", quantized: dict | None = None, planes=None):
        """`quantized`: the GGUF's matrices by Hugging Face name (gguf_gemma3.read_matrices), which gguf-q16 and
        gguf-q8 run; `weights` still gives the norms and the embedding table; `planes`: their packed planes' file
        (plane_cache.PlaneCache, --map-weights)."""
        gguf = self._gguf(precision, device, quantized, planes)
        self.cfg, self.precision, self.device = cfg, precision, torch.device(device)
        self.act_bits = ACT_BITS.get(precision) if gguf is not None else None  # as Transformer's: the integer paths'
        self.final_cap = cfg.final_softcap
        weights = {name: t.to(self.device) for name, t in weights.items()}
        # the native blocks at the GGUF precisions (forward_ragged's path); the torch path at the others
        self.kernels = gguf[1] if gguf is not None else None
        self.lm_head_half = self.lm_head_q = None
        self._stack = None
        # transformers scales the looked-up rows, embedding(ids) * sqrt(hidden) with the scale rounded to the
        # weights' dtype (fp32 here)
        scale = torch.tensor(cfg.hidden_size ** 0.5, dtype=torch.float32)
        embed = weights.get("model.embed_tokens.weight")  # [vocab, hidden]
        if embed is not None:
            embed = embed.float()
            self.embed = embed * scale  # the table scaled once: the same products as scaling each lookup
        elif gguf is not None:  # a lean folder: rows dequantized from the GGUF as looked up, then scaled
            self.embed = ScaledRows(RowLookup(quantized["model.embed_tokens.weight"]), scale)
        else:
            raise SpecdecError("this model folder holds no matrices (a lean conversion for the gguf precisions); "
                               "it runs on gguf-q16 or gguf-q8 with the native kernels")
        if gguf is not None:
            head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
            self.lm_head = GgufLinear([quantized[head]], precision, *gguf[1:])
            self.lm_head_q = self.lm_head.qm  # what forward_ragged's native path multiplies
        else:
            self.lm_head = Linear(embed if cfg.tie_word_embeddings else weights["lm_head.weight"], None, precision)
        self.blocks = [Gemma3Block(cfg, weights, i, precision, gguf) for i in range(cfg.num_layers)]
        if gguf is not None:
            release_pages(quantized.values())  # the kernels hold their own planes now
        self.norm = (1.0 + weights["model.norm.weight"].float()).contiguous()
        # RoPE tables [positions, head_dim] per base, grown by new_cache (attention.RopeTable)
        d = cfg.head_dim
        self.tables = {}  # sliding layer? -> RopeTable
        for sliding, theta in ((False, cfg.rope_theta), (True, cfg.rope_local_theta)):
            inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
            if not sliding and cfg.rope_scaling_factor != 1.0:
                inv_freq = inv_freq / cfg.rope_scaling_factor  # as transformers' linear scaling divides them
            self.tables[sliding] = RopeTable(inv_freq.to(self.device), cfg.max_position_embeddings, self.device)
        self._rope = self.tables[False]  # the native stack's default tables (every Gemma layer passes its own)
        self._native_blocks()

    @property
    def rope(self) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
        """sliding layer? -> (cos, sin) [positions covered, head_dim]."""
        return {sliding: (t.cos, t.sin) for sliding, t in self.tables.items()}

    def _cover_rope(self, positions: int) -> None:
        grew = [t.cover(positions) for t in self.tables.values()]
        if any(grew):
            self._native_blocks()  # the stack holds each layer's tables: new tensors, a new stack

    def _native_blocks(self) -> None:
        """Each block's arguments for the native stack (kernels/gguf.cpp, GgufStack), with its layer's tables."""
        if self.kernels is None:
            return
        scale = self.cfg.query_pre_attn_scalar ** -0.5
        for blk in self.blocks:
            table = self.tables[blk.sliding]
            blk.native = (blk.input_norm, blk.qkv.qm, blk.o.qm, blk.pre_ff_norm, blk.gate_up.qm, blk.down.qm, None,
                          (blk.q_norm, blk.k_norm, blk.post_attention_norm, blk.post_ff_norm, scale, blk.window or 0,
                           table.cos, table.sin, True, self.cfg.attn_softcap))  # GELU
        self._stack = None

    @staticmethod
    def _gguf(precision: str, device: str, quantized: dict | None, planes=None):
        """(quantized, kernels, arena) for GgufLinear at a GGUF-block precision; None at a torch one."""
        if precision in TORCH_PRECISIONS:
            return None
        if precision not in GGUF_BLOCK_PRECISIONS:
            raise SpecdecError(f"Gemma 3 does not run precision {precision!r} (choose from "
                               f"{', '.join(TORCH_PRECISIONS + GGUF_BLOCK_PRECISIONS)})")
        if quantized is None:
            raise SpecdecError(f"--precision {precision} runs a GGUF file's own blocks; this model is not from a GGUF "
                               "file (use fp16)")
        if torch.device(device).type != "cpu":
            raise SpecdecError(f"--precision {precision} runs on CPU kernels; on {device} use bf16")
        from specdec.kernels import decode_kernels

        kernels = decode_kernels()
        if kernels is None:  # decode_kernels() has said why on stderr
            raise SpecdecError(f"--precision {precision} needs the native kernels; use fp16")
        return quantized, kernels, Arena(planes=planes)  # the planes on huge pages, as Transformer's

    @classmethod
    def from_dir(cls, path: str | Path, precision: str = "fp16", device: str = "cpu",
                 gguf: Path | None = None, map_weights: bool = False, context: int | None = None) -> Gemma3:
        """A model folder; `gguf`: the GGUF file it was converted from, whose blocks gguf-q16 and gguf-q8 run."""
        from specdec.models.checkpoint import load_weights
        from specdec.models.gguf.gemma3 import read_matrices

        path = Path(path)
        quantized = read_matrices(gguf) if precision in GGUF_BLOCK_PRECISIONS and gguf is not None else None
        cfg, weights = Gemma3Config.from_dir(path).with_context(context), load_weights(path)
        build = (lambda planes: cls(cfg, weights, precision, device, quantized, planes))
        return mapped(build, gguf, precision, device) if map_weights else build(None)

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights read by one decode pass (the embedding lookup reads one row, ignored)."""
        lin = sum(lin.nbytes for b in self.blocks for lin in b.linears) + self.lm_head.nbytes
        norms = sum(n.numel() for b in self.blocks for n in b.norms) * 4 + self.norm.numel() * 4
        return lin + norms

    def _angles(self, sliding: bool, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, n, 1, head_dim] at positions pos [B, n], for sliding or full layers."""
        table = self.tables[sliding]
        return table.cos[pos].unsqueeze(2), table.sin[pos].unsqueeze(2)

    def _layers(self, x: torch.Tensor, pos: torch.Tensor, cache, rows: torch.Tensor | None,
                prefill: bool, taps: tuple[int, ...] = ()):
        """Every Gemma block, torch path. x [B, n, hidden] at positions pos [B, n]; row b uses cache slot rows[b]
        (slot b when rows is None). Returns [B, n, hidden] (and features, as Transformer._layers)."""
        cfg = self.cfg
        eps = cfg.rms_norm_eps
        b, n = pos.shape
        x = x.reshape(b * n, cfg.hidden_size)
        feats = x.new_empty(b * n, len(taps) * cfg.hidden_size) if taps else None  # [B*n, taps * hidden]
        hq, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        scale = cfg.query_pre_attn_scalar ** -0.5
        rope = {sliding: self._angles(sliding, pos) for sliding in self.tables}
        pick = None if rows is None else slot_picker(rows)
        for layer, blk in enumerate(self.blocks):
            tap(feats, 0, x, taps, layer)
            h = rms_norm(x, blk.input_norm, eps)
            qkv = blk.qkv(h).view(b, n, hq + 2 * hk, d)  # [B, n, heads, d]
            cos, sin = rope[blk.sliding]
            q, k = qkv[:, :, :hq], qkv[:, :, hq:hq + hk]  # [B, n, hq, d], [B, n, hk, d]
            if blk.q_norm is not None:
                q, k = rms_norm(q, blk.q_norm, eps), rms_norm(k, blk.k_norm, eps)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            v = qkv[:, :, hq + hk:]  # [B, n, hk, d]
            k_cache, v_cache = cache.k[layer], cache.v[layer]
            write_kv(k_cache, v_cache, k, v, pos, rows)
            if pick is not None:
                k_cache, v_cache = k_cache[pick], v_cache[pick]  # [B, hk, capacity, d]
            if prefill:
                att = attend_prefill(q, k_cache, v_cache, pos, scale, blk.window, cfg.attn_softcap)
            else:
                att = attend_decode(q, k_cache, v_cache, pos, cfg.group_size, scale, blk.window, cfg.attn_softcap)
            x = x + rms_norm(blk.o(att.reshape(b * n, hq * d)), blk.post_attention_norm, eps)
            h = rms_norm(x, blk.pre_ff_norm, eps)
            gate, up = blk.gate_up(h).chunk(2, dim=-1)
            x = x + rms_norm(blk.down(F.gelu(gate, approximate="tanh") * up), blk.post_ff_norm, eps)
        tap(feats, 0, x, taps, cfg.num_layers)
        x = x.view(b, n, cfg.hidden_size)
        return (x, feats.view(b, n, -1)) if taps else x
