"""The EAGLE-3 head end to end on a tiny target: training makes it draft the target's choices (loss falls,
drafts are accepted), greedy output with it equals plain greedy output, sampling with it is exact (chi-square
against the enumerated distribution), and the head round-trips through its files."""

from __future__ import annotations

import random

import pytest
import torch

from specdec.drafters.cascade import CascadeDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import Engine, GenerationConfig
from specdec.errors import SpecdecError
from specdec.heads.eagle import EagleHead, HeadConfig, default_taps
from specdec.sampling.warp import SamplingConfig
from specdec.train import data
from specdec.train.distill import TrainConfig, accuracy, batch_of, draft_vocabulary, init_head, items_of, train
from tests.test_engine_sampling import PASS_LEVEL, PROMPT, SAMPLES, TARGET, VOCAB, exact_distribution, goodness_of_fit

TINY = dict(vocab=64, std=0.3)  # peaky: greedy answers are varied, not one repeated token


class _Loaded:
    def __init__(self, model):
        self.model, self.tokenizer = model, None


def distilled(model, prompts):
    """The tiny target's greedy answers to prompts, with its features and choices along them."""
    results = Engine(model, None).generate(prompts, GenerationConfig(max_new_tokens=24))
    examples = [data.Example(p + r.token_ids, len(p)) for p, r in zip(prompts, results)]
    return examples, data.hidden_states(model, examples, default_taps(model.cfg.num_layers))


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """A head trained for a few seconds on the tiny target's answers to 48 prompts, with its accuracy on them before
    and after. (A random target is a random function: 48 answers teach a head to draft those answers, not to
    generalize; the mechanics are what is tested here.)"""
    torch.manual_seed(0)
    model = tiny_model("fp16", **TINY)
    rng = random.Random(0)
    prompts = [[rng.randrange(model.cfg.vocab_size) for _ in range(rng.randrange(4, 12))] for _ in range(48)]
    examples, feats = distilled(model, prompts)
    cfg = HeadConfig.for_target(model.cfg, 48, default_taps(model.cfg.num_layers))
    head = init_head(cfg, model, draft_vocabulary(examples, feats, 48, model.cfg.vocab_size))
    seen = items_of(examples, feats, soft=False)
    before = accuracy(head, seen, model.embed, 3)
    out = tmp_path_factory.mktemp("head")
    summary = train(head, model, examples, feats, TrainConfig(epochs=30, lr=3e-3, warmup=5, save_every=200,
                                                               validation=0.0, labels="hard"), out, log=lambda m: None)
    return model, head.eval(), before, accuracy(head, seen, model.embed, 3), summary, prompts


def test_training_makes_the_head_draft_the_targets_choices(trained):
    _, _, before, after, summary, _ = trained
    print(f"accuracy per drafting step before {before}, after {after}")
    assert all(a > b + 0.25 for a, b in zip(after, before))  # every unrolled step learned, the later ones too
    assert summary["curve"] and summary["train_tokens"] > 0 and summary["validation_tokens_per_pass"] >= 1.0


def test_soft_labels_are_the_targets_distribution_over_the_draft_vocabulary(trained):
    """What soft-label training learns at each unrolled step: the target's next-token distribution after that
    position (its SOFT_TOP likeliest tokens), outside the draft vocabulary dropped, renormalized; computed here
    again from the target's logits."""
    model, head, *_, prompts = trained
    examples, feats = distilled(model, prompts[:4])
    e, f, y, soft = items_of(examples, feats, soft=True)[1]
    _, _, tgt, (ids, prob) = batch_of(e, f, y, soft, model.embed, head, 3)
    cache = model.new_cache(1, len(e.tokens))
    logits = model.forward_tapped(torch.tensor([e.tokens]), torch.tensor([0]), cache.row(0), head.cfg.taps,
                                  prefill=True).logits
    draft = {int(t): d for d, t in enumerate(head.target_ids())}
    for j in range(3):
        for p in range(e.prompt_len - 1, len(e.tokens) - j):
            full = logits[0, p + j].float().softmax(-1)
            kept = [int(t) for t in full.topk(data.SOFT_TOP).indices if int(t) in draft]
            want = {draft[t]: float(full[t]) / sum(float(full[u]) for u in kept) for t in kept}
            got = {int(i): float(q) for i, q in zip(ids[j, p], prob[j, p]) if q > 0}
            assert got.keys() == want.keys() and all(abs(got[k] - want[k]) < 2e-3 for k in want)
    answer = slice(e.prompt_len - 1, None)  # hard labels: the target's choice where the draft vocabulary has it
    assert torch.equal(tgt[0, answer] >= 0, head.t2d[y[answer]]) and (tgt[0, :e.prompt_len - 1] == -100).all()


