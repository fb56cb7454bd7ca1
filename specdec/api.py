"""specdec in one import. `specdec.load` builds the target model and the drafter once and returns a `Generator`,
which turns prompts into text; `specdec.generate` does both in one call (it loads each time: keep a Generator for
more than one call).

    import specdec
    gen = specdec.load("default", drafter="ngram")  # the bundled SmolLM2-135M, prompt lookup
    result = gen("Repeat this sentence exactly: The quick brown fox.", max_new_tokens=64)
    print(result.text, result.stats.summary()["alpha"])

Output is the target's own: greedy by default (identical to plain decoding), and with a temperature distributed
exactly as the target samples (with `kv_cache="q8_0"` or `"q4_0"`, the target on that quantized KV cache: a
slightly different model, reproduced as exactly). Everything here is a thin layer over runtime.build, engine.Engine and
engine.calibrate.policy_for, which the command line uses too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdec.errors import SpecdecError


@dataclass
class Generator:
    """A loaded target model and drafter. Call it with a prompt (a list of prompts for a batch)."""

    target: Any  # models.loader.LoadedModel
    drafter: Any  # drafters.base.Drafter
    _engine: Any = field(default=None, repr=False)
    # one policy per way of speculating, kept across calls (an `auto` planner goes on learning the acceptance)
    _policies: dict = field(default_factory=dict, repr=False)

    def __call__(self, prompt: str | list[str], max_new_tokens: int = 128, k: int | str = "auto",
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 stop: tuple[str, ...] = (), chat: bool = True, policy: str | None = None):
        """GenerationResult (text, token_ids, finish_reason, stats) of one prompt, or a list of them for a list.
        `k` and `policy` as the command line's --k and --policy (engine/speculation.py): "auto" (the default: up to
        DEFAULT_K drafts a round, where they pay) or an integer (exactly that many; 0: plain decoding), and "auto",
        "fixed" or "never"; `chat`: through the model's chat template when it has one."""
        from specdec.engine.calibrate import policy_for
        from specdec.engine.generate import Engine
        from specdec.engine.sequence import GenerationConfig
        from specdec.engine.speculation import speculation
        from specdec.models.text.tokenizer import encode_prompt
        from specdec.sampling.warp import SamplingConfig

        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise SpecdecError("prompt: a string, or a non-empty list of strings")
        how = speculation(k, policy, self.drafter.name, names=("k", "policy"), zero_is_never=True)
        cfg = GenerationConfig(max_new_tokens, SamplingConfig(temperature, top_k, top_p, seed), tuple(stop))
        if self._engine is None:
            self._engine = Engine(self.target.model, self.target.tokenizer)
        if how not in self._policies:
            self._policies[how] = policy_for(how, self.target, self.drafter)
        ids = [encode_prompt(self.target.tokenizer, p, chat) for p in prompts]
        results = self._engine.generate(ids, cfg, self.drafter, self._policies[how])
        return results[0] if isinstance(prompt, str) else results


def load(model: str = "default", drafter: str = "ngram", precision: str | None = None, device: str = "cpu",
         draft_model: str | None = None, chat_template: str | None = None,
         kv_cache: str | None = None) -> Generator:
    """A Generator for `model` ('default': the bundled SmolLM2-135M; a Hugging Face folder; a .gguf) drafting with
    `drafter` (ngram, suffix, eagle, draft-model with `draft_model`, none, or a cascade such as "ngram,eagle").
    `chat_template`: a built-in name (chatml, llama3, llama2, mistral, gemma, phi3) or a Jinja file, in place of
    the model's own; a model with neither warns once here that chat prompts go as raw text.
    `kv_cache`: the target's KV cache type, as the command line's --kv-cache and llama.cpp's --cache-type-k/-v:
    None or "f16" (exact, the default), "q8_0" or "q4_0" (keys and values quantized in blocks of 32: about half or
    a quarter of f16's memory a position, a slightly different model, whose output speculation reproduces exactly;
    native kernels only, else a SpecdecError). A draft model's cache stays f16."""
    import warnings

    from specdec.models.text.chat_templates import no_template_line, read_chat_template, use_chat_template
    from specdec.runtime import ModelSpec, build

    chosen = read_chat_template(chat_template, "chat_template=")
    target, drafter_ = build(ModelSpec(model=model, drafter=drafter, draft_model=draft_model, precision=precision,
                                       device=device, kv_cache=kv_cache))
    if use_chat_template(target.tokenizer, chosen, "chat_template=NAME|FILE") == "none":
        warnings.warn(no_template_line(target.tokenizer, "prompts go to it as raw text",
                                       "give chat_template=NAME|FILE"), stacklevel=2)
    return Generator(target, drafter_)


def generate(prompt: str | list[str], model: str = "default", drafter: str = "ngram", kv_cache: str | None = None,
             **options):
    """load(model, drafter, kv_cache=kv_cache) called once on `prompt`; `options` as Generator's (max_new_tokens, k,
    temperature, ...)."""
    return load(model, drafter, kv_cache=kv_cache)(prompt, **options)
