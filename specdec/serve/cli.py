"""`specdec serve`: the OpenAI-compatible server. (Its load generator, `specdec loadtest`, and `specdec audit`
are clients: they live in specdec.bench and specdec.audit, and the server imports neither.)"""

from __future__ import annotations

import os
import signal
import sys
import threading

from specdec.errors import SpecdecError
from specdec.inputs import AT_LEAST_1, NON_NEGATIVE, PORT, ranged


def register(sub) -> None:
    from specdec.engine.cli import add_chat_template_arg, add_model_args
    from specdec.engine.scheduler import PREFILL_CHUNK
    from specdec.engine.speculation import add_speculation_args

    s = sub.add_parser("serve", help="an OpenAI-compatible server with continuous batching and speculation")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, action=PORT)
    add_model_args(s)
    add_chat_template_arg(s)
    add_speculation_args(s, "and round")
    s.add_argument("--row-floor", type=float, default=0.0, metavar="F", action=ranged(0, 1),
                   help="auto: draft only where every row's expected speed stays at least F times its speed "
                        "without drafts (0, the default: the batch's throughput alone decides; 0.97: no request "
                        "more than 3%% slower than without speculation, at the cost of drafting less)")
    s.add_argument("--max-batch", type=int, default=8, action=AT_LEAST_1,
                   help="sequences decoding at once (KV pool slots)")
    s.add_argument("--max-queue", type=int, default=64, action=NON_NEGATIVE,
                   help="requests waiting for a slot before 503s")
    s.add_argument("--context", type=int, default=None, action=ranged(2),
                   help="positions per sequence (default: the model's)")
    s.add_argument("--prefix-cache", type=int, default=4, metavar="N", action=NON_NEGATIVE,
                   help="finished sequences whose keys and values are kept for prompts that start the same way "
                        "(least recently used evicted first; 0: off)")
    s.add_argument("--prefill-chunk", type=int, default=PREFILL_CHUNK, action=NON_NEGATIVE,
                   help="prompt tokens prefilled per step, between decode rounds (0: whole prompts)")
    s.add_argument("--max-tokens-default", type=int, default=None, action=AT_LEAST_1,
                   help="max_tokens when a request gives none (default: the rest of the context)")
    s.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $SPECDEC_API_KEY, else no key)")
    s.add_argument("--profile", metavar="FILE", help="`specdec profile` JSON for the auto policy's pass costs "
                                                      "(default: this model's, measured once here and cached)")
    s.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: the file's stem, or the folder's name; the path as "
                        "given is accepted too)")
    s.add_argument("--max-body-bytes", type=int, default=4 << 20, action=ranged(1024))
    s.add_argument("--lossy-typical-acceptance", action="store_true",
                   help="LOSSY: Medusa-style typical acceptance for every request; responses are no longer the "
                        "model's own distribution (they carry 'x-specdec-acceptance: lossy-typical')")
    s.add_argument("--pace", default="off", type=_pace,
                   help="how streams release tokens: off (as each round emits them, in bursts; default), auto (one "
                        "at a time, at the rate the stream is producing: steadier, and round sizes hidden, for 5-16%% "
                        "of throughput on 2 cores, docs/results/pace-bench-xeon.md), or milliseconds between tokens; "
                        "a request may choose its own with stream_options.pace")
    s.set_defaults(func=run_serve)


def _pace(text: str):
    import argparse

    from specdec.serve.pacing import parse_pace

    try:
        return parse_pace(text)
    except SpecdecError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--pace ")) from None


def check_bindable(host: str, port: int) -> None:
    """A port that another process listens on (or an address this machine lacks), as one line."""
    import socket

    try:
        with socket.create_server((host, port), reuse_port=False) as sock:
            sock.close()
    except OSError as e:
        raise SpecdecError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def available_gib() -> float | None:
    """Memory Linux can still hand out without swapping (MemAvailable), or None where it does not say."""
    from specdec.models.loader import available_bytes

    got = available_bytes()
    return None if got is None else got / 2**30


def model_aliases(given: str, name: str) -> set[str]:
    """The names a request may give the model by besides the served id: the model as given on the command line,
    its absolute path, and the loaded model's name (vLLM accepts its model path the same way)."""
    from pathlib import Path

    out = {given, name}
    path = Path(given).expanduser()
    if path.exists():
        out.add(str(path.resolve()))
    return out