@pytest.mark.slow  # a second training run
def test_soft_labels_train_too_and_need_data_that_holds_them(trained, tmp_path):
    """The fixture's head learned hard labels (a random target's argmax is what its drafts must hit); soft labels
    teach the head the target's choices as well, from a fresh start. Data or a checkpoint that cannot serve the
    labels asked for is refused before any training."""
    model, _, *_, prompts = trained
    examples, feats = distilled(model, prompts)
    cfg = HeadConfig.for_target(model.cfg, 48, default_taps(model.cfg.num_layers))
    head = init_head(cfg, model, draft_vocabulary(examples, feats, 48, model.cfg.vocab_size))
    seen = items_of(examples, feats, soft=False)
    before = accuracy(head, seen, model.embed, 3)
    train(head, model, examples, feats, TrainConfig(epochs=30, lr=3e-3, warmup=5, validation=0.0, labels="soft"),
          tmp_path / "soft", log=lambda m: None)
    after = accuracy(head, seen, model.embed, 3)
    assert after[0] > before[0] + 0.25, (before, after)
    old = data.Features(feats.feats, feats.labels)  # data written before soft labels existed
    with pytest.raises(SpecdecError, match="holds no soft labels"):
        train(head, model, examples, old, TrainConfig(labels="soft"), tmp_path / "old", log=lambda m: None)
    with pytest.raises(SpecdecError, match="resume it with --labels soft"):  # the soft run's checkpoint, as hard
        train(head, model, examples, feats, TrainConfig(labels="hard"), tmp_path / "soft", log=lambda m: None)
    data.save(tmp_path / "d", examples, feats, {})
    assert torch.equal(data.load(tmp_path / "d")[1].soft[3][1], feats.soft[3][1])


@pytest.mark.parametrize("native", [False, True], ids=["torch", "native"])
def test_greedy_output_with_the_head_equals_plain_output(trained, native):
    """On prompts it was trained on, so its drafts are often right: a head fed misaligned features (one position
    off) would draft nothing the target accepts. `native`: the head's layer on the native kernels."""
    model, head, *_, prompts = trained
    prompts = prompts[:3] + [[7, 8, 9]]
    cfg = GenerationConfig(max_new_tokens=30)
    plain = Engine(model, None).generate(prompts, cfg)
    drafter = EagleDrafter(head, model.embed, kernels=model.kernels if native else None)
    assert type(drafter.layer).__name__ == ("KernelHead" if native else "TorchHead")
    spec = Engine(model, None).generate(prompts, cfg, drafter, k=3)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    drafted, accepted = sum(r.stats.drafted for r in spec), sum(r.stats.accepted for r in spec)
    print(f"eagle ({type(drafter.layer).__name__}) on the tiny target: {accepted} of {drafted} drafts accepted")
    assert accepted > 0.3 * drafted


