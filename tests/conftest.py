"""Suite-wide settings.

Torch threads: ``QKV_TEST_THREADS`` (default 1) threads per pytest process, e.g.
``QKV_TEST_THREADS=2 make test``. ``make test`` runs two pytest workers on a two-core machine;
each torch process would start as many threads as there are cores, and the oversubscription
makes small forwards ~10× slower (measured: a MiniLM forward 31 s → 1.9 s for the same test
file). One thread per process keeps both cores busy without fighting; the tests' matrices are
small, so a serial run loses little. The suite must pass at any thread count: a different count
changes how torch splits its reductions, so float results may differ in the last bits, and every
tolerance is meant to allow for that (none may rely on bit-equality across thread counts).

Hugging Face libraries are kept offline: every model the tests load is on disk.
"""

import os

import pytest
import torch
from hypothesis import settings

THREADS_VARIABLE = "QKV_TEST_THREADS"


def threads_from_env() -> int:
    """The torch thread count asked for by ``QKV_TEST_THREADS`` (a positive integer; default 1)."""
    raw = os.environ.get(THREADS_VARIABLE, "1")
    try:
        threads = int(raw)
    except ValueError:
        threads = 0
    if threads < 1:
        raise pytest.UsageError(f"{THREADS_VARIABLE} must be a positive integer (torch threads per "
                                f"test process), got {raw!r}")
    return threads


def pytest_configure(config):
    # Runs in the main process and in every xdist worker, before any test module is imported.
    torch.set_num_threads(threads_from_env())


def pytest_report_header(config):
    return f"torch threads per process: {torch.get_num_threads()} ({THREADS_VARIABLE})"


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

settings.register_profile("qkv", deadline=None, print_blob=True)
settings.load_profile("qkv")


# all-MiniLM-L6-v2 in qkv and in transformers (the peer), shared by the explain and CLI tests;
# a test module that defines its own ``model``/``hf`` fixture overrides these.
@pytest.fixture(scope="session")
def model():
    import qkv

    return qkv.load("minilm")


@pytest.fixture(scope="session")
def hf():
    import transformers

    from qkv.models.loading import minilm_dir

    return transformers.BertModel.from_pretrained(minilm_dir(), attn_implementation="eager").eval()
