"""Draft-model pairs of GGUF files, both on the native kernels (`--draft-model FILE.gguf` beside a GGUF target):
tiny random-weight files from `synth-gguf` that share one vocabulary. Greedy output equals plain greedy output in
`generate`, in a static batch and in the step loop as `serve` runs it (requests joining while others decode);
sampled output follows the target's own distribution (chi-square against the enumerated exact distribution), and
the target drafting for itself is always accepted. The tokenizer check names the first differing id, and the
draft's cost c is measured and said at load.

The drafts: a STRANGER (the target's shape, another seed: its argmax almost never agrees, so the recovered tokens
carry the output), a RELATIVE (the target's own file copied, so it converts and loads as a file of its own, on
gguf-q8 against the target's gguf-q16: it agrees nearly always, and rejections still occur), and the target
itself."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.cli import main
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter, draft_cost
from specdec.engine.generate import Engine, GenerationConfig
from specdec.engine.policy import Auto, FixedK, PassCost
from specdec.engine.scheduler import Scheduler, SchedulerConfig
from specdec.engine.sequence import Sequence
from specdec.errors import SpecdecError
from specdec.models.gguf.synth import SHAPES, write
from specdec.models.loader import load_model
from specdec.sampling.warp import SamplingConfig
from tests.sampler_harness import chi_square_pvalue, pooled_chi_square
from tests.warp_oracle import reference_warp_rows

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [200, 300, 400, 500], [7] * 20, list(range(1000, 1030)), [42]]
N = 24
PASS_LEVEL = 1e-3  # fixed seeds: the runs are deterministic


@pytest.fixture(scope="module")
def files(tmp_path_factory, kernels):  # noqa: F811
    """name -> a tiny-llama GGUF: the target, a stranger (seed 1) and a relative (the target's bytes, another file).
    The module runs with SPECDEC_CACHE in its own folder, so that their conversions leave nothing behind (the kernels
    were loaded before, from the usual cache)."""
    folder = tmp_path_factory.mktemp("pair")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(folder / "cache"))
        out = {"target": write(folder / "target.gguf", "tiny-llama", "Q4_K_M").path,
               "stranger": write(folder / "stranger.gguf", "tiny-llama", "Q4_K_M", seed=1).path}
        out["relative"] = shutil.copy(out["target"], folder / "relative.gguf")
        yield out


@pytest.fixture(scope="module")
def models(files):
    """name -> LoadedModel: the target on gguf-q16, the stranger on gguf-q16, the relative on gguf-q8."""
    return {"target": load_model(str(files["target"]), "gguf-q16"),
            "stranger": load_model(str(files["stranger"]), "gguf-q16"),
            "relative": load_model(str(files["relative"]), "gguf-q8")}


def drafter(models, name: str) -> DraftModelDrafter:
    return DraftModelDrafter(models[name].model, models["target"].model.cfg.vocab_size)


def plain_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding written out: a prefill, then one token a pass. No engine involved."""
    cache = model.new_cache(1, len(prompt) + n + 1)
    logits = model.forward(torch.tensor([prompt]), torch.tensor([0]), cache, last_only=torch.tensor([len(prompt) - 1]),
                           prefill=True)  # [1, vocab]
    out = [int(logits[0].argmax())]
    for i in range(n - 1):
        logits = model.forward(torch.tensor([[out[-1]]]), torch.tensor([len(prompt) + i]), cache)[:, 0]
        out.append(int(logits[0].argmax()))
    return out


@pytest.fixture(scope="module")
def plain(models):
    return [plain_greedy(models["target"].model, p, N) for p in PROMPTS]


# ---- greedy -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["stranger", "relative", "target"])
def test_greedy_batch_equals_plain(models, plain, name):
    """All prompts in one static batch, k = 4: each row is its prompt's plain greedy output."""
    results = Engine(models["target"].model, None).generate(PROMPTS, GenerationConfig(N), drafter(models, name), 4)
    assert [r.token_ids for r in results] == plain
    drafted, accepted = sum(r.stats.drafted for r in results), sum(r.stats.accepted for r in results)
    recovered = sum(x.kind == "recovered" for r in results for x in r.stats.rounds)
    if name == "target":  # the same file on the same path: one-token passes and verify passes agree bit for bit
        assert accepted == drafted > 0
    elif name == "relative":  # nearly always right, and the rejections are exercised too
        assert 0.5 * drafted < accepted < drafted, (accepted, drafted)
    else:  # the recovered tokens carry the output
        assert accepted < 0.1 * drafted and recovered > 0, (accepted, drafted, recovered)


@pytest.mark.parametrize("policy", ["fixed", "auto"])
def test_requests_joining_mid_run_equal_plain(models, plain, policy):
    """The step loop as `serve` runs it: 2 slots for 5 requests (3 wait in the queue), one more admitted every step
    while others decode, ragged rows of their own k; each output is its prompt's plain greedy output."""
    target = models["target"].model
    chosen = FixedK(3) if policy == "fixed" else Auto(PassCost(((1, 1.0), (8, 1.3))), max_k=4)
    sched = Scheduler(target, None, drafter(models, "relative"), chosen, SchedulerConfig(max_batch=2))
    seqs = [Sequence(p, GenerationConfig(N)) for p in PROMPTS]
    waiting = list(seqs)
    while waiting or not sched.idle:
        if waiting:
            sched.admit(waiting.pop(0))
        sched.step()
    assert [s.output for s in seqs] == plain
    assert sum(s.stats.accepted for s in seqs) > 0


def test_generate_command_with_a_gguf_draft(files, plain, capsys):
    """`specdec generate --drafter draft-model --draft-model FILE.gguf`: the draft's own cost said in one line, and
    the output the target's plain greedy one."""
    args = ["generate", "--model", str(files["target"]), "--precision", "gguf-q16", "--drafter", "draft-model",
            "--draft-model", str(files["relative"]), "--draft-precision", "gguf-q8", "--prompt", "Hello there",
            "--no-chat", "--max-new-tokens", str(N), "--k", "3", "--json"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    ids = load_model(str(files["target"]), "gguf-q16").tokenizer.encode("Hello there")
    assert got["token_ids"] == plain_greedy(load_model(str(files["target"]), "gguf-q16").model, ids, N)
    assert got["accepted"] > 0
    line = [x for x in err.splitlines() if "draft model" in x]
    assert len(line) == 1 and re.search(r"draft model relative\.gguf \(gguf-q8\): c = \d+\.\d{3} \(", line[0]), err


# ---- sampling -----------------------------------------------------------------------------------------------------

SAMPLES = 1000  # each step draws vocabulary-wide noise per sampled row: about 10 ms a request
SAMPLING = SamplingConfig(1.0, top_k=3)  # three tokens a step: the first two tokens' distribution has 9 cells


def exact_pairs(model, prompt: list[int], sampling: SamplingConfig) -> dict[tuple[int, int], float]:
    """P(first two generated tokens), enumerated: the first from the prompt's prefill, the second from a pass over
    the prompt and each possible first token (on the native kernels a prefill, a verify pass and one-token passes
    give the same bits: test_gguf_kernels)."""
    def warped(ids):
        cache = model.new_cache(1, len(ids) + 1)
        logits = model.forward(torch.tensor([ids]), torch.tensor([0]), cache, last_only=torch.tensor([len(ids) - 1]),
                               prefill=True)
        return reference_warp_rows(logits, sampling)[0]  # [vocab] float64

    first = warped(prompt)
    out = {}
    for a in first.nonzero().flatten().tolist():
        second = warped(prompt + [a])
        for b in second.nonzero().flatten().tolist():
            out[(a, b)] = float(first[a] * second[b])
    return out


@pytest.mark.parametrize("name", ["relative", pytest.param("stranger", marks=pytest.mark.slow)])
def test_sampled_pairs_follow_the_targets_distribution(models, name):
    """SAMPLES requests of one prompt, each with its own seed, through the step loop in waves of 64 slots; every
    second token is speculative (k = 2). The first two tokens must follow the target's exact distribution."""
    prompt = PROMPTS[1]
    target = models["target"].model
    exact = exact_pairs(target, prompt, SAMPLING)
    sched = Scheduler(target, None, drafter(models, name), FixedK(2), SchedulerConfig(max_batch=64, max_queue=None))
    # a budget of 4: after the first token, room for a round of 2 drafts and its bonus
    seqs = [Sequence(prompt, GenerationConfig(4, replace(SAMPLING, seed=i))) for i in range(SAMPLES)]
    for s in seqs:
        sched.admit(s)
    while not sched.idle:
        sched.step()
    assert all(len(s.stats.rounds[0].drafted) == 2 for s in seqs)  # the second token was verified, not sampled plain
    cells = list(exact)
    index = {c: i for i, c in enumerate(cells)}
    observed = np.zeros(len(cells) + 1)  # the last cell: a pair the target cannot produce
    for s in seqs:
        observed[index.get(tuple(s.output[:2]), len(cells))] += 1
    probs = np.array([exact[c] for c in cells] + [0.0])
    pv = chi_square_pvalue(*pooled_chi_square(observed, probs / probs.sum()))
    drafted = sum(s.stats.drafted for s in seqs)
    alpha = sum(s.stats.accepted for s in seqs) / drafted
    print(f"{name}: a = {alpha:.2f} over {drafted} drafts, chi-square p = {pv:.3g}")
    assert pv > PASS_LEVEL, f"{name}: speculative samples fail the chi-square test: p = {pv:.2e}"
    assert (alpha > 0.5) if name == "relative" else (alpha < 0.5)


def test_the_target_drafting_for_itself_at_temperature_1(models):
    """q from the draft's one-token passes, p from the target's verify pass, the same file on the same path: they
    agree bit for bit, so at temperature 1 (seeded) every draft is accepted, in every row of a batch."""
    results = Engine(models["target"].model, None).generate(
        PROMPTS, GenerationConfig(N, SamplingConfig(1.0, seed=5)), drafter(models, "target"), 4)
    drafted, accepted = sum(r.stats.drafted for r in results), sum(r.stats.accepted for r in results)
    assert accepted == drafted > 0
    assert len({tuple(r.token_ids) for r in results}) == len(PROMPTS)


# ---- at load: the tokenizers, the cost ------------------------------------------------------------------------------

def test_a_draft_whose_vocabulary_differs_is_refused_naming_the_first_difference(tmp_path, files, models, capsys):
    """Tiny Phi-3's vocabulary is the bundled one with 64 more tokens: the target's is its beginning (the sizes are
    named); a llama shape padded to the same size has fillers where Phi-3 has named tokens (the first such id and
    both strings are named). Each is one line from the command, before any generation."""
    phi3 = write(tmp_path / "phi3.gguf", "tiny-phi3", "Q8_0").path
    padded = write(tmp_path / "padded.gguf", replace(SHAPES["tiny-llama"], vocab=SHAPES["tiny-phi3"].vocab),
                   "Q8_0").path
    vocab = SHAPES["tiny-llama"].vocab
    with pytest.raises(SpecdecError, match=f"the target has {vocab} tokens, the draft {vocab + 64}, the first "
                                           f"{vocab} alike"):
        DraftModelDrafter.check_compatible(models["target"].tokenizer, load_model(str(phi3)).tokenizer)
    args = ["generate", "--model", str(padded), "--drafter", "draft-model", "--draft-model", str(phi3), "--prompt",
            "hi", "--max-new-tokens", "2"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"specdec: error: the draft's tokenizer differs from the target's at id {vocab}: "
                       f"'[PAD{vocab}]' (target) vs '<|end|>' (draft); a draft model must share the target's "
                       "vocabulary"), err


def test_draft_cost_is_the_ratio_of_the_two_passes(models):
    """c = the draft's one-token pass over the target's: about 1 for the target against itself (a shared machine
    may tilt it), and both medians are real pass times."""
    cost = draft_cost(models["target"].model, models["target"].model, context=16, reps=3)
    assert cost.pairs == 3 and cost.context == 16
    assert cost.draft_s > 0 and cost.target_s > 0 and cost.c == pytest.approx(cost.draft_s / cost.target_s)
    assert "c = " in cost.line() and "after 16 tokens" in cost.line()


def test_draft_cost_fits_a_short_context(tiny_model):
    """A draft of 32 positions: the measuring context shrinks to fit it, instead of failing at load."""
    cost = draft_cost(tiny_model("fp16", vocab=32, max_pos=256), tiny_model("fp16", vocab=32, max_pos=32), reps=1)
    assert cost.context == 30


def test_plain_loop_matches_the_engine_without_drafts(models, plain):
    """The reference itself: the engine with no drafter gives the written-out loop's tokens."""
    results = Engine(models["target"].model, None).generate(PROMPTS, GenerationConfig(N), NoDrafter(), 1)
    assert [r.token_ids for r in results] == plain


# ---- serve ----------------------------------------------------------------------------------------------------------

@pytest.mark.slow  # two servers in subprocesses
def test_serve_with_a_gguf_draft_under_concurrent_requests(files, kernels, tmp_path, monkeypatch):  # noqa: F811
    """`specdec serve --drafter draft-model --draft-model FILE.gguf`, 3 slots, 8 clients at once: every greedy answer
    equals the plain server's, drafts are accepted, and a seeded sampled answer is the same sent alone or among
    others. The server says the draft's c at start."""
    pytest.importorskip("openai")
    import concurrent.futures

    from tests.serving import Server

    built = Path(kernels.__file__).parent  # this version's kernels, already built (kernels_dir)
    cache = tmp_path / "cache"  # conversions of its own, and a copy of the kernels (under 2 MB)
    shutil.copytree(built, cache / "kernels" / built.name)
    monkeypatch.setenv("SPECDEC_CACHE", str(cache))
    prompts = ["Hello there", "The capital of France is", "1 2 3 4 5 6", "def main():", "Once upon a time"]
    common = ["--precision", "gguf-q16", "--max-batch", "3", "--k", "3"]

    def ask(server, prompt: str, **kw) -> str:
        c = server.client(None)
        return c.completions.create(model=c.models.list().data[0].id, prompt=prompt, max_tokens=16, **kw)

    plain = Server(files["target"], *common, "--drafter", "none")
    try:
        expected = {p: ask(plain, p, temperature=0).choices[0].text for p in prompts}
    finally:
        assert plain.stop() == 0, plain.output()
    s = Server(files["target"], *common, "--drafter", "draft-model", "--draft-model", str(files["relative"]),
               "--draft-precision", "gguf-q8", "--policy", "always")
    try:
        assert re.search(r"draft model relative\.gguf \(gguf-q8\): c = \d", s.output()), s.output()
        seeded = {p: ask(s, p, temperature=1.0, seed=7).choices[0].text for p in prompts[:2]}
        jobs = [(p, 0.0) for p in prompts] * 2 + [(p, 1.0) for p in prompts[:2]] * 2
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda job: (job, ask(s, job[0], temperature=job[1], seed=7)), jobs, timeout=600))
        for (p, temperature), r in got:
            assert r.choices[0].text == (expected[p] if temperature == 0 else seeded[p]), (p, temperature)
        assert sum(r.usage.model_extra["speculative"]["accepted_tokens"] for _, r in got) > 0
    finally:
        assert s.stop() == 0, s.output()