@pytest.mark.parametrize("cascade", [False, True], ids=["eagle", "ngram,eagle"])
def test_auto_keeps_the_part_of_each_draft_that_pays(trained, cascade):
    """With the auto policy the head drafts as far as it is sure, and the planner verifies the prefix that pays
    at the pass costs given; the output stays plain greedy output and verification calibrates the confidences."""
    from specdec.engine.policy import Auto, PassCost

    model, head, *_, prompts = trained
    prompts = prompts[:3] + [[7, 8, 9]]
    cfg = GenerationConfig(max_new_tokens=30)
    plain = Engine(model, None).generate(prompts, cfg)
    drafter = EagleDrafter(head, model.embed, min_confidence=0.05, kernels=model.kernels)
    if cascade:
        drafter = CascadeDrafter([NgramDrafter(4, 1), drafter])
    auto = Auto(PassCost(((1, 1.0), (2, 1.15), (3, 1.32), (4, 1.58))), max_k=6)
    spec = Engine(model, None).generate(prompts, cfg, drafter, auto)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    lengths = {len(r.drafted) for res in spec for r in res.stats.rounds}
    print(f"{drafter.name} with auto: draft lengths {sorted(lengths)}, calibration {auto.calibration:.2f} over "
          f"{auto.conf_sum:.1f} confidence")
    assert len(lengths) >= 3 and auto.conf_sum > 1.0  # lengths vary; verified confidences were learnt from


def test_sampled_rows_are_planned_before_the_head_drafts(trained):
    """At temperature > 0 the head gives no confidences, so nothing could trim its drafts: the planner decides
    first. Where a row costs a whole pass, it plans k = 0 and the head is never asked to draft."""
    from specdec.engine.policy import Auto, PassCost

    model, head, *_, prompts = trained
    drafter = EagleDrafter(head, model.embed, min_confidence=0.05, kernels=model.kernels)
    asked = []
    propose = drafter.propose
    drafter.propose = lambda slots, ctx, ks: asked.append(list(ks)) or propose(slots, ctx, ks)
    auto = Auto(PassCost(((1, 1.0), (2, 2.0))), max_k=4)
    cfg = GenerationConfig(max_new_tokens=12, sampling=SamplingConfig(temperature=1.0, seed=3))
    res = Engine(model, None).generate(prompts[:2], cfg, drafter, auto)
    assert all(len(r.drafted) == 0 for x in res for r in x.stats.rounds)
    assert asked == [], asked


def test_the_head_cost_times_every_drafting_step(trained):
    """time_head divides by the tokens actually drafted: a head that stops early (min_confidence) must not look
    cheaper per token than it is."""
    from specdec.bench.hardware.profile import time_head

    model, *_ = trained
    torch.manual_seed(0)  # an untrained head, never that sure of a draft: it would stop before its first token
    cfg = HeadConfig.for_target(model.cfg, 48, default_taps(model.cfg.num_layers))
    drafter = EagleDrafter(init_head(cfg, model, torch.arange(48)), model.embed, 0.999999, kernels=model.kernels)
    steps = []
    feed = drafter.layer.feed
    drafter.layer.feed = lambda *a: steps.append(a[1].shape[0]) or feed(*a)
    time_head(drafter, list(range(1, 30)), 4, 5)
    assert drafter.min_confidence == 0.999999  # put back
    # the context fed once untimed, then 5 timed drafts of 4 steps each (a catch-up row, then 3 drafted rows)
    assert steps == [29] + [1] * 20, steps


def test_the_native_layer_computes_the_torch_layer(trained):
    """The native step (Q8_0 weights, 15-bit activation blocks, fp16 keys and values) against the torch head over
    a whole context and then drafting steps: the same outputs to within the weights' 8-bit rounding and the
    same top draft nearly everywhere (they may part only at near-ties)."""
    from specdec.drafters.eagle import TorchHead
    from specdec.heads.quantized import KernelHead

    model, head, *_, prompts = trained
    native, ref = KernelHead(head, model.kernels), TorchHead(head)
    torch.manual_seed(5)
    n = 40
    emb, g = model.embed[torch.randint(0, model.cfg.vocab_size, (n + 4,))], torch.randn(n + 4, head.cfg.hidden)
    feats = torch.randn(7, len(head.cfg.taps) * head.cfg.hidden)
    with torch.no_grad():
        assert torch.allclose(native.fc(feats), ref.fc(feats), atol=1e-2, rtol=1e-2)
    agree = rel = 0.0
    for layer in (native, ref):
        layer.reserve(2, 64)
    outs = {}
    def feed(layer, slot, e, x, start):  # rows start.. of one slot -> (out, the last row's logits)
        m = e.shape[0]
        out, logits = layer.feed(torch.full((m,), slot), e, x, torch.arange(start, start + m), torch.tensor([m - 1]))
        return out, logits[0]

    with torch.no_grad():  # the head is trainable: its torch layer would otherwise record gradients
        for name, layer in (("native", native), ("torch", ref)):
            steps = [feed(layer, 1, emb[:n], g[:n], 0)]  # a context, then single rows after it (slot 1, not 0)
            steps += [feed(layer, 1, emb[n + j:n + j + 1], steps[-1][0][-1:], n + j) for j in range(4)]
            outs[name] = steps
    for (o1, l1), (o2, l2) in zip(outs["native"], outs["torch"]):
        rel = max(rel, float((o1 - o2).norm() / o2.norm()))
        agree += float(l1.argmax() == l2.argmax())
    print(f"native against torch: relative error {rel:.2e}, top draft agrees at {agree:.0f} of 5 steps")
    assert rel < 5e-2 and agree >= 4


