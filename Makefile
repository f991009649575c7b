# The two commands of the README: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast conformance lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: no other requirement may pull a different (multi-GB CUDA) build.
	$(BIN)/pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[threads,test,lightning,huggingface,trackers,libraries]'
	# litdata pulls torchvision, whose wheel cannot load beside the CPU torch ("operator torchvision::nms does not
	# exist"), and Lightning imports torchvision wherever it is installed: it goes (litdata never imports it).
	$(BIN)/pip uninstall --quiet -y torchvision
	touch $@

# The demo's findings are its point: exit status 1 ("a critical finding") is the expected result here.
demo: $(STAMP)
	$(BIN)/loaderdoctor check demo; status=$$?; test $$status -le 1

# The unit tests on both cores; the tests with real workers two at a time (each a load beside the other, as on a
# shared node: their verdicts must hold there); then the `quiet` ones, which assert a measured speedup or a choice
# resting on one, one at a time, each with the machine's cores as a user's job would have them.
test: $(STAMP) lint
	$(BIN)/pytest tests/unit -n 2
	$(BIN)/pytest tests/integration tests/browser -m "not quiet" -n 2 --dist worksteal
	$(BIN)/pytest tests/integration -m quiet

# The quick inner loop: every test that starts no process (no worker, no subprocess), on two cores, in under a
# minute; the suite fails a test that starts one without the `workers` mark.
test-fast: $(STAMP)
	$(BIN)/pytest tests/unit -m "not workers" -n 2 -q --durations=5

# The drop-in's conformance suite over the whole matrix (fork, forkserver, spawn x 0, 1, 2 workers, every option).
conformance: $(STAMP)
	LOADERDOCTOR_FULL_MATRIX=1 $(BIN)/pytest tests/integration/test_conformance.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

# Every benchmark at its defaults, each writing its JSON (its figures, rounds and the machine's facts) to one folder
# of the run: `python benchmarks/harness/compare.py bench-results/A bench-results/B` sets two runs side by side.
bench: $(STAMP)
	@out=bench-results/$$(date -u +%Y%m%dT%H%M%SZ); \
	for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b --json $$out/$$(basename $$b .py).json || exit 1; done; \
	echo "== results: $$out"

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
