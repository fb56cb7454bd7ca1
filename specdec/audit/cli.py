"""`specdec audit`: does a server's speculative mode sample from the model's own distribution?

It sends the same prompts many times to the endpoint and to a reference (the same model with speculation off)
through /v1/completions (a raw prompt: no chat template can differ), and compares the tokens generated at each
position with the tests of specdec.audit.stats. The built-in prompts are copy-heavy, so that an n-gram or
prompt-lookup drafter drafts nearly every round.

Tokens. The API returns text; the audit encodes each completion with `--tokenizer` (the model's). The encoding
is a fixed function of the generated tokens, so two servers that sample alike give encodings that are
distributed alike: the test stays valid, and a text that encodes differently from how it was generated only
moves a token to another position of that completion.

Seeds. Every request carries its own seed: the endpoint's are seed, seed + 1, ...; the reference's start at
seed + 2**30. Distinct seeds make the completions independent draws, disjoint ranges keep the two samples
independent of each other (a shared seed could couple them), and on a server that honours seeds the audit can
be repeated exactly. Both ranges stay below 2**31, which every server accepts.

Requests go only to the two URLs given, a few at a time per server so that a batching server batches them;
proxy settings from the environment are ignored (trust_env=False). Exit status: 0 consistent with lossless,
1 any other verdict (lossy, mismatch, inconclusive), 2 an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from specdec.client import (
    RequestFailed,
    TimedOut,
    Unreachable,
    async_client,
    counted,
    first_model,
    parse_prometheus,
    request,
    run_async,
    scrape,
)
from specdec.errors import SpecdecError
from specdec.inputs import AT_LEAST_1, POSITIVE, TOP_P, Ranged, ranged, read_text
from specdec.outputs import add_json_arg, check_json_file, emit_json, json_on_stdout

REFERENCE_SEED_OFFSET = 2**30
ACCEPTANCE_HEADER = "x-specdec-acceptance"  # what a specdec server says about its acceptance rule
KV_CACHE_HEADER = "x-specdec-kv-cache"  # and about its KV cache's type (f16, q8_0, q4_0)

# Copy-heavy prompts: the continuation repeats text already in the prompt, so a drafter that looks up the
# context drafts nearly every round, while the model at temperature 1 still leaves room for other tokens.
PROMPTS = (
    "Alice: I think we should leave now.\nBob: I think we should leave now too.\nCarol: I think",
    "def area(width, height):\n    return width * height\n\n\ndef area(width, height):\n    return",
    "Monday, Tuesday, Wednesday, Thursday. Monday, Tuesday, Wednesday, Thursday. Monday, Tuesday,",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the",
)


@dataclass(frozen=True)
class Server:
    name: str  # "endpoint" | "reference": for messages
    url: str  # the base URL, without /v1
    model: str | None  # None: the first id of GET /v1/models


def base_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise SpecdecError(f"a server URL must start with http:// or https://, got {url!r}")
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def read_prompts(path: str) -> tuple[str, ...]:
    """JSON lines: each a string, or an object with a "prompt" string."""
    prompts = []
    for n, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecdecError(f"{path}:{n}: not JSON ({e})") from None
        text = obj.get("prompt") if isinstance(obj, dict) else obj
        if not isinstance(text, str) or not text:
            raise SpecdecError(f"{path}:{n}: expected a string or an object with a \"prompt\" string")
        prompts.append(text)
    if not prompts:
        raise SpecdecError(f"{path}: no prompts")
    return tuple(prompts)


def _fail(server: Server, what: str) -> SpecdecError:
    return SpecdecError(f"the {server.name} at {server.url}: {what}")


def _failed(server: Server, method: str, path: str, e: RequestFailed) -> SpecdecError:
    if isinstance(e, TimedOut):
        return _fail(server, f"no answer to {method} {path} in time")
    if isinstance(e, Unreachable):
        return _fail(server, f"unreachable ({e})")
    return _fail(server, f"{method} {path} refused: {e}")


async def _request(client: httpx.AsyncClient, server: Server, method: str, path: str, **kw) -> httpx.Response:
    try:
        return await request(client, method, server.url + path, **kw)
    except RequestFailed as e:
        raise _failed(server, method, path, e) from None


async def model_id(client: httpx.AsyncClient, server: Server) -> str:
    if server.model:
        return server.model
    try:
        model = await first_model(client, server.url + "/v1")
    except RequestFailed as e:
        raise _failed(server, "GET", "/v1/models", e) from None
    if model is None:
        raise _fail(server, "GET /v1/models lists no model (give it with --model / --reference-model)")
    return model


@dataclass
class Collected:
    texts: list[list[str]]  # [prompt][sample]
    drafted: int = 0  # from specdec's usage.speculative, or else the endpoint's /metrics counters
    accepted: int = 0
    acceptance: str | None = None  # the x-specdec-acceptance header, where the server sends one
    kv_cache: str | None = None  # the x-specdec-kv-cache header, likewise


async def collect(servers: tuple[Server, Server], prompts: tuple[str, ...], samples: int, body: dict, seed: int,
                  concurrency: int, api_key: str | None, timeout_s: float) -> tuple[Collected, Collected]:
    """`samples` completions of every prompt from each server; requests interleaved, `concurrency` per server."""
    out = tuple(Collected([[""] * samples for _ in prompts]) for _ in servers)
    jobs = [(s, i, p) for i in range(samples) for p in range(len(prompts)) for s in range(2)]
    async with async_client(api_key, timeout_s, 2 * concurrency) as client:
        models = [await model_id(client, s) for s in servers]
        before = await scrape(client, servers[0].url)  # a server that reports drafts in /metrics only (vLLM)

        async def one(s: int, i: int, p: int) -> None:
            server = servers[s]
            req = {**body, "model": models[s], "prompt": prompts[p],
                   "seed": seed + (REFERENCE_SEED_OFFSET if s else 0) + i * len(prompts) + p}
            r = await _request(client, server, "POST", "/v1/completions", json=req)
            try:
                obj = r.json()
                text = obj["choices"][0]["text"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise _fail(server, "a /v1/completions answer without choices[0].text") from None
            if not isinstance(text, str):
                raise _fail(server, "a /v1/completions answer whose text is not a string")
            got = out[s]
            got.texts[p][i] = text
            spec = (obj.get("usage") or {}).get("speculative") or {}
            got.drafted += int(spec.get("drafted_tokens") or 0)
            got.accepted += int(spec.get("accepted_tokens") or 0)
            got.acceptance = r.headers.get(ACCEPTANCE_HEADER, got.acceptance)
            got.kv_cache = r.headers.get(KV_CACHE_HEADER, got.kv_cache)

        queues = [asyncio.Queue() for _ in servers]
        for job in jobs:
            queues[job[0]].put_nowait(job)

        async def worker(q: asyncio.Queue) -> None:
            while not q.empty():
                await one(*q.get_nowait())

        tasks = [asyncio.ensure_future(worker(q)) for q in queues for _ in range(concurrency)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                t.result()  # the first error, if any
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        after = await scrape(client, servers[0].url)
    counts = counted(parse_prometheus(before), parse_prometheus(after)) if before and after else None
    if counts and not out[0].drafted:  # the endpoint's counters over the audit (the reference's requests went
        out[0].drafted, out[0].accepted = counts[0], counts[1]  # elsewhere; anything else it served counts too)
    return out


def register(sub) -> None:
    a = sub.add_parser("audit", help="test whether a server's speculative mode samples from the model's own "
                                     "distribution, against a reference server")
    a.add_argument("--endpoint", required=True, metavar="URL", help="the server under audit (OpenAI-compatible)")
    a.add_argument("--reference", required=True, metavar="URL",
                   help="the same model without speculation (e.g. `specdec serve --drafter none`)")
    a.add_argument("--model", default=None, help="the endpoint's model id (default: the first it lists)")
    a.add_argument("--reference-model", default=None, help="the reference's model id (default: the first it lists)")
    a.add_argument("--tokenizer", default="default", metavar="MODEL",
                   help="the model whose tokenizer encodes the completions: 'default' (bundled SmolLM2-135M), a "
                        "folder or a .gguf")
    a.add_argument("--prompts", metavar="FILE", help="JSON lines: strings or {\"prompt\": ...} (default: built-in "
                                                     "copy-heavy prompts)")
    a.add_argument("--samples", type=int, default=400, action=ranged(10), help="completions per prompt per server")
    a.add_argument("--max-tokens", type=int, default=6, action=ranged(2, 64),
                   help="tokens per completion; positions 2.. are compared (1 comes from the prompt pass)")
    a.add_argument("--temperature", type=float, default=1.0, action=ranged(0, 2, low_open=True),
                   help="in (0, 2]: at 0 (greedy) there is nothing to sample")
    a.add_argument("--top-p", type=float, default=1.0, action=TOP_P)
    a.add_argument("--significance", type=float, default=0.05, action=ranged(0, 1, low_open=True, high_open=True),
                   help="the audit's false-alarm rate (the level of its test, Bonferroni-split over its tests)")
    a.add_argument("--alpha", type=float, dest="significance", action=OldAlpha, low=0, high=1, low_open=True,
                   high_open=True, help=argparse.SUPPRESS)  # the old spelling, one more release
    a.add_argument("--seed", type=int, default=0, action=ranged(0, REFERENCE_SEED_OFFSET - 10**8 - 1),
                   help="the endpoint's first request seed; the reference's start 2**30 higher")
    a.add_argument("--concurrency", type=int, default=8, action=AT_LEAST_1, help="requests in flight per server")
    a.add_argument("--timeout", type=float, default=120.0, action=POSITIVE, help="seconds per request")
    a.add_argument("--api-key", default=None, help="sent to both servers as 'Authorization: Bearer KEY'")
    add_json_arg(a, "the verdict, its tests and the run")
    a.set_defaults(func=run_audit)


class OldAlpha(Ranged):
    """`audit --alpha`, the old spelling of --significance (plan and simulate's --alpha is an acceptance rate)."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)  # a value out of range: its one-line error only
        print("specdec audit: --alpha is now --significance (the test's level; --alpha elsewhere is an acceptance "
              "rate); the old spelling goes in the next release", file=sys.stderr)


def check_args(args, prompts: tuple[str, ...]) -> None:
    """What the flags' ranges (checked as they are parsed) leave: the total."""
    if len(prompts) * args.samples > 10**8:
        raise SpecdecError("too many requests")


def load_tokenizer(spec: str):
    """The tokenizer of a model ('default', a folder, a .gguf), or of a folder that holds only tokenizer.json."""
    from specdec.models.loader import resolve_model_dir
    from specdec.models.text.tokenizer import Tokenizer

    folder = Path(spec).expanduser()
    return Tokenizer.from_dir(folder if (folder / "tokenizer.json").is_file() else resolve_model_dir(spec))


def kv_note(got: tuple[Collected, Collected], verdict: str) -> str | None:
    """What the two servers' KV cache types mean for the verdict, where they differ: a quantized cache is a slightly
    different model, so the audit then measures the cache's difference beside speculation's."""
    ep, ref = got[0].kv_cache, got[1].kv_cache
    if ep is None or ref is None or ep == ref:
        return None
    seen = ("a difference was found: it may be the cache type's (a slightly different model), not speculation's"
            if verdict != "lossless" else "the difference the cache types make was not detectable at this sample size")
    return (f"the endpoint's KV cache is {ep}, the reference's {ref}: {seen}; audit against a reference on the same "
            "type to test speculation alone")


def run_audit(args) -> int:
    from specdec.audit.stats import END, OTHER, compare

    prompts = read_prompts(args.prompts) if args.prompts else PROMPTS
    check_args(args, prompts)
    check_json_file(args)
    tok = load_tokenizer(args.tokenizer)
    servers = (Server("endpoint", base_url(args.endpoint), args.model),
               Server("reference", base_url(args.reference), args.reference_model))
    body = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p, "stream": False}
    n = len(prompts) * args.samples
    if not json_on_stdout(args):
        print(f"specdec audit: {n} completions from each server ({len(prompts)} prompts x {args.samples}), "
              f"{args.max_tokens} tokens, temperature {args.temperature:g}, top-p {args.top_p:g}", file=sys.stderr)
    t0 = time.perf_counter()
    got = run_async(collect(servers, prompts, args.samples, body, args.seed, args.concurrency,
                            args.api_key, args.timeout))  # also from a thread that runs an event loop
    wall = time.perf_counter() - t0
    ids = [[[tok.encode(t) for t in texts] for texts in g.texts] for g in got]
    result = compare(ids[0], ids[1], args.max_tokens, args.significance)
    ep = got[0]
    speculation = {"drafted_tokens": ep.drafted, "accepted_tokens": ep.accepted} if ep.drafted else None
    note = kv_note(got, result.verdict)
    emit_json(args, {**result.to_dict(), "endpoint": servers[0].url, "reference": servers[1].url,
                     "samples": args.samples, "max_tokens": args.max_tokens, "temperature": args.temperature,
                     "top_p": args.top_p,
                     "seeds": {"endpoint": args.seed, "reference": args.seed + REFERENCE_SEED_OFFSET},
                     "prompts": list(prompts), "endpoint_speculation": speculation,
                     "endpoint_acceptance": ep.acceptance, "endpoint_kv_cache": ep.kv_cache,
                     "reference_kv_cache": got[1].kv_cache, "kv_cache_note": note,
                     "wall_s": round(wall, 2)})
    if not json_on_stdout(args):
        def show(label) -> str:
            return "<end>" if label == END else OTHER if label == OTHER else repr(tok.decode([label]))

        for t in result.positions:
            top = ", ".join(f"{show(lab)} {a}/{b}" for lab, a, b in t.top)
            print(f"  prompt {t.prompt + 1} position {t.position}: {t.bins} bins, chi2 {t.chi2:.1f} (df {t.df}), "
                  f"p {t.p:.2g}, TV {t.tv:.3f}, detectable {t.detectable_tv:.3f}; top {top}")
        if speculation:
            print(f"  endpoint: {ep.accepted} of {ep.drafted} drafted tokens accepted")
        if ep.acceptance:
            print(f"  endpoint says: {ACCEPTANCE_HEADER}: {ep.acceptance}")
        if note:
            print(f"  {note}")
        print(f"  {result.tests} tests at level {args.significance:g}/{result.tests} each (Bonferroni); position 1 "
              f"(the prompt pass) p = {result.first_position_p:.2g}; wall {wall:.1f} s")
        print(result.message)
    return 0 if result.verdict == "lossless" else 1