def test_rows_of_several_slots_in_one_feed_are_each_slot_fed_alone(trained):
    """The drafter feeds every row's catch-up, then each drafting step of every row, in one call: rows of three
    slots at different positions (slot 2's interleaved with slot 0's) give what each slot fed alone gives, to the
    bit on the native layer (each row computed alone, in a fixed order) and to float rounding in torch."""
    from specdec.drafters.eagle import TorchHead
    from specdec.heads.quantized import KernelHead

    model, head, *_ = trained
    torch.manual_seed(6)
    emb, g = model.embed[torch.randint(0, model.cfg.vocab_size, (12,))], torch.randn(12, head.cfg.hidden)
    slots = torch.tensor([0, 2, 0, 2, 0, 1, 1, 1, 1, 1, 1, 2])
    pos = torch.tensor([0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 2])  # slot 1 starts at 3: its earlier keys are zeros
    last = torch.tensor([4, 10, 11])
    for layer, exact in ((KernelHead(head, model.kernels), True), (TorchHead(head), False)):
        with torch.no_grad():
            layer.reserve(3, 16)
            out, logits = layer.feed(slots, emb, g, pos, last)
            alone = {}
            layer.reserve(3, 16)
            for s in (0, 1, 2):
                r = (slots == s).nonzero().flatten()
                alone[s] = layer.feed(slots[r], emb[r], g[r], pos[r], torch.tensor([len(r) - 1]))
        for s in (0, 1, 2):  # logits row s: slot s's last row
            r = (slots == s).nonzero().flatten()
            if exact:
                assert torch.equal(out[r], alone[s][0]) and torch.equal(logits[s], alone[s][1][0]), s
            else:
                assert torch.allclose(out[r], alone[s][0], atol=1e-5) and torch.allclose(logits[s], alone[s][1][0],
                                                                                         atol=1e-5), s


@pytest.mark.slow  # 10^5 rounds each
@pytest.mark.parametrize("cascade,native", [(False, False), (True, False), (False, True)],
                         ids=["eagle", "ngram,eagle", "eagle-native"])
def test_sampling_with_the_head_is_exact(tiny_model, cascade, native):
    """An untrained head over a truncated vocabulary (8 of 10 tokens): q far from p, so a wrong residual shows.
    In the cascade, rows prompt lookup drafts (q one-hot) and rows the head drafts share rounds."""
    torch.manual_seed(3)
    model = tiny_model("fp16", **TARGET)
    cfg = HeadConfig.for_target(model.cfg, 8, default_taps(model.cfg.num_layers))
    head = init_head(cfg, model, torch.tensor([0, 1, 2, 3, 5, 6, 7, 9])).eval()
    drafter = EagleDrafter(head, model.embed, kernels=model.kernels if native else None)
    if cascade:
        drafter = CascadeDrafter([NgramDrafter(2, 1), drafter], min_tokens=1)
    sampling = SamplingConfig(temperature=1.0, seed=21)
    results = Engine(model, None).generate([PROMPT] * SAMPLES, GenerationConfig(6, sampling), drafter, 3)
    tokens = torch.tensor([r.token_ids[:3] for r in results]).numpy()
    alpha = sum(r.stats.accepted for r in results) / sum(r.stats.drafted for r in results)
    pv = goodness_of_fit(tokens, exact_distribution(model, sampling, 3))
    print(f"{drafter.name} sampling, k = 3: alpha {alpha:.2f}, chi-square p = {pv:.3g}")
    if cascade:
        assert 0 < drafter.counts["ngram"] and 0 < drafter.counts["eagle"], drafter.counts
    assert 0.05 < alpha < 0.9, alpha
    assert pv > PASS_LEVEL, f"samples with the head fail the chi-square test: p = {pv:.2e}"
    assert VOCAB == 10


