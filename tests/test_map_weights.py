"""--map-weights (models/gguf/plane_cache.py): a GGUF's packed planes written once to the cache and mapped. A
mapped model computes what the in-memory one computes, bit for bit, on a first load (pack, write, map) and a later
one (map only: nothing is packed); its planes are views of the file; a changed GGUF, a torn or foreign file are
rebuilt, never read; an unwritable cache leaves the planes in memory with one line; a model that has no planes is
refused in one line."""

from __future__ import annotations

import json
import os

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.models.gguf import plane_cache, weights
from specdec.models.gguf.synth import write
from specdec.models.loader import load_model

SHAPES = ["tiny-llama3", "tiny-qwen3moe", "tiny-gemma3"]  # K-quant mixes, a mixture's experts, Gemma 3's linears


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mapped")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(folder / "cache"))
        yield {s: write(folder / f"{s}.gguf", s, "Q4_K_M").path for s in SHAPES}


def logits(m, ids: list[int]) -> torch.Tensor:
    cache = m.new_cache(1, 64)
    return m.forward(torch.tensor([ids]), torch.zeros(1, dtype=torch.long), cache)  # [1, n, vocab]


def rewrite_header(path, change) -> None:
    """Edit a planes file's header in place (its length kept: the header is padded with spaces)."""
    raw = path.read_bytes()
    start = len(plane_cache.MAGIC) + 8
    n = int.from_bytes(raw[len(plane_cache.MAGIC):start], "little")
    header = json.loads(raw[start:start + n])
    change(header)
    new = json.dumps(header).encode()
    path.write_bytes(raw[:start] + new + b" " * (n - len(new)) + raw[start + n:])


@pytest.mark.parametrize("shape", SHAPES)
def test_mapped_planes_compute_what_memory_computes(files, kernels, shape, capsys, monkeypatch):  # noqa: F811
    ids = [1, 5, 9, 200, 33, 7]
    want = logits(load_model(str(files[shape]), "gguf-q16").model, ids)
    path = plane_cache.cache_path(files[shape], "gguf-q16")
    path.unlink(missing_ok=True)
    first = load_model(str(files[shape]), "gguf-q16", map_weights=True).model
    assert "packed" in capsys.readouterr().err and path.is_file()
    assert torch.equal(logits(first, ids), want)
    del first
    with monkeypatch.context() as mp:
        mp.setattr(weights, "kq_planes", lambda *a, **k: pytest.fail("packed on a later mapped load"))
        mp.setattr(weights, "planes", lambda *a, **k: pytest.fail("packed on a later mapped load"))
        later = load_model(str(files[shape]), "gguf-q16", map_weights=True).model
    assert capsys.readouterr().err == ""
    assert torch.equal(logits(later, ids), want)


def test_planes_are_views_of_the_file(files, kernels):  # noqa: F811
    load_model(str(files["tiny-llama3"]), "gguf-q16", map_weights=True)
    cache = plane_cache.PlaneCache.open(files["tiny-llama3"], "gguf-q16", kernels)
    assert cache.hit
    lo, hi = cache.base.data_ptr(), cache.base.data_ptr() + cache.base.numel()
    tensors = [a for a in cache.recall(cache.records[0]["sig"]) if isinstance(a, torch.Tensor)]
    assert tensors and all(lo <= t.data_ptr() and t.data_ptr() + t.nbytes <= hi for t in tensors)


