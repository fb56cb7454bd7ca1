"""Text <-> token ids for a model folder: `tokenizer.json` through the `tokenizers` library, the chat template
through sandboxed jinja2, and a streaming detokenizer.

    tok = Tokenizer.from_dir(bundled_model_dir())
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    ids = tok.encode(prompt)                      # the template already holds the special tokens
    stream = IncrementalDecoder(tok)
    for ...: print(stream.step(ids), end="")     # ids grows by one or more tokens per call
    print(stream.flush(ids))
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError

# Tokens that end a chat turn in common templates. One that is in the vocabulary as a special token and
# appears in the chat template also stops generation, besides the configured eos token.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>")


class Tokenizer:
    """A `tokenizers.Tokenizer` plus what `tokenizer_config.json` adds: special tokens and the chat template."""

    def __init__(self, backend, config: dict[str, Any] | None = None, generation: dict[str, Any] | None = None):
        self.backend = backend  # tokenizers.Tokenizer
        self.config = dict(config or {})
        self._generation = dict(generation or {})

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        from tokenizers import Tokenizer as Backend

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        try:
            backend = Backend.from_file(str(path))
        except Exception as e:  # missing file, or JSON the tokenizers library rejects
            raise SpecdecError(f"{path}: cannot load tokenizer ({e})") from None
        config = _read_json(model_dir / "tokenizer_config.json")
        jinja = model_dir / "chat_template.jinja"  # where transformers saves the template since 4.43
        if not config.get("chat_template") and jinja.is_file():
            try:
                config["chat_template"] = jinja.read_text(encoding="utf-8")
            except (OSError, ValueError) as e:
                raise SpecdecError(f"{jinja}: cannot read ({e})") from None
        return cls(backend, config, _read_json(model_dir / "generation_config.json"))

    # ---- ids ----------------------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids for `text`. Special tokens written in the text (like `<|im_start|>`) are always matched
        whole; `add_special_tokens` adds the configured bos/eos around it."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token(self) -> str | None:
        return _content(self.config.get("bos_token"))

    @property
    def eos_token(self) -> str | None:
        return _content(self.config.get("eos_token"))

    @property
    def bos_token_id(self) -> int | None:
        return self.token_id(self.bos_token)

    @cached_property
    def eos_token_ids(self) -> set[int]:
        """Ids that end generation: the configured eos token, generation_config's eos ids, and the template's
        end-of-turn token (`<|im_end|>` for ChatML) when it is a special token."""
        ids = {self.token_id(self.eos_token)}
        gen = self._generation.get("eos_token_id")
        ids.update(gen if isinstance(gen, list) else [gen])
        template = self.chat_template or ""
        specials = {t.content for t in self.backend.get_added_tokens_decoder().values() if t.special}
        ids.update(self.token_id(t) for t in END_OF_TURN_TOKENS if t in specials and t in template)
        return {i for i in ids if i is not None}

    def fingerprint(self) -> str:
        """sha256 of the vocabulary in id order (added tokens included). Equal fingerprints mean token ids mean
        the same strings, the condition for a draft model to propose tokens for a target."""
        by_id = sorted(self.backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        return hashlib.sha256(json.dumps(by_id, ensure_ascii=False).encode("utf-8")).hexdigest()

    # ---- chat ---------------------------------------------------------------------------------------------
    @property
    def chat_template(self) -> str | None:
        """The template in force: the model's own (tokenizer_config.json, chat_template.jinja, a GGUF's
        tokenizer.chat_template) unless set_chat_template replaced it. Of a list of named templates (an older
        tokenizer_config.json form), the one named "default"."""
        template = self.config.get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template or None

    def set_chat_template(self, template: str | None) -> None:
        """Put `template` in force in place of the model's own (None: no template). The ids that end generation
        follow it: its end-of-turn token (Gemma's <end_of_turn>) stops generation, the model's own template's
        does not unless it is also the configured eos token."""
        self.config["chat_template"] = template
        self.__dict__.pop("eos_token_ids", None)  # the cached_property, read again with this template

    @property
    def special_tokens(self) -> dict[str, str]:
        """What a chat template may write by name: bos_token, eos_token, unk_token, pad_token (those set)."""
        named = {k: _content(self.config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        return {k: v for k, v in named.items() if v is not None}

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        """The prompt text for `messages` ([{"role": ..., "content": ...}]), rendered like transformers does."""
        if not self.chat_template:
            raise SpecdecError("this tokenizer has no chat template; pass plain text instead")
        return render_chat_template(self.chat_template, messages, add_generation_prompt,
                                    {**self.special_tokens, **kwargs})


def render_chat_template(template: str, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                         variables: dict[str, Any] | None = None) -> str:
    """`template` (Jinja) rendered over `messages` as transformers' apply_chat_template renders it: the same
    sandbox and options, the special tokens and any other `variables` passed by name (one not passed is
    undefined, and renders as nothing)."""
    try:
        return _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **(variables or {}))
    except Exception as e:  # jinja2 TemplateError (syntax too), or raise_exception() from inside the template
        raise SpecdecError(f"chat template failed: {e}") from None


class IncrementalDecoder:
    """Streaming detokenization: `step(ids)` returns the text that the newest ids completed.

    Decoding tokens one at a time is wrong in two ways: a character whose UTF-8 bytes span tokens decodes
    to U+FFFD halves, and some decoders treat the first token specially (a leading space). So each step decodes
    a short window: ids[prefix:read] (already emitted, kept as context) and ids[prefix:]; the new text is the
    difference, held back while it ends in an incomplete character (U+FFFD). `flush` emits whatever is held."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.prefix = 0  # ids[prefix:read] were emitted already and are decoded again as context
        self.read = 0  # ids[:read] have been emitted

    def step(self, ids: Sequence[int]) -> str:
        return self._advance(ids, final=False)

    def flush(self, ids: Sequence[int]) -> str:
        return self._advance(ids, final=True)

    def _advance(self, ids: Sequence[int], final: bool) -> str:
        if len(ids) <= self.read:
            return ""
        decode = lambda s: self.tokenizer.decode(s, skip_special_tokens=self.skip_special_tokens)
        seen = decode(ids[self.prefix:self.read])
        text = decode(ids[self.prefix:])
        if len(text) <= len(seen) and not final:
            return ""  # e.g. a byte that starts a character: no visible text yet
        if text.endswith("\ufffd") and not final:
            return ""
        self.prefix, self.read = self.read, len(ids)
        return text[len(seen):]


@lru_cache(maxsize=16)
def _compile(template: str):
    return _environment().from_string(template)


@lru_cache(maxsize=1)
def _environment():
    """jinja2's immutable sandbox, configured as transformers configures it for chat templates."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _content(token: Any) -> str | None:
    """A special token from tokenizer_config.json: a string, or an AddedToken dict {"content": ...}."""
    return token.get("content") if isinstance(token, dict) else token


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SpecdecError(f"{path}: cannot read ({e})") from None


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of raw text given as a prompt: with the bos token first when the tokenizer's config asks for it
    (Gemma's does, and it degenerates without one), as Hugging Face tokenizers encode by default. A chat
    template writes its own bos, so a rendered chat is encoded as it is."""
    ids = tokenizer.encode(text)
    bos = getattr(tokenizer, "bos_token_id", None)
    if getattr(tokenizer, "config", {}).get("add_bos_token") and bos is not None and ids[:1] != [bos]:
        ids = [bos, *ids]
    return ids


def encode_messages(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat, through the chat template in force, ready for the assistant's answer. Without a
    template it is refused (SpecdecError), never joined into text the model was not trained on."""
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    if chat and tokenizer.chat_template:
        return encode_messages(tokenizer, [{"role": "user", "content": text}])
    return encode_text(tokenizer, text)
