"""An EAGLE-3 draft head: one decoder layer that drafts from the target's own hidden states.

Inputs at head position p: the token x_p (through the target's embedding) and a hidden vector g. For the context
g is the target's features at p - 1 (the residual stream entering `taps`, a low, a middle and a high layer,
concatenated and projected by `fc`); for a drafted step it is the head's own output at the step before. The
layer attends over its own keys and values, and its output, normed, goes through a head over a truncated
vocabulary (`draft_vocab` most frequent target tokens; `d2t` maps a draft id to its target id).

    residual = g                  (hidden_norm(g) when norm_before_residual)
    a   = attn(cat(input_layernorm(emb), hidden_norm(g))) + residual
    out = mlp(post_attention_layernorm(a)) + a                 the next step's g
    logits = lm_head(norm(out))                                [.., draft_vocab]

The tensor names are those of the EAGLE-3 heads vLLM and SGLang load (see heads/export.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specdec.errors import SpecdecError

CONFIG = "head.json"
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class HeadConfig:
    hidden: int  # the target's hidden size (the head's too)
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # the MLP's width
    eps: float  # RMS norm epsilon
    rope_theta: float
    max_positions: int
    target_vocab: int
    draft_vocab: int
    taps: tuple[int, ...]  # target layers whose input residual stream is fused (see Transformer.forward_ragged)
    norm_before_residual: bool = False

    @classmethod
    def for_target(cls, cfg, draft_vocab: int, taps: tuple[int, ...]) -> HeadConfig:
        return cls(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                   cfg.rms_norm_eps, cfg.rope_theta, cfg.max_position_embeddings, cfg.vocab_size, draft_vocab,
                   tuple(taps))


def default_taps(num_layers: int) -> tuple[int, ...]:
    """A low, a middle and a high layer, as vLLM picks them for EAGLE-3 (fewer for a model of under 3 layers)."""
    return tuple(sorted({min(2, num_layers), num_layers // 2, max(num_layers - 3, 0)}))


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, heads, d] rotated by cos, sin [n, 1, d] (the target's rotate-half convention)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class EagleHead(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        h, a, kv = cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.fc = nn.Linear(len(cfg.taps) * h, h, bias=False)
        self.q_proj = nn.Linear(2 * h, a, bias=False)
        self.k_proj = nn.Linear(2 * h, kv, bias=False)
        self.v_proj = nn.Linear(2 * h, kv, bias=False)
        self.o_proj = nn.Linear(a, h, bias=False)
        self.gate_proj = nn.Linear(h, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, h, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(h))
        self.hidden_norm = nn.Parameter(torch.ones(h))
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.norm = nn.Parameter(torch.ones(h))
        self.lm_head = nn.Linear(h, cfg.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab, dtype=torch.long))  # target id - draft id
        self.register_buffer("t2d", torch.zeros(cfg.target_vocab, dtype=torch.bool))  # in the draft vocabulary
        d = cfg.head_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", torch.cat([inv, inv]), persistent=False)  # [d]

    # --- vocabulary ------------------------------------------------------------------------------------------

    def set_vocab(self, draft_ids: torch.Tensor) -> None:
        """draft_ids [draft_vocab]: the target ids of the draft vocabulary, ascending."""
        self.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
        self.t2d.zero_()
        self.t2d[draft_ids] = True

    def target_ids(self) -> torch.Tensor:
        return self.d2t + torch.arange(self.cfg.draft_vocab, device=self.d2t.device)  # [draft_vocab]

    # --- the layer -------------------------------------------------------------------------------------------

    def qkv(self, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor):
        """emb, g [n, hidden] at positions pos [n] -> q [n, heads, d], k, v [n, kv_heads, d], residual [n, hidden]."""
        c = self.cfg
        hn = rms(g, self.hidden_norm, c.eps)
        x = torch.cat([rms(emb, self.input_layernorm, c.eps), hn], dim=-1)  # [n, 2 * hidden]
        n = x.shape[0]
        ang = pos.float()[:, None, None] * self.inv_freq  # [n, 1, d]
        cos, sin = ang.cos(), ang.sin()
        q = rope(self.q_proj(x).view(n, c.heads, c.head_dim), cos, sin)
        k = rope(self.k_proj(x).view(n, c.kv_heads, c.head_dim), cos, sin)
        v = self.v_proj(x).view(n, c.kv_heads, c.head_dim)
        return q, k, v, (hn if c.norm_before_residual else g)

    def finish(self, att: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """att [n, heads * d] -> (out [n, hidden], logits [n, draft_vocab])."""
        out = self.mlp(att, residual)
        return out, self.logits(out)

    def mlp(self, att: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """att [n, heads * d] -> the layer's output [n, hidden]: the output projection, the residual, the MLP."""
        c = self.cfg
        a = self.o_proj(att) + residual
        h = rms(a, self.post_attention_layernorm, c.eps)
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)) + a

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """out [n, hidden] -> logits [n, draft_vocab]."""
        return self.lm_head(rms(out, self.norm, self.cfg.eps))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """q [n, heads, d] over k, v [m, kv_heads, d] (mask [n, m] True where visible) -> [n, heads * d]."""
        c = self.cfg
        n = q.shape[0]
        q = q.view(n, c.kv_heads, c.heads // c.kv_heads, c.head_dim)  # [n, kv, rep, d]: heads sharing a kv head
        s = torch.einsum("ngrd,mgd->grnm", q, k) * c.head_dim ** -0.5  # [kv, rep, n, m]
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return torch.einsum("grnm,mgd->ngrd", s.softmax(-1), v).reshape(n, -1)

    def attend_rows(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each row over keys of its own: q [n, heads, d], k, v [n, m, kv_heads, d], mask [n, m] True where
        visible -> [n, heads * d]."""
        c = self.cfg
        n = q.shape[0]
        q = q.view(n, c.kv_heads, c.heads // c.kv_heads, c.head_dim)  # [n, kv, rep, d]
        s = torch.einsum("ngrd,nmgd->ngrm", q, k) * c.head_dim ** -0.5  # [n, kv, rep, m]
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
        return torch.einsum("ngrm,nmgd->ngrd", s.softmax(-1), v).reshape(n, -1)

    # --- training: every position at once, unrolled over `steps` drafting steps ------------------------------

    def unrolled(self, emb: torch.Tensor, feats: torch.Tensor, steps: int,
                 rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Training-time test over one sequence. emb [n, steps, hidden]: column j holds the token fed at step j
        (x_p, then the target's choices after it); feats [n, taps * hidden]: the target's features at p - 1
        (zeros at p = 0). Step j at position p attends to the context's step-0 entries at positions <= p and to
        its own earlier steps' entries at p: exactly what drafting step j sees. rows [r]: the positions whose
        predictions are wanted (default all; every position still gives its step-0 keys and values). Returns per
        step logits [r, draft_vocab]."""
        n = emb.shape[0]
        pos = torch.arange(n, device=emb.device)
        rows = pos if rows is None else rows
        g = self.fc(feats)  # [n, hidden]
        q, k0, v0, res = self.qkv(emb[:, 0], g, pos)
        visible = pos[None, :] <= rows[:, None]  # [r, n]
        out, logits = self.finish(self.attend(q[rows], k0, v0, visible), res[rows])
        result, ks, vs = [logits], [], []
        for j in range(1, steps):
            q, k, v, res = self.qkv(emb[rows, j], out, rows + j)
            ks.append(k)
            vs.append(v)
            kk, vv = torch.stack(ks, 1), torch.stack(vs, 1)  # [r, j, kv, d]: each position's own drafted entries
            out, logits = self.finish(self._attend_unrolled(q, k0, v0, kk, vv, visible), res)
            result.append(logits)
        return result

    def _attend_unrolled(self, q, k0, v0, kk, vv, visible) -> torch.Tensor:
        """q [r, heads, d] over the context's k0, v0 [n, kv, d] (visible [r, n]) and each row's own earlier
        steps kk, vv [r, j, kv, d] -> [r, heads * d]."""
        c = self.cfg
        r = q.shape[0]
        q = q.view(r, c.kv_heads, c.heads // c.kv_heads, c.head_dim)  # [r, kv, rep, d]
        scale = c.head_dim ** -0.5
        s0 = torch.einsum("ngrd,mgd->grnm", q, k0).masked_fill(~visible, float("-inf")) * scale  # [kv, rep, r, n]
        s1 = torch.einsum("ngrd,njgd->grnj", q, kk) * scale  # [kv, rep, r, j]
        w = torch.cat([s0, s1], -1).softmax(-1)
        n = k0.shape[0]
        att = torch.einsum("grnm,mgd->ngrd", w[..., :n], v0) + torch.einsum("grnj,njgd->ngrd", w[..., n:], vv)
        return att.reshape(r, -1)

    # --- files -----------------------------------------------------------------------------------------------

    def tensors(self) -> dict[str, torch.Tensor]:
        """The weights under the EAGLE-3 names (layers.0.*, fc, norm, lm_head, d2t, t2d)."""
        layer = {"self_attn.q_proj": self.q_proj, "self_attn.k_proj": self.k_proj, "self_attn.v_proj": self.v_proj,
                 "self_attn.o_proj": self.o_proj, "mlp.gate_proj": self.gate_proj, "mlp.up_proj": self.up_proj,
                 "mlp.down_proj": self.down_proj}
        out = {f"layers.0.{k}.weight": m.weight for k, m in layer.items()}
        for k in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            out[f"layers.0.{k}.weight"] = getattr(self, k)
        out.update({"fc.weight": self.fc.weight, "norm.weight": self.norm, "lm_head.weight": self.lm_head.weight,
                    "d2t": self.d2t, "t2d": self.t2d})
        return {k: v.detach().contiguous() for k, v in out.items()}

    def save(self, path: str | Path, dtype: torch.dtype = torch.float16, meta: dict | None = None) -> None:
        """The weights, then the config (each written whole or not at all: a failure keeps the files there)."""
        from safetensors.torch import save

        from specdec.atomic import write_bytes_atomic, write_text_atomic

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path / WEIGHTS, save({k: v.to(dtype) if v.is_floating_point() else v
                                                 for k, v in self.tensors().items()}))
        write_text_atomic(path / CONFIG, json.dumps({"method": "eagle3", **asdict(self.cfg), **(meta or {})},
                                                    indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> EagleHead:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(path)
        try:
            raw = json.loads((path / CONFIG).read_text())
            fields = {k: raw[k] for k in HeadConfig.__dataclass_fields__}
            fields["taps"] = tuple(fields["taps"])
            head = cls(HeadConfig(**fields))
            tensors = load_file(str(path / WEIGHTS))
        except (OSError, KeyError, TypeError, ValueError, RuntimeError, SafetensorError) as e:  # a corrupt file
            raise SpecdecError(f"{path}: not a draft head written by `specdec train-draft` ({e})") from None
        own = head.tensors()
        if set(tensors) != set(own) or any(tensors[k].shape != own[k].shape for k in own):
            raise SpecdecError(f"{path}: its tensors do not match its {CONFIG}")
        with torch.no_grad():
            for name, t in tensors.items():
                _param(head, name).copy_(t.to(own[name].dtype))
        return head.eval()


def _param(head: EagleHead, name: str) -> torch.Tensor:
    """The parameter or buffer stored under an EAGLE-3 tensor name."""
    if name in ("d2t", "t2d"):
        return getattr(head, name)
    if name == "norm.weight":
        return head.norm
    short = name.removeprefix("layers.0.").removesuffix(".weight").split(".")[-1]
    obj = getattr(head, short)
    return obj.weight if isinstance(obj, nn.Linear) else obj