def test_a_changed_gguf_or_torn_file_is_rebuilt(files, kernels, tmp_path, capsys):  # noqa: F811
    src = files["tiny-llama3"]
    gguf = tmp_path / "copy.gguf"
    gguf.write_bytes(src.read_bytes())
    ids = [3, 4, 5, 6]
    want = logits(load_model(str(gguf), "gguf-q16").model, ids)
    load_model(str(gguf), "gguf-q16", map_weights=True)
    path = plane_cache.cache_path(gguf, "gguf-q16")
    capsys.readouterr()
    # another file at the same path: a different key, so packed again, and its own logits
    other = write(tmp_path / "other.gguf", "tiny-llama3", "Q4_K_M", seed=1).path
    os.replace(other, gguf)
    fresh = logits(load_model(str(gguf), "gguf-q16").model, ids)
    assert not torch.equal(fresh, want)
    assert torch.equal(logits(load_model(str(gguf), "gguf-q16", map_weights=True).model, ids), fresh)
    assert "packed" in capsys.readouterr().err
    # a torn file (cut short), and one whose matrices are not the model's (found stale mid-load): both rebuilt
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert torch.equal(logits(load_model(str(gguf), "gguf-q16", map_weights=True).model, ids), fresh)
    assert "packed" in capsys.readouterr().err

    def another_shape(header):
        header["matrices"][3]["sig"][0][1] += 8
    rewrite_header(path, another_shape)
    assert plane_cache.PlaneCache.open(gguf, "gguf-q16", kernels).hit  # its key still matches
    assert torch.equal(logits(load_model(str(gguf), "gguf-q16", map_weights=True).model, ids), fresh)
    assert "packed" in capsys.readouterr().err


def test_an_unwritable_cache_keeps_the_planes_in_memory(files, kernels, tmp_path, monkeypatch, capsys):  # noqa: F811
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(plane_cache, "cache_path", lambda gguf, precision: blocker / "planes" / "x.planes")
    ids = [1, 2, 3]
    want = logits(load_model(str(files["tiny-llama3"]), "gguf-q16").model, ids)
    m = load_model(str(files["tiny-llama3"]), "gguf-q16", map_weights=True).model
    err = capsys.readouterr().err
    assert "--map-weights" in err and "stay in this process's memory" in err and "Traceback" not in err
    assert torch.equal(logits(m, ids), want)


def test_a_model_without_planes_is_refused_in_one_line(files):
    with pytest.raises(SpecdecError, match="--map-weights"):
        load_model(str(files["tiny-llama3"]), "fp32", map_weights=True)
    with pytest.raises(SpecdecError, match="--map-weights"):
        load_model("default", "fp16", map_weights=True)


def test_generate_with_map_weights_prints_what_it_prints_without(files, kernels, capsys):  # noqa: F811
    from specdec.cli import main

    args = ["generate", "--model", str(files["tiny-llama3"]), "--prompt", "a b c", "--max-new-tokens", "8",
            "--no-chat", "--json"]
    assert main(args) == 0
    want = json.loads(capsys.readouterr().out)["token_ids"]
    assert main(args + ["--map-weights"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == want
    assert main(args + ["--map-weights", "--precision", "fp32"]) == 2
    err = capsys.readouterr().err
    assert "--map-weights" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_planes_of_a_deleted_gguf_are_removed_when_the_next_are_written(files, kernels, tmp_path):  # noqa: F811
    gone = tmp_path / "gone.gguf"
    gone.write_bytes(files["tiny-llama3"].read_bytes())
    load_model(str(gone), "gguf-q16", map_weights=True)
    orphan = plane_cache.cache_path(gone, "gguf-q16")
    torn = orphan.with_name("torn.planes")
    torn.write_bytes(b"specdec-planes-1")
    kept = plane_cache.cache_path(files["tiny-gemma3"], "gguf-q16")
    load_model(str(files["tiny-gemma3"]), "gguf-q16", map_weights=True)  # exists, or is written now
    assert orphan.is_file() and kept.is_file()
    gone.unlink()
    other = tmp_path / "other.gguf"
    other.write_bytes(files["tiny-llama3"].read_bytes())
    load_model(str(other), "gguf-q16", map_weights=True)  # writes its planes, and prunes
    assert not orphan.exists() and not torn.exists() and kept.is_file()
    assert plane_cache.cache_path(other, "gguf-q16").is_file()
