# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config.example.yaml

.PHONY: run demo test bench clean

# uv installs the dependencies in seconds where pip takes a minute or more; pip if uv cannot be had.
install = if [ -x $(BIN)/uv ]; then $(BIN)/uv pip install --quiet --python $(BIN)/python $(1); \
	else $(BIN)/pip install --quiet $(1); fi

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv || $(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(call install,-e .)
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(call install,-e '.[dev]')
	touch $(VENV)/.installed $@

run: $(VENV)/.installed
	$(BIN)/gateway serve --config $(CONFIG)

demo: $(VENV)/.installed   # with `make run` serving in another terminal
	$(BIN)/gateway demo

test: $(VENV)/.installed-dev
	$(BIN)/ruff check --select F,E9 gateway policies storage tests bench scripts
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/latency.py

clean:
	rm -rf $(VENV) gateway.db blobs .pytest_cache
