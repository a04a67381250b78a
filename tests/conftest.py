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

import gc
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


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session):
    """Collect the garbage now, then freeze what is left (``gc.freeze``: later collections skip it).

    Why: under xdist a worker reports "finished" when ``pytest_sessionfinish`` ends, and the
    controller then closes its gateway; execnet gives the worker 5 s to return and otherwise sends
    it a SIGINT. What the worker still does after that is pytest's own clean-up, whose
    ``unraisableexception`` plugin runs full ``gc.collect()`` passes over every object the worker
    made (models, tokenizers, transformers, torch): ~0.9 s each for 0.3 M objects here, several
    seconds for a loaded worker on a busy 2-core machine. The SIGINT then lands in whatever
    Python code runs during a collection — hypothesis' gc callback (it times collections) — and a
    passing ``make test`` printed that KeyboardInterrupt traceback (issue 32, item 7). Collected
    here, before the worker reports, the clean-up's passes find only what was made since.
    """
    gc.collect()  # finalizers run while pytest still reports their unraisable exceptions
    gc.freeze()


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
