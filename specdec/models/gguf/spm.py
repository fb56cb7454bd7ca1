"""The SentencePiece tokenizer of a GGUF file (`tokenizer.ggml.model == "llama"`): Gemma 2 and 3, Phi-3, Llama 2.

A SentencePiece BPE vocabulary with scores but no merges, rebuilt as transformers' GGUF loader rebuilds it
(integrations/gguf/gguf_tokenizer_mapping.py): runs of spaces respelled with U+2581, merges derived from the
vocabulary in token order, BPE with byte fallback, spaces normalized to U+2581; control tokens special,
user-defined tokens added whole, <bos> added when asked. `add_space_prefix` (llama.cpp's default for these
vocabularies: Phi-3's and Llama 2's say true, Gemma's false) puts a U+2581 before the text and before each piece
of text after a token matched whole, as llama.cpp does; decoding takes the first one off again.
"""

from __future__ import annotations

from typing import Any

from specdec.errors import SpecdecError
from specdec.models.gguf.tokenizer import special_token, token_ids, vocabulary, with_specials

UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4  # llama.cpp token types (UNKNOWN: <unk>, matched whole as control ones)


def build_tokenizer(meta: dict[str, Any]):
    """(tokenizers.Tokenizer, tokenizer_config dict) for a SentencePiece vocabulary (see above)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    original, types = vocabulary(meta, "llama", "is not SentencePiece ('llama')")
    space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))  # llama.cpp's default for SentencePiece
    # a token of spaces only is stored with real spaces; text reaches the vocabulary with U+2581 instead
    tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in original]
    vocab = token_ids(tokens)
    unk = special_token(meta, "unknown_token_id", tokens)
    scores = meta.get("tokenizer.ggml.scores")
    if scores is not None and len(scores) != len(tokens):
        raise SpecdecError(f"GGUF tokenizer has {len(scores)} scores for {len(tokens)} tokens")
    if str(meta.get("general.architecture", "")).startswith("gemma"):
        scores = None  # Gemma's scores do not follow its merge order; its token order does (see _merges)
    try:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=_merges(tokens, vocab, scores), fuse_unk=True, unk_token=unk,
                                   byte_fallback=True))
    except Exception as e:  # the tokenizers library raises a bare Exception
        raise SpecdecError(f"GGUF tokenizer metadata is inconsistent ({e})") from None
    spaces = normalizers.Replace(" ", "\u2581")
    # a space before the text, and before the text after each token matched whole (as llama.cpp prefixes each piece)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), spaces]) if space_prefix else spaces
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if space_prefix else []))
    # llama.cpp drops the whitespace after a Phi-3 file's control tokens (by the file's name, as it decides)
    name = str(meta.get("general.name", "")).lower()
    phi3 = "phi-3" in name or "phi3" in name
    rstrip = lambda t: phi3 and t not in ("<unk>", "<s>", "<|endoftext|>")  # noqa: E731
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, rstrip=rstrip(t))
                            for t, ty in zip(original, types) if ty in (CONTROL, UNKNOWN)])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)  # "\n", "<table>", ...: matched whole
                    for t, ty in zip(original, types) if ty == USER_DEFINED and t in vocab])

    return tok, with_specials(tok, meta, tokens, vocab, bos_default=True, typed_pair=True)


def _merges(tokens: list[str], vocab: dict[str, int], scores: list[float] | None = None) -> list[tuple[str, str]]:
    """The merges a vocabulary implies: every split of a token into two tokens, best first. A merge ranks by the
    score of the token it makes (llama.cpp's SentencePiece merges the best-scored pair first: Llama 2's, Mistral's
    and Phi-3's vocabularies match it only so, 55 of 350 strings differ by token order), then by that token's
    index; without scores by the index alone (Gemma's, whose scores do not follow its merge order: transformers'
    generate_merges with the scores -index), then longer left pieces first."""
    found = []
    order = range(len(tokens)) if scores is None else sorted(range(len(tokens)), key=lambda i: (-scores[i], i))
    for token in (tokens[i] for i in order):
        for cut in range(len(token) - 1, 0, -1):  # longer left pieces first
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                found.append((left, right))
    return found
