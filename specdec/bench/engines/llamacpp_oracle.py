"""llama.cpp as the reference for a GGUF file: its logits at every position of a token sequence, its tokenization
of strings, and specdec's logits compared with them.

    logits(gguf, ids)                  # np.ndarray [n, vocab], float32: row i scores the token after ids[i]
    tokenize(gguf, texts, special)     # [[ids], ...], no BOS added; special: <|im_start|> etc. as one token
    compare(gguf, ids, "gguf-q16")     # {"top1": ..., "max_abs": ..., "mean_abs": ..., ...}
    f32_copy(gguf, out)                # the same file with every tensor dequantized to F32

llama.cpp's arithmetic on a quantized file is not exact: its dot products quantize the activations to 8-bit blocks.
On the bundled SmolLM2 Q4_1 file that moves its logits by 0.17 on average (top-1 changes at 3% of prompt
positions) from what llama.cpp computes on the same weights stored as F32. So specdec's semantics are checked
against llama.cpp on the F32 copy (`compare(..., reference=f32_copy(...))`: agreement to a few thousandths), and
its distance from llama.cpp on the quantized file against llama.cpp's own distance from it (`distance`).

llama.cpp is node-llama-cpp's prebuilt CPU build, driven by the bench's worker (llamacpp_worker.mjs, whose "logits"
and "tokenize" requests serve this module), pinned in llamacpp_compare.VERSION and installed by `make llamacpp`
(`python -m specdec.bench.engines.llamacpp_oracle install`). One worker per GGUF file, started on first use with THREADS
threads and kept until close(): its CPU results do not depend on timing (the same tokens twice give the same logits
to the bit, and so do the same tokens fed one by one).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from specdec.bench.engines import llamacpp_compare as lc
from specdec.errors import SpecdecError
from specdec.models.target import TargetTraits

THREADS = 2
TIE = 0.01  # logits closer than this are a tie for top1_ties: specdec's own paths differ by up to 0.05
_WORKERS: dict[Path, lc.LlamaCppWorker] = {}  # by the GGUF's resolved path


def missing() -> str | None:
    """Why llama.cpp cannot run here (node or node-llama-cpp absent, with how to install it), or None."""
    try:
        lc.worker_command(Path("x.gguf"), THREADS)
    except SpecdecError as e:
        return str(e)
    return None


def worker(gguf_path: str | Path) -> lc.LlamaCppWorker:
    """The worker for this file, started on first use (loading the model) and kept until close()."""
    path = Path(gguf_path).resolve()
    if path not in _WORKERS:
        _WORKERS[path] = lc.LlamaCppWorker(lc.worker_command(path, THREADS), timeout_s=600)
    return _WORKERS[path]


def close(gguf_path: str | Path | None = None) -> None:
    """Stop the worker of this file, or every worker (each holds its model in memory until then)."""
    paths = list(_WORKERS) if gguf_path is None else [Path(gguf_path).resolve()]
    for path in paths:
        w = _WORKERS.pop(path, None)
        if w is not None:
            w.close()


def logits(gguf_path: str | Path, token_ids: list[int], context: int = 0) -> np.ndarray:
    """llama.cpp's logits [n, vocab] (float32) for token_ids fed from position 0 (no BOS added), in a context of at
    least `context` positions (LongRoPE's factors depend on it)."""
    with tempfile.TemporaryDirectory(prefix="specdec-llamacpp-") as tmp:
        out = Path(tmp) / "logits.f32"
        reply = worker(gguf_path).request(op="logits", tokens=[int(t) for t in token_ids], out=str(out),
                                          context=int(context))
        n, vocab = int(reply["n"]), int(reply["vocab"])
        rows = np.fromfile(out, dtype=np.float32)
    if n != len(token_ids) or rows.size != n * vocab or np.isnan(rows).any():
        raise SpecdecError(f"llama.cpp worker: {rows.size} logits for {len(token_ids)} tokens x {vocab}")
    return rows.reshape(n, vocab)


def tokenize(gguf_path: str | Path, texts: list[str], special: bool) -> list[list[int]]:
    """llama.cpp's token ids for each text (no BOS or EOS added); special: control tokens written in the text are
    matched whole, else spelled out as text."""
    return worker(gguf_path).request(op="tokenize", texts=list(texts), special=bool(special))["tokens"]


def model_spec(gguf_path: str | Path) -> str:
    """What specdec's loader is given for this file: 'default' for the bundled GGUF (its converted folder is
    already cached), else the path."""
    from specdec.models.gguf.convert import bundled_gguf_path

    path = Path(gguf_path).resolve()
    try:
        return "default" if path == bundled_gguf_path().resolve() else str(path)
    except SpecdecError:  # the bundled model is not installed
        return str(path)


def specdec_logits(gguf_path: str | Path, token_ids: list[int], precision: str | None,
                   context: int | None = None) -> tuple[np.ndarray, str]:
    """(specdec's logits [n, vocab] for token_ids, one prefill pass from position 0; the precision it ran), loaded
    for `context` positions (None: the model's)."""
    import torch

    from specdec.models.loader import load_model

    model = load_model(model_spec(gguf_path), precision, context=context).model
    cache = model.new_cache(1, len(token_ids))
    out = model.forward(torch.tensor([list(token_ids)]), torch.tensor([0]), cache, prefill=True)  # [1, n, vocab]
    return out[0].float().numpy(), TargetTraits.of(model).precision or precision


def distance(ours: np.ndarray, theirs: np.ndarray) -> dict:
    """How far logits `ours` [n, vocab] are from `theirs` [n, vocab']: top1 = the share of positions whose argmax
    agrees (top1_ties: or whose argmax theirs scores within TIE of its best); max_abs / mean_abs of the difference
    over all logits; scale = the largest |logit| of theirs; the positions whose argmax differs and, at each, how
    far below their best logit theirs puts our argmax (margins)."""
    vocab = min(ours.shape[1], theirs.shape[1])  # a padded embedding may add rows that no token reaches
    ours, theirs = ours[:, :vocab], theirs[:, :vocab]
    diff = np.abs(ours.astype(np.float64) - theirs)
    differ = np.flatnonzero(ours.argmax(-1) != theirs.argmax(-1))
    margins = theirs.max(-1) - theirs[np.arange(len(theirs)), ours.argmax(-1)]  # [n], 0 where they agree
    return {"n": len(ours), "vocab": vocab, "top1": 1 - len(differ) / len(ours),
            "top1_ties": float(np.mean(margins < TIE)), "max_abs": float(diff.max()), "mean_abs": float(diff.mean()),
            "scale": float(np.abs(theirs).max()), "top1_differs_at": differ.tolist(),
            "margins": [round(float(margins[i]), 4) for i in differ]}


def compare(gguf_path: str | Path, token_ids: list[int], precision: str | None,
            reference: str | Path | None = None) -> dict:
    """distance() of specdec at `precision` on `gguf_path` from llama.cpp on `reference` (default: the same file;
    else another file with the same weights, such as its f32_copy), for the same tokens, plus the precision run."""
    ours, ran = specdec_logits(gguf_path, token_ids, precision)
    return {"precision": ran, **distance(ours, logits(reference or gguf_path, token_ids))}


def f32_copy(gguf_path: str | Path, out_path: str | Path,
             change: Callable[[str, np.ndarray], np.ndarray] | None = None, drop: tuple[str, ...] = (),
             fields: dict | None = None) -> Path:
    """Write `gguf_path` with every tensor dequantized to F32 (the values gguf-py, and so specdec, reads from its
    blocks) and the same metadata: llama.cpp then multiplies in fp32 (its KV cache stays fp16). `change(name,
    values)`, if given, returns what to write instead of each tensor's values, metadata keys in `drop` are left
    out (a deliberately wrong file), and `fields` (key -> (value, type, element type or None)) replace or add keys
    (another vocabulary)."""
    import gguf
    from gguf.quants import dequantize

    from specdec.models.gguf.file import open_gguf

    reader = open_gguf(Path(gguf_path))
    writer = gguf.GGUFWriter(str(out_path), arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if (name.startswith("GGUF.") or name in ("general.architecture", "general.file_type") or name in drop
                or name in (fields or {})):
            continue  # the header's own fields, and the two the writer writes
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub)
    for name, (value, kind, sub) in (fields or {}).items():
        writer.add_key_value(name, value, kind, sub_type=sub)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape)]  # gguf lists dimensions innermost first
        values = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        writer.add_tensor(t.name, change(t.name, values) if change else values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out_path)


