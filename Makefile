# The two commands of the README: `make demo` runs the main job on the built-in
# example; `make test` passes the tests. Both set up .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test setup bench

$(BIN)/activate:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/activate pyproject.toml setup.py batchsim/core/_core.c
	# CPU torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0 || echo "torch==2.13.0 unavailable: calibration tests will skip"
	$(BIN)/pip install -q -e '.[dev,ray]' || $(BIN)/pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/batchsim compare --out runs/compare

# The regression gate first (committed baselines of the shipped policies), then
# the suite, so pytest's summary is the last line.
test: setup
	$(BIN)/batchsim regress baselines/*.yaml --baseline baselines/baseline.json \
		--junit runs/regress/junit.xml --markdown runs/regress/summary.md
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m bench
