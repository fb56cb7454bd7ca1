"""The same prompts through Hugging Face transformers `generate` on the same weights (fp32, greedy): plain,
with prompt lookup, and with an assistant model when a draft model is given. transformers loads only here."""

from __future__ import annotations

import time

import torch

from specdec.bench.runner import Method, Turn
from specdec.errors import SpecdecError


class _Clock:
    """A generate() streamer that notes when tokens arrive; the first put() is the prompt."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.extend([time.perf_counter() - self.t0] * int(value.numel()))

    def end(self) -> None:
        pass


def load_hf(path, what: str = "model"):
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise SpecdecError("--compare hf needs transformers (pip install 'specdec[hf]')") from None
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    except (OSError, ValueError) as e:
        raise SpecdecError(f"{path}: transformers cannot load this {what} ({e})") from None


def hf_method(name: str, model, tokenizer, baseline: str | None, k=None, **extra) -> Method:
    eos = sorted(tokenizer.eos_token_ids)

    @torch.inference_mode()
    def generate(ids: list[int], max_new_tokens: int) -> Turn:
        clock = _Clock()
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None,
                             top_k=None, eos_token_id=eos, pad_token_id=eos[0], streamer=clock, **extra)
        seconds = time.perf_counter() - clock.t0
        new = out[0, len(ids):].tolist()
        finish = "length"
        if eos and any(t in eos for t in new):
            new = new[: next(i for i, t in enumerate(new) if t in eos)]
            finish = "eos"
        times = clock.times[: len(new)]
        return Turn(list(ids), new, tokenizer.decode(new), finish, seconds, times[0] if times else seconds, times)

    return Method(name, generate, "hf", baseline, k)


def hf_methods(target_path, tokenizer, k: int, ngram_max: int, draft_path=None) -> list[Method]:
    """HF plain, HF prompt lookup (k tokens, n-grams up to ngram_max), and HF assisted generation."""
    model = load_hf(target_path)
    methods = [hf_method("hf plain", model, tokenizer, None),
               hf_method(f"hf prompt-lookup k={k}", model, tokenizer, "hf plain", k,
                         prompt_lookup_num_tokens=k, max_matching_ngram_size=ngram_max)]
    if draft_path is not None:
        draft = load_hf(draft_path, "draft model")
        methods.append(hf_method(f"hf assisted k={k}", model, tokenizer, "hf plain", k, assistant_model=draft,
                                 num_assistant_tokens=k))
    return methods
