"""A compact Llama-family transformer (Llama, SmolLM, Qwen2/3, Mistral, Mixtral, Phi-3 blocks) built for
speculative decoding: the blocks and the model. Its KV cache (kv_cache.py) is addressed by position, so rejecting
a draft costs nothing; the torch path's norms, RoPE and attention are in attention.py.

With the native kernels (the default on CPU), every pass -- decode, verify and prefill -- runs each decoder
block in one call whose rows are computed independently in a fixed order, over an fp16 cache that attention
reads once per sequence for all of its rows (specdec/kernels). A position's keys and values are therefore the
same however it was computed, which is what lets a prefix cache reuse them exactly. The torch fallback's decode
passes are batch-invariant too (attention.attend_decode).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.errors import SpecdecError
from specdec.kernels import pairs_layout
from specdec.kernels.cores import before_pass
from specdec.models.attention import (
    RopeTable,
    attend_decode,
    attend_prefill,
    rms_norm,
    rotate,
    softcap,
)
from specdec.models.config import ACT_BITS, GGUF_PRECISIONS, ModelConfig
from specdec.models.experts import Experts, native_experts
from specdec.models.gguf.llama import read_matrices
from specdec.models.gguf.plane_cache import mapped
from specdec.models.gguf.weights import QTensor, RowLookup, qmatrix, release_pages
from specdec.models.hugepages import Arena
from specdec.models.kv_cache import KV_TYPES, KVCache, KvType, kv_type, slot_picker, write_kv
from specdec.models.linear import Linear
from specdec.models.target import Tapped

NATIVE_ROWS = 256  # token-rows per native call (bounds its buffers; rows are independent, so results are not)


class Block:
    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], i: int, precision: str, native: bool,
                 quantized: dict | None = None, kernels=None, arena: Arena | None = None):
        p = f"model.layers.{i}."
        att, mlp = p + "self_attn.", p + "mlp."
        arena = arena if arena is not None else Arena()
        self.norm1 = w[p + "input_layernorm.weight"].float().contiguous()
        self.norm2 = w[p + "post_attention_layernorm.weight"].float().contiguous()
        self.q_norm = self.k_norm = None  # [head_dim] each: Qwen3's norms on each query and key head
        if cfg.qk_norm:
            self.q_norm = w[att + "q_norm.weight"].float().contiguous()
            self.k_norm = w[att + "k_norm.weight"].float().contiguous()
        self.native = None
        fused = cfg.fused  # Phi-3's checkpoints hold [q; k; v] and [gate; up] whole
        qkv_names = [att + "qkv_proj.weight"] if fused else [att + f"{n}_proj.weight" for n in "qkv"]
        gate_up_names = [mlp + "gate_up_proj.weight"] if fused else [mlp + f"{n}_proj.weight" for n in ("gate", "up")]
        self.experts = None  # a mixture of experts in place of the MLP (models/experts.py)
        if quantized is not None and native:  # the GGUF's own blocks, in the kernel's planes
            integer = precision in ACT_BITS
            paired = pairs_layout(kernels)

            def make(parts):
                return qmatrix(kernels, parts, integer, ACT_BITS.get(precision, 8), paired, arena.put, arena.zeros,
                               arena.planes)

            qkv, o = (make([quantized[n] for n in names]) for names in (qkv_names, [att + "o_proj.weight"]))
            if cfg.moe:  # the experts replace the MLP; the stack takes expert 0's matrices for the block's sizes
                self.experts, expert_mats = native_experts(cfg, w, mlp, quantized, make)
                gate_up, down = expert_mats[0], expert_mats[cfg.num_experts]
            else:
                gate_up, down = make([quantized[n] for n in gate_up_names]), make([quantized[mlp + "down_proj.weight"]])
                expert_mats = []
            bias = None
            if cfg.attention_bias:  # Qwen2's, added to the [q; k; v] product (GgufStack's optional 7th entry)
                bias = torch.cat([w[att + n + "_proj.bias"].float() for n in "qkv"]).contiguous()
            self.native = (self.norm1, qkv, o, self.norm2, gate_up, down)
            variant = None
            if cfg.qk_norm or cfg.sliding_window:  # GgufStack's 8th entry, the variant: q/k norms, a window
                variant = (self.q_norm, self.k_norm, None, None, 0.0, cfg.sliding_window or 0, None, None, False, 0.0)
            if self.experts is not None:  # its 9th, the experts
                self.native += (bias, variant, self.experts)
            elif variant is not None:
                self.native += (bias, variant)
            elif bias is not None:
                self.native += (bias,)
            self.qmatrices = [qkv, o] + (expert_mats if cfg.moe else [gate_up, down])
            return
        qkv_w = torch.cat([w[n] for n in qkv_names])
        qkv_b = None
        if cfg.attention_bias:
            qkv_b = torch.cat([w[att + "q_proj.bias"], w[att + "k_proj.bias"], w[att + "v_proj.bias"]])
        self.qkv = Linear(qkv_w, qkv_b, precision)  # one fused call: fewer, larger calls are faster here
        self.o = Linear(w[att + "o_proj.weight"], None, precision)
        if cfg.moe:
            self.experts = Experts(cfg, w, mlp, precision)
            return
        gate_up_w = torch.cat([w[n] for n in gate_up_names])
        self.gate_up = Linear(gate_up_w, None, precision)
        self.down = Linear(w[mlp + "down_proj.weight"], None, precision)
        if native:  # the same fp16 weights, laid out for the native decode kernel
            self.native = (self.norm1, arena.put(qkv_w.half()), None if qkv_b is None else qkv_b.float(),
                           arena.put(w[att + "o_proj.weight"].half()), self.norm2,
                           arena.put(gate_up_w.half()), arena.put(w[mlp + "down_proj.weight"].half()))

    @property
    def linears(self) -> list[Linear]:
        return [self.qkv, self.o] + (self.experts.linears if self.experts else [self.gate_up, self.down])


def native_fp16(cfg: ModelConfig) -> tuple[str, ...]:
    """("fp16",) where the native fp16 block runs this model: it has no q/k norms, window or experts (those run
    natively on their GGUF blocks only)."""
    return ("fp16",) if not (cfg.qk_norm or cfg.sliding_window or cfg.moe) else ()


def runs_native(cfg: ModelConfig, precision: str, device: str) -> bool:
    """Whether this model at `precision` on `device` runs on the native kernels, where they can be built."""
    return (precision in native_fp16(cfg) + GGUF_PRECISIONS and torch.device(device).type == "cpu"
            and cfg.head_dim % 8 == 0 and cfg.hidden_size % 8 == 0)


def check_kv_cache(kind: KvType, head_dim: int, kernels, torch_path: str) -> None:
    """A one-line SpecdecError where a model cannot keep a cache of type `kind`: `kernels` the native kernels it runs
    on (None: the torch path, `torch_path` saying which), `head_dim` its heads' size. The loader asks before it loads
    any weights, the model again when a type is set."""
    if kind.exact:
        return
    if kernels is None:
        raise SpecdecError(f"--kv-cache {kind.name} needs the native kernels (gguf-q8 or gguf-q16 on a GGUF's blocks, "
                           "or fp16 for a model without q/k norms, windows or experts, on CPU); this model runs on the "
                           f"torch path ({torch_path}), whose cache is f16/fp32")
    if head_dim % 32 or head_dim > 256:
        raise SpecdecError(f"--kv-cache {kind.name} quantizes each 32 values of a head (of up to 256); this "
                           f"model's heads hold {head_dim}: use f16")
    if kind.name not in kernels.kv_types():
        raise SpecdecError(f"--kv-cache {kind.name}: the kernels cannot run it on this CPU (they run "
                           f"{', '.join(kernels.kv_types())})")


class Transformer:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], precision: str = "fp16",
                 device: str = "cpu", quantized: dict[str, QTensor] | None = None, planes=None):
        """`quantized`: the GGUF's matrices (models/gguf/llama.py read_matrices), needed by the gguf precisions;
        `planes`: their packed planes' file (plane_cache.PlaneCache, --map-weights)."""
        if precision in GGUF_PRECISIONS and quantized is None:
            raise SpecdecError(f"--precision {precision} runs a GGUF file's own blocks; this model is not from a "
                               "GGUF file (use fp16)")
        self.cfg, self.precision, self.device = cfg, precision, torch.device(device)
        weights = {name: t.to(self.device) for name, t in weights.items()}
        self.kernels = None
        if runs_native(cfg, precision, device):
            from specdec.kernels import decode_kernels

            self.kernels = decode_kernels()  # None when they cannot be built: the torch path is used
        native = self.kernels is not None
        if precision in GGUF_PRECISIONS and not native:
            # the torch path on the dequantized weights is the exact path's arithmetic in another order
            print(f"specdec: --precision {precision} needs the native kernels; running fp32", file=sys.stderr)
            self.precision = precision = "fp32"
        quantized = quantized if precision in GGUF_PRECISIONS else None
        self.act_bits = ACT_BITS.get(precision)  # the integer paths: activation bits
        if "model.embed_tokens.weight" in weights:
            self.embed = weights["model.embed_tokens.weight"].float()  # [vocab, hidden]
        elif quantized is not None and native:  # a lean folder: rows dequantized from the GGUF as looked up
            self.embed = RowLookup(quantized["model.embed_tokens.weight"])
        else:
            raise SpecdecError("this model folder holds no matrices (a lean conversion for the gguf precisions); "
                               "it runs on gguf-q16 or gguf-q8 with the native kernels")
        arena = Arena(planes=planes)  # the native kernels' weights, on huge pages where the OS grants them
        self.blocks = [Block(cfg, weights, i, precision, native, quantized, self.kernels, arena)
                       for i in range(cfg.num_layers)]
        self.norm = weights["model.norm.weight"].float().contiguous()
        head = weights.get("lm_head.weight", self.embed) if not cfg.tie_word_embeddings else self.embed
        self.lm_head = self.lm_head_half = self.lm_head_q = None
        self._stack = None  # _native_stack()'s, built on first use
        if quantized is not None:
            name = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
            head_q = quantized.get(name, quantized["model.embed_tokens.weight"])
            integer = self.act_bits is not None
            self.lm_head_q = qmatrix(self.kernels, [head_q], integer, self.act_bits or 8,
                                     integer and pairs_layout(self.kernels), arena.put, arena.zeros, arena.planes)
        else:
            self.lm_head = Linear(head, None, precision)
            self.lm_head_half = arena.put(head.half()) if native else None
        if quantized is not None and native:
            release_pages(quantized.values())  # the kernels hold their own planes now
        d = cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        if cfg.rope_freq_factors is not None:  # Llama 3's scaling as llama.cpp applies rope_freqs; LongRoPE's
            inv_freq = inv_freq / torch.tensor(cfg.rope_freq_factors, dtype=torch.float32)
        self._rope = RopeTable(inv_freq, cfg.max_position_embeddings, self.device, cfg.rope_attn_factor)

    @property
    def cos(self) -> torch.Tensor:
        return self._rope.cos  # [positions covered, head_dim]

    @property
    def sin(self) -> torch.Tensor:
        return self._rope.sin

    @classmethod
    def from_dir(cls, path: str | Path, precision: str = "fp16", device: str = "cpu",
                 gguf: Path | None = None, map_weights: bool = False, context: int | None = None) -> Transformer:
        """A model folder; `gguf`: the GGUF file it was converted from, whose blocks the gguf precisions run;
        `map_weights`: their packed planes mapped from the cache (plane_cache.py); `context`: the positions a
        sequence may use (ModelConfig.with_context; None: the model's)."""
        from specdec.models.checkpoint import check_weights, load_weights
        from specdec.models.gguf.convert import is_lean

        path = Path(path)
        cfg = ModelConfig.from_dir(path).with_context(context)
        weights = load_weights(path)
        check_weights(weights, cfg, path, matrices=not is_lean(path))
        quantized = read_matrices(gguf) if precision in GGUF_PRECISIONS and gguf is not None else None
        build = (lambda planes: cls(cfg, weights, precision, device, quantized, planes))
        return mapped(build, gguf, precision, device) if map_weights else build(None)

    kv: KvType = KV_TYPES["f16"]  # the native cache's type (use_kv_cache)
    supports_taps = True  # forward and forward_ragged return hidden states of chosen layers (`taps`)
    final_cap = 0.0  # Gemma 2 soft-caps its logits (softcap()); 0: none

    @property
    def exact_kv_reuse(self) -> bool:
        """Keys and values at a position are the same however it was computed (prefill chunk, decode, verify):
        what makes a prefix cache exact. True on the native kernels."""
        return self.kernels is not None

    # --- accounting --------------------------------------------------------------------------------------

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights read by one decode pass (the embedding lookup reads one row, ignored)."""
        mats = [b.qmatrices if self.lm_head_q is not None else b.linears for b in self.blocks]
        lin = sum(m.nbytes for ms in mats for m in ms)
        lin += (self.lm_head_q if self.lm_head_q is not None else self.lm_head).nbytes
        if self.cfg.moe:  # a token reads k of the E experts: the rest of the experts' bytes are not read
            c = self.cfg
            experts = sum(m.nbytes for ms in mats for m in ms[2:])
            lin -= experts * (c.num_experts - c.experts_per_token) // c.num_experts
        norms = sum(b.norm1.numel() + b.norm2.numel() for b in self.blocks) * 4
        return lin + norms

    @property
    def macs_per_token(self) -> int:
        """Multiply-adds of the matrix products of one token-row's pass (attention excluded)."""
        c = self.cfg
        qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        mlp = 3 * c.hidden_size * (c.expert_size * c.experts_per_token if c.moe else c.intermediate_size)
        block = c.hidden_size * qkv + c.num_heads * c.head_dim * c.hidden_size + mlp
        return c.num_layers * block + c.vocab_size * c.hidden_size

    def attention_work(self, context: int) -> tuple[int, int]:
        """(multiply-adds of one row's attention, KV-cache bytes a pass reads) at `context` cached positions: a
        layer's query sees min(context, its window) keys, each scored and weighed once a head."""
        c = self.cfg
        seen = [min(context, getattr(b, "window", None) or c.sliding_window or context) for b in self.blocks]
        per_position = self.kv_bytes_per_token() // c.num_layers  # a layer's keys and values of one position
        return (sum(2 * c.num_heads * c.head_dim * n for n in seen), sum(per_position * n for n in seen))

    def elementwise_per_token(self) -> int:
        """A row's arithmetic outside the products and attention, roughly (a floor's small term): its norms and
        residual adds (about 4 operations a value, twice a layer), its gated activation (about 8 a value: the
        exponential's polynomial) and the softmax over the vocabulary (about 8 a logit)."""
        c = self.cfg
        inter = c.expert_size * c.experts_per_token if c.moe else c.intermediate_size
        return c.num_layers * (8 * c.hidden_size + 8 * inter) + 8 * c.vocab_size

    def kv_bytes_per_token(self) -> int:
        if self.kernels is not None:  # the native kernels' cache, of its type
            return self.kv.bytes_per_position(self.cfg)
        return 2 * self.cfg.num_layers * self.cfg.num_kv_heads * self.cfg.head_dim * 4  # the torch path's fp32

    @property
    def kv_cache(self) -> str:
        """The KV cache type's name (kv_cache.KV_TYPES)."""
        return self.kv.name

    def use_kv_cache(self, name: str | None) -> None:
        """Caches made from now on are of type `name` (None: f16), or a one-line SpecdecError where this model's
        path or this CPU cannot run it."""
        kind = kv_type(name)
        check_kv_cache(kind, self.cfg.head_dim, self.kernels, f"{self.precision} on {self.device.type}")
        self.kv = kind

    def new_cache(self, batch: int, capacity: int, huge_pages: bool = True) -> KVCache:
        """huge_pages: see KVCache (False for a server's pool, whose sequences fill a fraction of each slot)."""
        if capacity > self.cfg.max_position_embeddings:
            capacity = self.cfg.max_position_embeddings
        self._cover_rope(capacity)
        if self.kernels is not None:
            return KVCache(self.cfg, batch, capacity, self.device, torch.float16, blocked=True, huge_pages=huge_pages,
                           kind=self.kv)
        return KVCache(self.cfg, batch, capacity, self.device)

    def _cover_rope(self, positions: int) -> None:
        """The RoPE tables hold every position a cache of this capacity can."""
        self._rope.cover(positions)

    # --- forward -----------------------------------------------------------------------------------------

    def forward(self, tokens: torch.Tensor, start: torch.Tensor, cache: KVCache,
                last_only: torch.Tensor | None = None, prefill: bool = False) -> torch.Tensor:
        """Run tokens [B, n] at positions start[b] + i, writing their keys/values into `cache` (row b is cache
        slot b). Returns logits [B, n, vocab], or [B, vocab] at index last_only[b] of each row when given."""
        return self._forward(tokens, start, cache, last_only, prefill)

    def forward_tapped(self, tokens: torch.Tensor, start: torch.Tensor, cache: KVCache, taps: tuple[int, ...],
                       last_only: torch.Tensor | None = None, prefill: bool = False) -> Tapped:
        """forward, with the features of the layers `taps` (see forward_ragged_tapped) at every position [B, n,
        len(taps) * hidden], whatever last_only selects."""
        return Tapped(*self._forward(tokens, start, cache, last_only, prefill, self._taps_given(taps)))

    def forward_ragged(self, tokens: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor, cache: KVCache,
                       select: torch.Tensor | None = None) -> torch.Tensor:
        """One decode/verify pass over a ragged batch: token-row r (tokens, slots, pos [R]) is at position pos[r]
        of cache slot slots[r]. A slot's rows are contiguous and at consecutive positions; slots may have any
        number of rows. Returns logits [R, vocab], or only for the rows `select` [S] -> [S, vocab].

        Each row's result is bit-identical whatever the other rows: a verify pass over k+1 drafts of one slot
        gives the logits of k+1 one-token passes, however many rows other slots add."""
        return self._forward_ragged(tokens, slots, pos, cache, select)

    def forward_ragged_tapped(self, tokens: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor, cache: KVCache,
                              taps: tuple[int, ...], select: torch.Tensor | None = None) -> Tapped:
        """forward_ragged, with the input of each layer in `taps` (the residual stream entering that block;
        num_layers: the last block's output, before the final norm) over all rows, features [R, len(taps) *
        hidden]: what a draft head reads (EAGLE-3 fuses a low, a middle and a high layer)."""
        return Tapped(*self._forward_ragged(tokens, slots, pos, cache, select, self._taps_given(taps)))

    @staticmethod
    def _taps_given(taps: tuple[int, ...]) -> tuple[int, ...]:
        if not taps:
            raise SpecdecError("a tapped pass needs the layers to tap")
        return tuple(taps)

    @torch.inference_mode()
    def _forward(self, tokens: torch.Tensor, start: torch.Tensor, cache: KVCache,
                 last_only: torch.Tensor | None = None, prefill: bool = False, taps: tuple[int, ...] = ()):
        """forward (taps empty: logits) or forward_tapped (taps: (logits, features))."""
        dev = self.device
        tokens, start = tokens.to(dev), start.to(dev)
        b, n = tokens.shape
        if prefill and b > 1 and last_only is not None:
            if taps:
                raise SpecdecError("features are taken from one prompt's prefill at a time")
            # row by row, each at its own length, so that a prompt's prefill does not depend on its batch-mates
            return torch.cat([self.forward(tokens[r:r + 1, : int(last_only[r]) + 1], start[r:r + 1], cache.row(r),
                                           last_only=last_only[r:r + 1], prefill=True) for r in range(b)])
        pos = start.view(b, 1) + torch.arange(n, device=dev).view(1, n)  # [B, n]
        if not prefill or self.kernels is not None:
            # the ragged pass with n token-rows per slot: every decode/verify pass, and with the native kernels
            # every prefill too (their rows are batch-invariant, so a prompt's cache is what decoding it writes)
            slots = torch.arange(b, device=dev).repeat_interleave(n)  # [B*n]
            select = None if last_only is None else torch.arange(b, device=dev) * n + last_only.to(dev)
            out = self._forward_ragged(tokens.reshape(-1), slots, pos.reshape(-1), cache, select, taps)
            logits, feats = out if taps else (out, None)
            logits = logits if last_only is not None else logits.view(b, n, -1)
            return (logits, feats.view(b, n, -1)) if taps else logits
        before_pass()  # the torch path's prefill (every other pass goes through forward_ragged)
        x = self._layers(self.embed[tokens], pos, cache, None, prefill=True, taps=taps)
        x, feats = x if taps else (x, None)  # [B, n, hidden], [B, n, taps * hidden]
        if last_only is not None:
            x = x[torch.arange(b, device=dev), last_only.to(dev)]  # [B, hidden]
            logits = self.lm_head(rms_norm(x, self.norm, self.cfg.rms_norm_eps))  # [B, vocab]
        else:
            logits = self.lm_head(rms_norm(x.view(b * n, -1), self.norm, self.cfg.rms_norm_eps)).view(b, n, -1)
        logits = softcap(logits, self.final_cap)
        return (logits, feats) if taps else logits

    @torch.inference_mode()
    def _forward_ragged(self, tokens: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor, cache: KVCache,
                        select: torch.Tensor | None = None, taps: tuple[int, ...] = ()):
        """forward_ragged (taps empty: logits) or forward_ragged_tapped (taps: (logits, features))."""
        cfg, dev = self.cfg, self.device
        before_pass()  # the thread team, resized when other processes take these cores (kernels/cores.py)
        tokens, slots, pos = tokens.to(dev), slots.to(dev), pos.to(dev)
        check_taps(taps, cfg.num_layers)
        x = self.embed[tokens]  # [R, hidden]
        feats = x.new_empty(x.shape[0], len(taps) * cfg.hidden_size) if taps else None  # [R, taps * hidden]
        if self.kernels is not None:
            block = self.kernels.decode_block if self.lm_head_q is None else self.kernels.decode_block_gguf
            stack = self._native_stack()
            for a in range(0, x.shape[0], NATIVE_ROWS):  # in order: a later part reads what earlier parts wrote
                part = x[a:a + NATIVE_ROWS]  # [<= NATIVE_ROWS, hidden], a contiguous view updated in place
                part_slots, part_pos = slots[a:a + NATIVE_ROWS], pos[a:a + NATIVE_ROWS]  # sliced once, not per layer
                if stack is not None:  # every block in one native call
                    self.kernels.decode_stack_gguf(stack, part, part_slots, part_pos, cache.k, cache.v, self.cos,
                                                   self.sin, cfg.num_heads, cfg.num_kv_heads, cfg.rms_norm_eps,
                                                   list(taps), feats, a)
                    continue
                for layer, blk in enumerate(self.blocks):
                    tap(feats, a, part, taps, layer)
                    block(part, part_slots, part_pos, *blk.native, cache.k[layer], cache.v[layer], self.cos,
                          self.sin, cfg.num_heads, cfg.num_kv_heads, cfg.rms_norm_eps)
                tap(feats, a, part, taps, cfg.num_layers)
        else:
            # the torch path works on rectangles: [S, m] over the slots present, each slot's rows padded with
            # copies of its last row (a copy computes, and writes, exactly what the original does)
            uniq, counts = torch.unique_consecutive(slots, return_counts=True)  # [S]
            first = torch.cumsum(counts, 0) - counts  # [S]: index of each slot's first row
            m = int(counts.max())
            offs = torch.arange(m, device=dev).view(1, m)
            index = first.view(-1, 1) + torch.minimum(offs, (counts - 1).view(-1, 1))  # [S, m] -> rows
            real = offs < counts.view(-1, 1)  # [S, m]
            x = self._layers(x[index], pos[index], cache, uniq, prefill=False, taps=taps)
            if taps:
                x, f = x
                feats = f[real]  # [R, taps * hidden]
            x = x[real]  # [R, hidden]
        if select is not None:
            x = x[select.to(dev)]
        if self.kernels is not None:
            h = self.kernels.rms_norm(x.contiguous(), self.norm, cfg.rms_norm_eps)
            if self.lm_head_q is not None:
                logits = self.kernels.gemm_gguf(h, self.lm_head_q)  # [R or S, vocab]
            else:
                logits = self.kernels.gemv_f16(h, self.lm_head_half, None)  # [R or S, vocab]
        else:
            logits = self.lm_head(rms_norm(x, self.norm, cfg.rms_norm_eps))  # [R or S, vocab]
        logits = softcap(logits, self.final_cap)
        return (logits, feats) if taps else logits

    def _native_stack(self):
        """The GGUF blocks held by the kernels for one call a pass (built once), or None: the fp16 path, or a build
        of the kernels without it, runs block by block."""
        if self.lm_head_q is None or not hasattr(self.kernels, "GgufStack"):
            return None
        if self._stack is None:
            self._stack = self.kernels.GgufStack([blk.native for blk in self.blocks])
        return self._stack

    def _layers(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache, rows: torch.Tensor | None,
                prefill: bool, taps: tuple[int, ...] = ()):
        """The torch path through every block. x [B, n, hidden] at positions pos [B, n]; row b uses cache slot
        rows[b] (slot b when rows is None). Returns [B, n, hidden], and with `taps` the features
        [B, n, len(taps) * hidden] too (see forward_ragged)."""
        cfg = self.cfg
        b, n = pos.shape
        x = x.reshape(b * n, cfg.hidden_size)
        feats = x.new_empty(b * n, len(taps) * cfg.hidden_size) if taps else None  # [B*n, taps * hidden]
        cos, sin = self.cos[pos].unsqueeze(2), self.sin[pos].unsqueeze(2)  # [B, n, 1, d]
        hq, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        pick = None if rows is None else slot_picker(rows)  # the cache rows attention reads, decided once
        for layer, blk in enumerate(self.blocks):
            tap(feats, 0, x, taps, layer)
            h = rms_norm(x, blk.norm1, cfg.rms_norm_eps)
            qkv = blk.qkv(h).view(b, n, hq + 2 * hk, d)  # [B, n, heads, d]
            q, k = qkv[:, :, :hq], qkv[:, :, hq:hq + hk]  # [B, n, hq, d], [B, n, hk, d]
            if blk.q_norm is not None:
                q, k = rms_norm(q, blk.q_norm, cfg.rms_norm_eps), rms_norm(k, blk.k_norm, cfg.rms_norm_eps)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            v = qkv[:, :, hq + hk:]  # [B, n, hk, d]
            k_cache, v_cache = cache.k[layer], cache.v[layer]
            write_kv(k_cache, v_cache, k, v, pos, rows)
            if pick is not None:
                k_cache, v_cache = k_cache[pick], v_cache[pick]  # [B, hk, capacity, d]
            if prefill:
                att = attend_prefill(q, k_cache, v_cache, pos, window=cfg.sliding_window)
            else:
                att = attend_decode(q, k_cache, v_cache, pos, cfg.group_size, window=cfg.sliding_window)
            x = x + blk.o(att.reshape(b * n, hq * d))
            h = rms_norm(x, blk.norm2, cfg.rms_norm_eps)
            if blk.experts is not None:
                x = x + blk.experts(h)
                continue
            gate, up = blk.gate_up(h).chunk(2, dim=-1)
            x = x + blk.down(F.silu(gate) * up)
        tap(feats, 0, x, taps, cfg.num_layers)
        x = x.view(b, n, cfg.hidden_size)
        return (x, feats.view(b, n, -1)) if taps else x


def check_taps(taps: tuple[int, ...], num_layers: int) -> None:
    if any(not 0 <= t <= num_layers for t in taps):
        raise SpecdecError(f"feature taps must be layer indices in 0..{num_layers}, got {list(taps)}")


def tap(feats: torch.Tensor | None, row0: int, x: torch.Tensor, taps: tuple[int, ...], layer: int) -> None:
    """Copy the residual stream x [rows, hidden] entering `layer` into its slots of feats [R, taps * hidden]."""
    if feats is None:
        return
    h = x.shape[-1]
    for j, t in enumerate(taps):
        if t == layer:
            feats[row0:row0 + x.shape[0], j * h:(j + 1) * h] = x