def test_the_head_round_trips_through_its_files(trained, tmp_path):
    model, head, *_ = trained
    head.save(tmp_path / "h", dtype=torch.float32)
    back = EagleHead.load(tmp_path / "h")
    for k, v in head.tensors().items():
        assert torch.equal(back.tensors()[k], v), k
    (tmp_path / "h" / "head.json").write_text("{}")
    with pytest.raises(SpecdecError, match="not a draft head"):
        EagleHead.load(tmp_path / "h")


def test_a_head_for_another_target_is_refused(trained):
    model, head, *_ = trained
    with pytest.raises(SpecdecError, match="trained for a target"):
        EagleDrafter(head, torch.zeros(model.cfg.vocab_size + 1, model.cfg.hidden_size))


@pytest.mark.parametrize("args, fragment", [
    (["--draft-vocab", "0"], "must be >= 1"),
    (["--epochs", "-1"], "must be positive"),
    (["--prompts", "/nonexistent.jsonl"], "no prompts file"),
    (["--prompts", __file__, __file__, "--max-tokens", "1", "2", "3"], "one value or one per prompts file"),
    (["--device", "tpu"], "unknown device"),
    (["--prompts", __file__, "--init", "/nonexistent"], "no draft head there"),
    (["--prompts", __file__, "--init", "default", "--target", "/some/other/model"], "give --init DIR"),
], ids=["vocab", "epochs", "prompts", "max-tokens", "device", "init", "init-default"])
def test_train_draft_refuses_bad_input_before_any_work(tmp_path, capsys, args, fragment):
    from specdec.cli import main

    assert main(["train-draft", "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and not (tmp_path / "o").exists()


class _Tokenizer:
    def __init__(self, fingerprint):
        self._fp = fingerprint

    def fingerprint(self):
        return self._fp


def test_training_continues_from_a_saved_head(trained, tmp_path):
    """`train-draft --init DIR`: the second run starts from the saved head (its weights, its draft vocabulary),
    so its curve starts where the first run ended, not where a fresh head would; a head that cannot be continued
    on this target is refused before any work."""
    from specdec.train.cli import init_dir, start_from

    model, head, *_, prompts = trained
    head.save(tmp_path / "h", dtype=torch.float32, meta={"tokenizer_fingerprint": "abc",
                                                          "trained": {"train_tokens": 123}})
    target = _Loaded(model)
    target.tokenizer = _Tokenizer("abc")
    taps = default_taps(model.cfg.num_layers)
    again, meta = start_from(tmp_path / "h", target, taps)
    assert torch.equal(again.target_ids(), head.target_ids()) and meta["train_tokens"] == 123
    examples, feats = distilled(model, prompts)
    summary = train(again, model, examples, feats, TrainConfig(epochs=1, lr=1e-4, warmup=5, validation=0.0),
                    tmp_path / "run", log=lambda m: None)
    start = summary["curve"][0]
    assert start["tokens"] == 0 and start["accuracy"][0] > 0.5  # a fresh head starts near 0 on these answers
    with pytest.raises(SpecdecError, match="would need a fresh head"):
        init_dir(str(tmp_path / "h"), "x", 17)
    with pytest.raises(SpecdecError, match="do not fit this target"):
        start_from(tmp_path / "h", target, taps[:-1])
    target.tokenizer = _Tokenizer("other")
    with pytest.raises(SpecdecError, match="another vocabulary"):
        start_from(tmp_path / "h", target, taps)