def installed_version(directory: Path | None = None) -> str | None:
    try:
        pkg = (directory or lc.llama_dir()) / "node_modules" / "node-llama-cpp" / "package.json"
        return json.loads(pkg.read_text())["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def install(directory: Path | None = None) -> None:
    """Install the pinned node-llama-cpp into `directory` ($NODE_LLAMA_DIR, default /tmp/llamacpp) unless that
    version is there already. Its prebuilt CPU binary comes with it from the npm registry; nothing is compiled."""
    directory = directory or lc.llama_dir()
    if installed_version(directory) == lc.VERSION:
        print(f"node-llama-cpp {lc.VERSION} is installed in {directory}")
        return
    npm = shutil.which("npm")
    if not npm or not shutil.which("node"):
        raise SpecdecError("installing llama.cpp (node-llama-cpp) needs Node.js 20 or later with npm on PATH")
    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "NODE_LLAMA_CPP_SKIP_DOWNLOAD": "true"}
    if not (directory / "package.json").is_file():
        subprocess.run([npm, "init", "-y"], cwd=directory, env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([npm, "install", "--no-audit", "--no-fund", f"node-llama-cpp@{lc.VERSION}"], cwd=directory,
                   env=env, check=True)
    if installed_version(directory) != lc.VERSION:
        raise SpecdecError(f"npm did not install node-llama-cpp {lc.VERSION} in {directory}")
    print(f"node-llama-cpp {lc.VERSION} installed in {directory}")


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python -m specdec.bench.engines.llamacpp_oracle install")
    try:
        install()
    except (SpecdecError, subprocess.CalledProcessError) as e:
        sys.exit(f"error: {e}")