# ---- the pair's benchmark -------------------------------------------------------------------------------------------

@pytest.mark.slow  # 2 GiB of bandwidth measurement, twice
def test_the_pair_benchmark_writes_its_results_and_page(files, tmp_path):
    """specdec.bench.engines.draft_pair on the tiny pair: the JSON reads back as its dataclass, the page states the
    goals, and --render writes the same page from the JSON."""
    from specdec.bench.engines import draft_pair
    from specdec.bench.engines.model_runs import DraftPairRun

    out, page = tmp_path / "pair.json", tmp_path / "pair.md"
    args = ["--target", str(files["target"]), "--draft", str(files["stranger"]), "--precision", "gguf-q8",
            "--draft-precision", "gguf-q8", "--context", "32", "--rows", "3", "--reps", "1", "--pairs", "3",
            "--repeats", "2", "--new-tokens", "6", "--k", "2", "--json", str(out), "--page", str(page)]
    assert draft_pair.main(args) == 0
    run = DraftPairRun.load(out)
    assert run.identical and run.plain.tokens == 6 and run.fixed.drafted > 0
    assert len(run.c_runs) == 2 and len(run.verify) == 2 and set(run.cost) == {"1", "2", "3"}
    assert set(run.projections) == {"0.6", "0.7", "0.8"} and run.vocabulary == SHAPES["tiny-llama"].vocab
    text = page.read_text()
    assert "| c at most 0.2 | c = " in text and "| greedy output identical to plain | yes" in text
    assert "python -m specdec.bench.engines.draft_pair --target" in text
    again = tmp_path / "again.md"
    assert draft_pair.main(["--json", str(out), "--page", str(again), "--render"]) == 0
    assert again.read_text() == text
    assert draft_pair.main(["--json", str(out), "--page", str(again), "--render", "--note", "Why this pair."]) == 0
    assert "\nWhy this pair.\n" in again.read_text() and DraftPairRun.load(out).config["note"] == "Why this pair."