def warn_reserved(gib: float, available: float | None = None, kv: str | None = None,
                  per_position: int | None = None, native: bool = True) -> bool:
    """The KV pool and prefix cache are reserved for every slot's whole context but backed by memory only as
    sequences fill them: say so when filling them all would take more than the machine has left. `kv`,
    `per_position`: the KV cache's type and bytes a position, named in the warning; `native`: the model runs on
    the native kernels, which can keep a smaller type (offered)."""
    available = available_gib() if available is None else available
    if available is None or gib <= available:
        return False
    sizes = f" ({kv_sizes(kv, per_position)})" if kv else ""
    print(f"specdec: warning: the KV pool and prefix cache can grow to {gib:.1f} GiB as sequences fill them{sizes}, "
          f"more than the {available:.1f} GiB this machine has available: lower --context, --max-batch or "
          f"--prefix-cache{smaller_kv(kv, native)} if long requests on every slot are expected", file=sys.stderr,
          flush=True)
    return True


SMALLER_KV = {"f16": "q8_0 or q4_0", "q8_0": "q4_0"}  # the --kv-cache types that keep a position in fewer bytes


def smaller_kv(kv: str | None, native: bool) -> str:
    """", or use --kv-cache q8_0": the next smaller type, offered where the model runs on the native kernels."""
    return f", or use --kv-cache {SMALLER_KV[kv]}" if native and kv in SMALLER_KV else ""


def kv_sizes(kv: str, per_position: int | None) -> str:
    """"KV cache q8_0, 12,240 bytes a position": the type and what one position's keys and values take over every
    layer (None: a model that does not say)."""
    return f"KV cache {kv}" + (f", {per_position:,} bytes a position" if per_position else "")


def longest_context(per_position: int | None, rows: int, available: int | None) -> int | None:
    """The longest context at which `rows` sequences (the pool's slots and the prefix cache's entries) all fit in
    `available` bytes at `per_position` bytes a position; None where either is unknown."""
    if not per_position or available is None:
        return None
    return available // (per_position * max(rows, 1))


def check_context_fits(context: int, kv: str, per_position: int | None, available: int | None,
                       native: bool = True) -> None:
    """--context N that not even one sequence could fill in the memory this machine has left (the model loaded):
    refused in one line before the pool is made, with the KV cache's type, its bytes a position and the longest
    context one sequence can hold, and the smaller types where the model runs on the native kernels (`native`). (A
    pool whose every slot could not fill is only warned about: warn_reserved.)"""
    one = longest_context(per_position, 1, available)
    if one is None or context <= one:
        return
    raise SpecdecError(f"--context {context} does not fit here: one sequence's keys and values take "
                       f"{size(context * per_position)} ({kv_sizes(kv, per_position)}), and {size(available)} is "
                       f"available, enough for {one:,} positions: lower --context{smaller_kv(kv, native)}")


