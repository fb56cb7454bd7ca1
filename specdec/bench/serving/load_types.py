"""The data of `specdec loadtest`: a run's configuration (LoadConfig), one request's record (RequestResult) and one
level's summary (LevelResult). The runner (specdec.bench.serving.loadtest), its report
(specdec.bench.serving.loadtest_report), the endpoint bench and the serving benchmark all read them; none of those
imports another for them."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.client import Completion
from specdec.errors import SpecdecError

ENDPOINTS = {"chat": "/chat/completions", "completions": "/completions"}  # paths under the /v1 base
MAX_ERRORS = 5  # error strings kept per level
RequestResult = Completion  # one request of a level, as specdec.client times it


@dataclass(frozen=True)
class LoadConfig:
    url: str  # server base URL, e.g. http://127.0.0.1:8000; '/v1' is appended unless the URL ends with it
    concurrency: tuple[int, ...]  # the levels, run in this order: clients sending at once
    requests_per_client: int = 3  # sent one after another by each client
    max_tokens: int = 64  # completion tokens asked per request
    temperature: float = 0.0
    stream: bool = True  # SSE streaming; without it TTFT = E2E and there is no ITL or TPOT
    api_key: str | None = None  # sent as 'Authorization: Bearer KEY'
    model: str | None = None  # None: the first id that GET /v1/models lists
    endpoint: str = "chat"  # "chat": /v1/chat/completions, one user message; "completions": /v1/completions
    timeout_s: float = 300.0  # per request, the whole response included
    seed: int | None = None  # sent as 'seed' when set

    def __post_init__(self) -> None:
        object.__setattr__(self, "concurrency", tuple(self.concurrency))
        if not self.url.startswith(("http://", "https://")):
            raise SpecdecError(f"--url must start with http:// or https://, got {self.url!r}")
        if not self.concurrency or not all(isinstance(c, int) and c >= 1 for c in self.concurrency):
            raise SpecdecError(f"concurrency levels must be integers >= 1, got {list(self.concurrency)}")
        if self.requests_per_client < 1:
            raise SpecdecError(f"--requests-per-client must be >= 1, got {self.requests_per_client}")
        if self.max_tokens < 1:
            raise SpecdecError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if not self.temperature >= 0:
            raise SpecdecError(f"--temperature must be >= 0, got {self.temperature}")
        if self.endpoint not in ENDPOINTS:
            raise SpecdecError(f"--endpoint must be one of {', '.join(ENDPOINTS)}, got {self.endpoint!r}")
        if not self.timeout_s > 0:
            raise SpecdecError(f"--timeout must be > 0 seconds, got {self.timeout_s}")

    @property
    def api_base(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith("/v1") else base + "/v1"


@dataclass
class LevelResult:
    concurrency: int
    requests: int  # sent
    failed: int
    wall_s: float  # first request sent -> last response done
    output_tokens: int  # completion tokens of the successful requests
    throughput_tok_s: float  # output_tokens / wall_s
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    tpot_mean_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    errors: list[str]  # the first MAX_ERRORS error strings, in order of completion
