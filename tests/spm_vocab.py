"""A SentencePiece model file (tests/data/mistral-v1-tokenizer.model) as the GGUF tokenizer fields llama.cpp's
converter writes for it (convert_hf_to_gguf.py, _set_vocab_sentencepiece): tokens, scores and types in piece order,
bos/eos/unk ids, add_space_prefix from the model's add_dummy_prefix. The file is a protobuf (sentencepiece's
ModelProto): read here with a reader of the three wire types it uses, so no sentencepiece package is needed."""

from __future__ import annotations

import struct
from pathlib import Path

from gguf import GGUFValueType

MISTRAL_V1 = Path(__file__).parent / "data" / "mistral-v1-tokenizer.model"


def _varint(b: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        c = b[i]
        i += 1
        out |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return out, i


def _fields(b: bytes) -> list[tuple[int, object]]:
    """(field number, value) of a message: varints as int, fixed32 as float, length-delimited as bytes."""
    out, i = [], 0
    while i < len(b):
        key, i = _varint(b, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(b, i)
        elif wire == 5:
            value, i = struct.unpack("<f", b[i:i + 4])[0], i + 4
        elif wire == 2:
            n, i = _varint(b, i)
            value, i = b[i:i + n], i + n
        elif wire == 1:
            value, i = b[i:i + 8], i + 8
        else:
            raise ValueError(f"protobuf wire type {wire} not read here")
        out.append((number, value))
    return out


def gguf_fields(path: Path = MISTRAL_V1) -> dict[str, tuple[object, GGUFValueType, GGUFValueType | None]]:
    """key -> (value, type, element type of an array), as synth_gguf's tokenizer fields."""
    tokens, scores, types, prefix = [], [], [], True
    for number, value in _fields(path.read_bytes()):
        if number == 1:  # a piece: 1 its text, 2 its score, 3 its type (NORMAL 1 when absent)
            piece = dict(_fields(value))
            tokens.append(piece[1].decode("utf-8"))
            scores.append(float(piece.get(2, 0.0)))
            types.append(int(piece.get(3, 1)))
        elif number == 3:  # normalizer_spec: 3 add_dummy_prefix (true when absent)
            prefix = bool(dict(_fields(value)).get(3, 1))
    ids = {t: i for i, t in enumerate(tokens)}
    s, a, u = GGUFValueType.STRING, GGUFValueType.ARRAY, GGUFValueType.UINT32
    return {
        "tokenizer.ggml.model": ("llama", s, None),
        "tokenizer.ggml.pre": ("default", s, None),
        "tokenizer.ggml.tokens": (tokens, a, s),
        "tokenizer.ggml.scores": (scores, a, GGUFValueType.FLOAT32),
        "tokenizer.ggml.token_type": (types, a, GGUFValueType.INT32),
        "tokenizer.ggml.bos_token_id": (ids["<s>"], u, None),
        "tokenizer.ggml.eos_token_id": (ids["</s>"], u, None),
        "tokenizer.ggml.unknown_token_id": (ids["<unk>"], u, None),
        "tokenizer.ggml.add_bos_token": (True, GGUFValueType.BOOL, None),
        "tokenizer.ggml.add_eos_token": (False, GGUFValueType.BOOL, None),
        "tokenizer.ggml.add_space_prefix": (prefix, GGUFValueType.BOOL, None),
    }
