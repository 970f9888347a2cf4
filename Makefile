# chatmem — `make run` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
CHATMEM:= $(VENV)/bin/chatmem
STAMP  := $(VENV)/.installed

# Offline machines: libraries must use what ships in packages.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MEM0_TELEMETRY := False

# The queue catalogue lives in schemas/queues.py; `make worker QUEUES=segment,facts` picks some.
QUEUES ?= all

.PHONY: install run test chaos up worker bench lint schemas clean

$(STAMP): pyproject.toml
	$(PYTHON) chatmem/preflight.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(CHATMEM) demo

# `make test` runs everything, the whole fault matrix included; `make chaos` runs only the matrix.
# The matrix spends most of its 7-9 minutes waiting out the outages it injects, so it runs beside
# the rest of the suite, with its own embedded services, and its report follows the rest's. Either
# part failing fails the target. The checks on other CPUs (`-m emulated`, 3-7 minutes under qemu,
# by the host) follow the matrix on its side: a whole run kept only 1.2 of the two cores busy, and
# with them in line the rest took 18-19 minutes; beside it, 13.5 (docs/platforms.md). Each side's
# temporary folders are its own: pytest removes all but the newest three runs' folders from its
# shared one, so another run started meanwhile (a second checkout, a quick pytest) deleted this
# one's embedded Postgres under it. They are kept when a part fails.
# First, what the checks on other CPUs need (tests/emulator.py: Debian's qemu-user and arm64 Python,
# aarch64 wheels; fetched once into .chatmem/tools, no root); CI sets CHATMEM_TEST_EMULATION=required
# so those checks cannot skip.
test: install
	@$(PY) -m tests.emulator
	@log=$$(mktemp); root=$$(mktemp -d -t chatmem-test.XXXXXX); mkdir $$root/rest $$root/side; \
	( export PYTEST_DEBUG_TEMPROOT=$$root/side; \
	  $(PY) -m pytest -q -p no:cacheprovider tests/chaos; chaos=$$?; \
	  echo "== the checks on other CPUs (-m emulated), run beside the rest after the matrix =="; \
	  $(PY) -m pytest -q -p no:cacheprovider --ignore=tests/chaos -m emulated; other=$$?; \
	  test $$chaos -eq 0 && test $$other -eq 0 ) >$$log 2>&1 & side=$$!; \
	PYTEST_DEBUG_TEMPROOT=$$root/rest $(PY) -m pytest -q -p no:cacheprovider --ignore=tests/chaos -m "not emulated"; rest=$$?; \
	wait $$side; side=$$?; \
	echo "== the fault matrix (tests/chaos), then the checks on other CPUs, run beside the rest: exit $$side =="; \
	cat $$log; rm -f $$log; \
	if test $$rest -eq 0 && test $$side -eq 0; then rm -rf $$root || true; else echo "temporary folders kept in $$root"; exit 1; fi

chaos: install
	$(PY) -m pytest -q -p no:cacheprovider tests/chaos

up: install
	$(CHATMEM) up

worker: install
	$(CHATMEM) worker --queues $(QUEUES)

bench: install
	$(CHATMEM) bench ingest

# Retrains the segmenter's boundary scorer (memory/segmenter_weights.json, fixed seed) on the
# development splits; embeddings are cached under .chatmem/segmenter, so a retrain embeds nothing.
# The pair model's fine-tuning takes about an hour on two cores (62 minutes, docs/benchmarks.md).
TOPICSEG_DATA ?= ../shared/eval/topicseg
LOCOMO_DATA ?= ../shared/eval/locomo/locomo_dev.json
.PHONY: train-ranker
# The ranker learns from the turns the fine-tuned query encoder finds, so the retrain fine-tunes
# it first (torch: the `export` extra, installed here only; the read path runs the ONNX file).
train-ranker: install
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,export]'
	$(CHATMEM) bench train-ranker --data $(LOCOMO_DATA)
	$(CHATMEM) bench model-reference

.PHONY: train-segmenter
# First the model that reads which speaker is a bot in files that do not say (seconds), then the
# pair model among people (torch: the `export` extra, installed here only; the workers run the ONNX
# file), whose out-of-fold logits the scorer's stacker is fitted on.
train-segmenter: install
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,export]'
	$(CHATMEM) bench train-speakers --data $(TOPICSEG_DATA)
	$(CHATMEM) bench train-pair --data $(TOPICSEG_DATA)
	$(CHATMEM) bench train-segmenter --data $(TOPICSEG_DATA)
	$(CHATMEM) bench model-reference

TYPECHECK := $(VENV)/typecheck

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/chatmem
	for d in schemas memory adapters producers workers api bench; do ln -s $(CURDIR)/$$d $(TYPECHECK)/chatmem/$$d; done
	for f in chatmem/*.py; do ln -s $(CURDIR)/$$f $(TYPECHECK)/$$f; done
	cd $(TYPECHECK) && $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml -p chatmem

schemas: install
	$(CHATMEM) export-schemas

clean:
	rm -rf $(VENV) .chatmem .pytest_cache
