"""Rebuild a `tokenizer.json` (and `tokenizer_config.json`) from a GGUF file's tokenizer metadata.

A GGUF carries no tokenizer.json; llama.cpp stores the pieces under `tokenizer.ggml.*` instead: the tokens
(already spelled in the byte-level alphabet for byte-level BPE), the merges as "left right" strings, a type per
token (1 normal, 3 control, 4 user-defined) and the name of the pre-tokenizer (`tokenizer.ggml.pre`). Only
byte-level BPE (`tokenizer.ggml.model == "gpt2"`) is supported; that is what SmolLM2, Llama 3 and Qwen ship.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from specdec.errors import SpecdecError

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types that are matched whole, before BPE

# How each pre-tokenizer family cuts text into words before BPE. "gpt2" is the GPT-2 regex that
# `ByteLevel(use_regex=True)` applies; "digits+gpt2" first isolates every digit (llama.cpp runs `\p{N}` before the
# GPT-2 regex for these models, and their Hugging Face tokenizers put a `Digits` step first); "llama3" is the
# Llama 3 regex (digits in runs of up to three, case-insensitive contractions).
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2 and Qwen3 ("qwen2"): Llama 3's regex with digits one at a time.
_QWEN2_REGEX = _LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
_PRE_FAMILY = {
    "default": "gpt2", "gpt-2": "gpt2", "gpt2": "gpt2", "olmo": "gpt2", "jais": "gpt2",
    "smollm": "digits+gpt2", "starcoder": "digits+gpt2", "refact": "digits+gpt2", "codeshell": "digits+gpt2",
    "llama-bpe": "llama3", "llama3": "llama3", "llama-v3": "llama3", "smaug-bpe": "llama3", "falcon3": "llama3",
    "qwen2": "qwen2",
}


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    family = _PRE_FAMILY.get(pre)
    if family is None:
        raise SpecdecError(f"GGUF tokenizer pre-tokenizer {pre!r} is not supported "
                           f"(supported: {', '.join(sorted(_PRE_FAMILY))})")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                          use_regex=family not in ("llama3", "qwen2"))
    if family == "gpt2":
        return byte_level
    if family == "digits+gpt2":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    regex = _QWEN2_REGEX if family == "qwen2" else _LLAMA3_REGEX
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"), byte_level])


def special_token(meta: dict[str, Any], key: str, tokens: list[str]) -> str | None:
    """The token string for the special-token id stored under `tokenizer.ggml.<key>`, or None."""
    index = meta.get(f"tokenizer.ggml.{key}")
    return tokens[index] if index is not None and 0 <= index < len(tokens) else None


def vocabulary(meta: dict[str, Any], model: str, refused: str) -> tuple[list[str], list[int]]:
    """The tokens and token types of a GGUF vocabulary whose tokenizer.ggml.model is `model` (else SpecdecError:
    the model found, then `refused`); here and in spm.py."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != model:
        raise SpecdecError(f"GGUF tokenizer model {kind!r} {refused}")
    if "tokenizer.ggml.tokens" not in meta:
        raise SpecdecError("GGUF metadata has no tokenizer.ggml.tokens; cannot build a tokenizer")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    return tokens, meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)


def token_ids(tokens: list[str]) -> dict[str, int]:
    """token -> id; SpecdecError when a token appears twice (a BPE vocabulary maps each once)."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise SpecdecError("GGUF tokenizer has duplicate tokens; cannot build a BPE vocabulary")
    return vocab


def build_tokenizer(meta: dict[str, Any]) -> tuple[Tokenizer, dict[str, Any]]:
    """(tokenizers.Tokenizer, tokenizer_config dict) from GGUF metadata (key -> decoded value)."""
    tokens, types = vocabulary(meta, "gpt2", "is not supported (only byte-level BPE, 'gpt2')")
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = token_ids(tokens)

    try:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    except Exception as e:  # the tokenizers library raises a bare Exception, e.g. for a merge of unknown tokens
        raise SpecdecError(f"GGUF tokenizer metadata is inconsistent ({e})") from None
    tok.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED])

    return tok, with_specials(tok, meta, tokens, vocab, bos_default=False, typed_pair=False)


def with_specials(tok: Tokenizer, meta: dict[str, Any], tokens: list[str], vocab: dict[str, int], bos_default: bool,
                  typed_pair: bool) -> dict[str, Any]:
    """The bos and eos the file says to add (add_bos_token: `bos_default` where it says nothing, as llama.cpp
    defaults per tokenizer model) set as `tok`'s post-processor; returns the tokenizer_config dict. `typed_pair`:
    a pair's second sequence has type 1 on its bos and eos too (SentencePiece's template)."""
    bos, eos = special_token(meta, "bos_token_id", tokens), special_token(meta, "eos_token_id", tokens)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", bos_default)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        head, tail = ([bos] if add_bos else []), ([eos] if add_eos else [])
        second = [f"{t}:1" if typed_pair else t for t in head] + ["$B:1"] + \
            [f"{t}:1" if typed_pair else t for t in tail]
        tok.post_processor = processors.TemplateProcessing(
            single=head + ["$A"] + tail, pair=head + ["$A"] + tail + second,
            special_tokens=[(t, vocab[t]) for t in dict.fromkeys(head + tail)])
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": special_token(meta, "unknown_token_id", tokens),
        "pad_token": special_token(meta, "padding_token_id", tokens),
        "clean_up_tokenization_spaces": False,
    }
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config