def size(nbytes: float) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def run_serve(args) -> int:
    import uvicorn

    from specdec.engine.calibrate import make_policy, measured_draft_step, planned_cost
    from specdec.engine.cli import chat_template_for
    from specdec.engine.scheduler import Scheduler, SchedulerConfig
    from specdec.engine.speculation import from_args
    from specdec.models.loader import available_bytes, kv_bytes_per_position
    from specdec.models.target import TargetTraits
    from specdec.models.text.chat_templates import use_chat_template
    from specdec.runtime import ModelSpec, build
    from specdec.serve.app import ServeConfig, create_app
    from specdec.serve.live import LiveInfo, LiveStats
    from specdec.serve.metrics import ServerMetrics
    from specdec.serve.worker import EngineWorker
    from specdec.theory.profile import Profile

    how = from_args(args)  # checked before the model loads
    if args.profile:
        Profile.load(args.profile)  # its shape checked before the model loads
    if args.lossy_typical_acceptance:
        print("specdec: warning: --lossy-typical-acceptance is LOSSY: responses are not the model's own "
              "distribution", file=sys.stderr)
    sched_cfg = SchedulerConfig(args.max_batch, args.max_queue, args.context, args.prefill_chunk or None,
                                prefix_cache=args.prefix_cache or 0)
    spec = ModelSpec.from_args(args)
    chosen = chat_template_for(args)  # a bad name or file, before the model loads
    check_bindable(args.host, args.port)  # before the model loads: a taken port is found in a second
    target, drafter = build(spec)
    traits = TargetTraits.of(target.model)
    per_position, available = kv_bytes_per_position(target.model), available_bytes()
    limit = target.model.cfg.max_position_embeddings
    if args.context is not None:  # before the pool is made (the model's own context is only warned about)
        check_context_fits(min(args.context, limit), traits.kv_cache, per_position, available,
                           traits.kernels is not None)
    chat = use_chat_template(target.tokenizer, chosen)  # before the scheduler reads its end-of-turn token
    if chat == "none":
        chat = "none (chat requests get a 400 naming --chat-template; /v1/completions takes raw text)"
    policy = make_policy(how, planned_cost(target, how, args.max_batch, args.profile), drafter.free,
                         row_floor=args.row_floor, draft_step_s=measured_draft_step(drafter))
    sched = Scheduler(target.model, target.tokenizer, drafter, policy, sched_cfg)
    prefix = "off"
    if sched.prefix is not None:
        prefix = f"{args.prefix_cache} x {sched.prefix.capacity} positions ({sched.prefix.nbytes / 2**30:.1f} GiB)"
    elif args.prefix_cache:
        prefix = "off (it needs the native kernels to be exact)"
    name = args.served_model_name or target.name
    metrics = ServerMetrics(max(policy.max_k, 1))
    live = LiveStats(metrics, LiveInfo(name, drafter.name, how.policy, policy.max_k), policy.cost)
    worker = EngineWorker(sched, metrics, live)
    aliases = tuple(model_aliases(args.model, target.name) - {name})  # the model as given names it too
    app = create_app(worker, target.tokenizer, ServeConfig(name, args.api_key, args.max_body_bytes,
                                                           args.max_tokens_default, aliases,
                                                           args.lossy_typical_acceptance, args.pace))
    kv_gib = getattr(sched.cache, "nbytes", 0) / 2**30
    kv = kv_sizes(sched.kv_cache, per_position)
    warn_reserved(kv_gib + (sched.prefix.nbytes / 2**30 if sched.prefix is not None else 0.0),
                  None if available is None else available / 2**30, sched.kv_cache, per_position,
                  traits.kernels is not None)
    rows = args.max_batch + (len(sched.prefix.entries) if sched.prefix is not None else 0)
    longest = longest_context(per_position, rows, available)
    whole = " (the model's whole context)" if longest is not None and longest >= limit else ""
    fits = ("" if longest is None else f"; the {available / 2**30:.1f} GiB available holds every slot"
            f"{' and prefix entry' if sched.prefix is not None else ''} full at up to {min(longest, limit):,} "
            f"positions{whole}")
    print(f"specdec: serving {name} ({target.model.precision}) on http://{args.host}:{args.port}/v1 - drafter "
          f"{drafter.name}, policy {how}, max batch {args.max_batch}, context "
          f"{sched.context} ({kv}: KV pool up to {kv_gib:.1f} GiB, taken as sequences fill it{fits}), prefix "
          f"cache {prefix}"
          f", streams paced {args.pace}{', acceptance LOSSY (typical)' if args.lossy_typical_acceptance else ''}"
          f", chat template {chat}",
          file=sys.stderr,
          flush=True)
    return serve_on_this_thread(worker, uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                                                      log_level="warning", access_log=False)))


def serve_on_this_thread(worker, server) -> int:
    """The engine's step loop on this thread, the one that loaded the model, and HTTP on a thread of its own.

    The kernels' OpenMP team belongs to the thread that first ran a pass: a pass on another thread starts a second
    team, and with more OpenMP threads alive than cores, libgomp's barriers stop spinning and sleep. On the bundled
    model (2 cores) a one-row pass took 11.3-11.6 ms on a second thread against 2.4 ms on the loading one, and the
    step loop ran 4.2-4.3x slower there (docs/results/engine-thread.md).

    SIGTERM or SIGINT: uvicorn stops accepting connections and lets the requests in flight finish (their steps
    still run here), then the step loop ends and the exit status is 0."""
    failed: list[BaseException] = []

    def http() -> None:
        try:
            server.run()
        except BaseException as e:  # SystemExit included: uvicorn exits that way when it cannot start
            failed.append(e)
        finally:
            worker.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, server.handle_exit)  # uvicorn installs handlers only on the main thread: this is it
    thread = threading.Thread(target=http, name="specdec-http", daemon=True)
    thread.start()
    try:
        worker.run_here()
    finally:  # the step loop ended (HTTP stopped, or a bug): HTTP stops too, its requests in flight finished
        server.should_exit = True
        thread.join()
    if failed and not (isinstance(failed[0], SystemExit) and not failed[0].code):
        print(f"specdec: error: the HTTP server stopped: {failed[0]!r}", file=sys.stderr)
        return 1
    return 0
