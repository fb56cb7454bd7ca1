"""A compact Llama-family transformer (Llama, SmolLM, Qwen2, Mistral blocks) built for speculative decoding.

The KV cache is preallocated and addressed by position: a pass over tokens at positions [pos, pos + n)
writes their keys and values there, and every query attends to keys at positions <= its own. Rejecting a
draft therefore costs nothing: the sequence's length simply does not advance, and the stale entries are
masked out until the next round overwrites them.

With the native kernels (the default on CPU), every pass -- decode, verify and prefill -- runs each decoder
block in one call whose rows are computed independently in a fixed order, over an fp16 cache that attention
reads once per sequence for all of its rows (specdec/kernels). A position's keys and values are therefore the
same however it was computed, which is what lets a prefix cache reuse them exactly.

The torch fallback: decode passes (one token, or a verify pass over k+1) use an attention formulation whose
result for a query row is bit-identical whatever the other rows, their number or the cache's filled length:
keys are read in fixed chunks of CHUNK positions, every matrix product has a fixed width, and query groups are
padded to at least MIN_QUERY_POSITIONS positions and split at MAX_QUERY_ROWS rows (MKL picks another kernel
above ~32 rows). Prefill uses torch's fused attention.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.errors import SpecdecError
from specdec.kernels import pairs_layout
from specdec.kernels.cores import before_pass
from specdec.models.config import ACT_BITS, GGUF_PRECISIONS, ModelConfig
from specdec.models.experts import Experts, native_experts
from specdec.models.gguf_llama import read_matrices
from specdec.models.gguf_weights import QTensor, RowLookup, qmatrix, release_pages
from specdec.models.hugepages import Arena, lazy_zeros
from specdec.models.linear import Linear

CHUNK = 64  # keys per attention block; cache capacity is a multiple of it
MIN_QUERY_POSITIONS = 3
MAX_QUERY_ROWS = 30  # query rows (heads per group x positions) per matrix product
NATIVE_ROWS = 256  # token-rows per native call (bounds its buffers; rows are independent, so results are not)
ROPE_BLOCK = 2048  # positions per block of the RoPE tables, which grow a block at a time as caches need them


class KVCache:
    """Keys and values of `batch` sequences (slots), per layer.

    The torch path keeps [batch, kv_heads, capacity, head_dim] in fp32. The native kernels keep fp16 and store
    keys in blocks of CHUNK positions transposed, [batch, kv_heads, capacity / CHUNK, head_dim, CHUNK] (see
    kernels/attention.cpp); `keys` and `values` give every layout as [batch, kv_heads, capacity, head_dim].

    huge_pages (the native cache on CPU): on 2 MB pages, for a cache its sequences fill (a run's own, sized to its
    prompts). A server's pool holds --context positions a slot and its sequences mostly use a fraction: on 2 MB
    pages a slot's first sequence maps a huge page in each (layer, key or value, head) region it writes, so on the
    bundled model a fresh slot took 180 MB and its first prefill chunk 56-466 ms, where 4 KB pages took 1 MB and
    34-39 ms; once mapped, 4 KB pages made passes 1-10% slower, most at long contexts (scripts/kv_pages_bench.py,
    docs/results/kv-pages.md). A pool takes 4 KB pages (huge_pages False): memory as sequences fill it, and no
    stall on a slot's first request."""

    def __init__(self, cfg: ModelConfig, batch: int, capacity: int, device="cpu", dtype=torch.float32,
                 blocked: bool = False, huge_pages: bool = True):
        self.capacity, self.blocked = math.ceil(capacity / CHUNK) * CHUNK, blocked
        hk, d = cfg.num_kv_heads, cfg.head_dim
        k_shape = (batch, hk, self.capacity // CHUNK, d, CHUNK) if blocked else (batch, hk, self.capacity, d)
        v_shape = (batch, hk, self.capacity, d)
        if blocked and huge_pages and torch.device(device).type == "cpu":  # the native kernels' cache: read by
            # every pass, so on huge pages (models/hugepages.py)
            arena = Arena()
            self.k = [arena.zeros(k_shape, dtype) for _ in range(cfg.num_layers)]
            self.v = [arena.zeros(v_shape, dtype) for _ in range(cfg.num_layers)]
            return
        if torch.device(device).type == "cpu":  # taking memory as sequences fill it, not all at start
            self.k = [lazy_zeros(k_shape, dtype) for _ in range(cfg.num_layers)]
            self.v = [lazy_zeros(v_shape, dtype) for _ in range(cfg.num_layers)]
            return
        self.k = [torch.zeros(k_shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(v_shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]

    def row(self, r: int) -> KVCache:
        """A view of sequence r alone (writes go to this cache)."""
        view = object.__new__(KVCache)
        view.capacity, view.blocked = self.capacity, self.blocked
        view.k, view.v = [t[r:r + 1] for t in self.k], [t[r:r + 1] for t in self.v]
        return view

    def keys(self, layer: int) -> torch.Tensor:
        """[batch, kv_heads, capacity, head_dim] (a copy when blocked)."""
        k = self.k[layer]
        return k.transpose(-1, -2).reshape(k.shape[0], k.shape[1], self.capacity, k.shape[3]) if self.blocked else k

    def values(self, layer: int) -> torch.Tensor:
        return self.v[layer]

    def copy_positions(self, src: KVCache, src_slot: int, dst_slot: int, n: int) -> int:
        """Row dst_slot gets row src_slot of `src` (a cache of the same model) at positions [0, n); blocked, up
        to the end of the last block (positions past a sequence's length are never read before written).
        Returns the positions copied (n, or less where a cache is shorter)."""
        n = max(0, min(n, self.capacity, src.capacity))
        if n == 0 or (src is self and src_slot == dst_slot):
            return n
        blocks = math.ceil(n / CHUNK)
        for k, v, sk, sv in zip(self.k, self.v, src.k, src.v):
            if self.blocked:
                k[dst_slot, :, :blocks] = sk[src_slot, :, :blocks]
                v[dst_slot, :, :blocks * CHUNK] = sv[src_slot, :, :blocks * CHUNK]
            else:
                k[dst_slot, :, :n] = sk[src_slot, :, :n]
                v[dst_slot, :, :n] = sv[src_slot, :, :n]
        return n

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


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
                return qmatrix(kernels, parts, integer, ACT_BITS.get(precision, 8), paired, arena.put, arena.zeros)

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


class RopeTable:
    """cos and sin [positions, head_dim] of one RoPE base (rotate-half layout: each angle twice), built ROPE_BLOCK
    positions at a time, up to what the caches made so far can hold (new_cache). Blocks are appended, never
    recomputed, so a position's angles stay the ones every earlier pass used and cached keys stay exact. A whole
    table of 131,072 positions at a head_dim of 256 is 256 MB (cos and sin); for 4k-token caches it is 8 MB.
    `scale` multiplies both (LongRoPE's attention factor, as llama.cpp and transformers apply it)."""

    def __init__(self, inv_freq: torch.Tensor, limit: int, device: torch.device, scale: float = 1.0):
        self.inv_freq, self.limit, self.device = inv_freq, limit, device  # [d/2]; the model's positions
        self.scale = scale
        self.cos = self.sin = torch.empty(0, 2 * inv_freq.numel(), device=device)

    def cover(self, positions: int) -> bool:
        """Extend the tables to hold `positions` (at most the limit), in whole blocks; True when they grew (they are
        new tensors then)."""
        want, have = min(self.limit, -(-positions // ROPE_BLOCK) * ROPE_BLOCK), self.cos.shape[0]
        if want <= have:
            return False
        cos, sin = [self.cos], [self.sin]
        for a in range(have, want, ROPE_BLOCK):
            angles = torch.arange(a, min(want, a + ROPE_BLOCK)).float()[:, None] * self.inv_freq[None, :]
            angles = torch.cat([angles, angles], dim=-1).to(self.device)  # [block, d]
            cos.append(angles.cos() * self.scale if self.scale != 1.0 else angles.cos())
            sin.append(angles.sin() * self.scale if self.scale != 1.0 else angles.sin())
        self.cos, self.sin = torch.cat(cos), torch.cat(sin)
        return True


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the rotate-half convention. x [B, n, heads, d]; cos/sin [B, n, 1, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Transformer:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], precision: str = "fp16",
                 device: str = "cpu", quantized: dict[str, QTensor] | None = None):
        """`quantized`: the GGUF's matrices (models.gguf_llama.read_matrices), needed by the gguf precisions."""
        if precision in GGUF_PRECISIONS and quantized is None:
            raise SpecdecError(f"--precision {precision} runs a GGUF file's own blocks; this model is not from a "
                               "GGUF file (use fp16)")
        self.cfg, self.precision, self.device = cfg, precision, torch.device(device)
        weights = {name: t.to(self.device) for name, t in weights.items()}
        self.kernels = None
        # the native fp16 block has no q/k norms, window or experts: those run natively on their GGUF blocks only
        native_fp16 = ("fp16",) if not (cfg.qk_norm or cfg.sliding_window or cfg.moe) else ()
        if (precision in native_fp16 + GGUF_PRECISIONS and self.device.type == "cpu" and cfg.head_dim % 8 == 0
                and cfg.hidden_size % 8 == 0):
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
        arena = Arena()  # the native kernels' weights, on huge pages where the OS grants them
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
                                     integer and pairs_layout(self.kernels), arena.put, arena.zeros)
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
                 gguf: Path | None = None) -> Transformer:
        """A model folder; `gguf`: the GGUF file it was converted from, whose blocks the gguf precisions run."""
        from specdec.models.checkpoint import check_weights, load_weights
        from specdec.models.gguf_convert import is_lean

        path = Path(path)
        cfg = ModelConfig.from_dir(path)
        weights = load_weights(path)
        check_weights(weights, cfg, path, matrices=not is_lean(path))
        quantized = read_matrices(gguf) if precision in GGUF_PRECISIONS and gguf is not None else None
        return cls(cfg, weights, precision, device, quantized)

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

    def kv_bytes_per_token(self) -> int:
        per = 2 if self.kernels is not None else 4  # the native kernels keep the cache in fp16
        return 2 * self.cfg.num_layers * self.cfg.num_kv_heads * self.cfg.head_dim * per

    def new_cache(self, batch: int, capacity: int, huge_pages: bool = True) -> KVCache:
        """huge_pages: see KVCache (False for a server's pool, whose sequences fill a fraction of each slot)."""
        if capacity > self.cfg.max_position_embeddings:
            capacity = self.cfg.max_position_embeddings
        self._cover_rope(capacity)
        if self.kernels is not None:
            return KVCache(self.cfg, batch, capacity, self.device, torch.float16, blocked=True, huge_pages=huge_pages)
        return KVCache(self.cfg, batch, capacity, self.device)

    def _cover_rope(self, positions: int) -> None:
        """The RoPE tables hold every position a cache of this capacity can."""
        self._rope.cover(positions)

    # --- forward -----------------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: torch.Tensor, cache: KVCache,
                last_only: torch.Tensor | None = None, prefill: bool = False, taps: tuple[int, ...] = ()):
        """Run tokens [B, n] at positions start[b] + i, writing their keys/values into `cache` (row b is cache
        slot b).

        Returns logits [B, n, vocab], or [B, vocab] at index last_only[b] of each row when given. With `taps`
        (layer indices; see forward_ragged) it returns (logits, features [B, n, len(taps) * hidden]), every
        position's features whatever last_only selects."""
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
            out = self.forward_ragged(tokens.reshape(-1), slots, pos.reshape(-1), cache, select, taps)
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
    def forward_ragged(self, tokens: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor, cache: KVCache,
                       select: torch.Tensor | None = None, taps: tuple[int, ...] = ()):
        """One decode/verify pass over a ragged batch: token-row r (tokens, slots, pos [R]) is at position pos[r]
        of cache slot slots[r]. A slot's rows are contiguous and at consecutive positions; slots may have any
        number of rows. Returns logits [R, vocab], or only for the rows `select` [S] -> [S, vocab].

        Each row's result is bit-identical whatever the other rows: a verify pass over k+1 drafts of one slot
        gives the logits of k+1 one-token passes, however many rows other slots add.

        `taps`: layer indices whose input (the residual stream entering that block; num_layers: the last block's
        output, before the final norm) is returned too, as (logits, features [R, len(taps) * hidden]) over all
        rows: what a draft head reads (EAGLE-3 fuses a low, a middle and a high layer)."""
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
                    _tap(feats, a, part, taps, layer)
                    block(part, part_slots, part_pos, *blk.native, cache.k[layer], cache.v[layer], self.cos,
                          self.sin, cfg.num_heads, cfg.num_kv_heads, cfg.rms_norm_eps)
                _tap(feats, a, part, taps, cfg.num_layers)
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
        pick = None if rows is None else _slot_picker(rows)  # the cache rows attention reads, decided once
        for layer, blk in enumerate(self.blocks):
            _tap(feats, 0, x, taps, layer)
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
        _tap(feats, 0, x, taps, cfg.num_layers)
        x = x.view(b, n, cfg.hidden_size)
        return (x, feats.view(b, n, -1)) if taps else x


def check_taps(taps: tuple[int, ...], num_layers: int) -> None:
    if any(not 0 <= t <= num_layers for t in taps):
        raise SpecdecError(f"feature taps must be layer indices in 0..{num_layers}, got {list(taps)}")


def _tap(feats: torch.Tensor | None, row0: int, x: torch.Tensor, taps: tuple[int, ...], layer: int) -> None:
    """Copy the residual stream x [rows, hidden] entering `layer` into its slots of feats [R, taps * hidden]."""
    if feats is None:
        return
    h = x.shape[-1]
    for j, t in enumerate(taps):
        if t == layer:
            feats[row0:row0 + x.shape[0], j * h:(j + 1) * h] = x


def _slot_picker(rows: torch.Tensor) -> slice | torch.Tensor:
    """An index of a cache's slots that selects `rows`: a slice (a view) when they are a contiguous range, else
    the rows themselves (a copy)."""
    lo = int(rows[0])
    if bool((rows == torch.arange(lo, lo + rows.numel(), device=rows.device)).all()):
        return slice(lo, lo + rows.numel())
    return rows


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             pos: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Scatter keys/values k, v [B, n, hk, d] into caches [slots, hk, capacity, d] at positions pos [B, n] of
    slots rows [B] (slot b when None)."""
    b, n, hk, d = k.shape
    rows = torch.arange(b, device=k.device) if rows is None else rows
    index = rows.view(b, 1).expand(b, n)  # [B, n]
    k_cache.transpose(1, 2)[index, pos] = k  # cache viewed [slots, capacity, hk, d]
    v_cache.transpose(1, 2)[index, pos] = v


def visible(keypos: torch.Tensor, pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Which keys a query sees: key position <= query position, and within `window` of it when given (the
    sliding-window layers of Gemma 3)."""
    seen = keypos <= pos
    return seen if window is None else seen & (keypos > pos - window)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma 2's soft capping: cap * tanh(x / cap), of attention scores and of the logits; cap 0: x itself."""
    return x if not cap else torch.tanh(x / cap) * cap


def attend_prefill(q, k_cache, v_cache, pos, scale: float | None = None, window: int | None = None,
                   cap: float = 0.0) -> torch.Tensor:
    """q [B, n, hq, d] at positions pos [B, n]; returns [B, n, hq, d]. Fused attention, masked by position.
    scale: of the scores (default head_dim^-1/2); window: see visible(); cap: see softcap() (spelled out: the
    fused kernel has no cap)."""
    end = int(pos.max()) + 1
    keypos = torch.arange(end, device=q.device).view(1, 1, 1, end)
    mask = visible(keypos, pos.view(pos.shape[0], 1, -1, 1), window)  # [B, 1, n, end]
    k, v = k_cache[:, :, :end], v_cache[:, :, :end]  # [B, hk, end, d]
    if cap:
        group = q.shape[2] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [B, hq, end, d]
        s = torch.matmul(q.transpose(1, 2), k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
        s = softcap(s, cap).masked_fill(~mask, float("-inf"))  # [B, hq, n, end]
        return torch.matmul(torch.softmax(s, dim=-1), v).transpose(1, 2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


def attend_decode(q, k_cache, v_cache, pos, group: int, scale: float | None = None,
                  window: int | None = None, cap: float = 0.0) -> torch.Tensor:
    """Batch-invariant attention for a few query positions. q [B, n, hq, d]; returns [B, n, hq, d]."""
    b, n, hq, d = q.shape
    per_call = max(1, MAX_QUERY_ROWS // group)  # positions per matrix product
    outs = []
    for s in range(0, n, per_call):
        outs.append(_attend_group(q[:, s:s + per_call], k_cache, v_cache, pos[:, s:s + per_call], group, scale,
                                  window, cap))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def _attend_group(q, k_cache, v_cache, pos, group: int, scale: float | None, window: int | None,
                  cap: float = 0.0) -> torch.Tensor:
    b, m, hq, d = q.shape
    real = m
    if m < MIN_QUERY_POSITIONS:  # pad with copies of the last query so every product has the same shape
        extra = MIN_QUERY_POSITIONS - m
        q = torch.cat([q, q[:, -1:].expand(b, extra, hq, d)], dim=1)
        pos = torch.cat([pos, pos[:, -1:].expand(b, extra)], dim=1)
        m = MIN_QUERY_POSITIONS
    hk = hq // group
    n_chunks = int(pos.max()) // CHUNK + 1
    length = n_chunks * CHUNK
    kc = k_cache[:, :, :length].view(b, hk, n_chunks, CHUNK, d)  # [B, hk, C#, C, d]
    vc = v_cache[:, :, :length].view(b, hk, n_chunks, CHUNK, d)
    qg = q.view(b, m, hk, group, d).permute(0, 2, 3, 1, 4).reshape(b, hk, 1, group * m, d)  # [B, hk, 1, g*m, d]
    s = torch.matmul(qg, kc.transpose(-1, -2)) * (d ** -0.5 if scale is None else scale)  # [B, hk, C#, g*m, C]
    s = softcap(s, cap).view(b, hk, n_chunks, group, m, CHUNK)
    keypos = torch.arange(length, device=q.device).view(1, 1, n_chunks, 1, 1, CHUNK)
    s = s.masked_fill(~visible(keypos, pos.view(b, 1, 1, 1, m, 1), window), float("-inf"))
    e = torch.exp(s - s.amax(dim=(2, 5), keepdim=True))  # [B, hk, C#, g, m, C]
    den = e.sum(dim=-1).sum(dim=2)  # [B, hk, g, m]
    num = torch.matmul(e.view(b, hk, n_chunks, group * m, CHUNK), vc).sum(dim=2)  # [B, hk, g*m, d]
    out = num.view(b, hk, group, m, d) / den.unsqueeze(-1)  # [B, hk, g, m, d]
    return out.permute(0, 3, 1, 2, 4).reshape(b, m, hq, d)[:, :real]
