"""Suite-wide settings.

``make test`` runs two pytest workers on a two-core machine; each torch process would start as
many threads as there are cores, and the oversubscription makes small forwards ~10× slower
(measured: a MiniLM forward 31 s → 1.9 s for the same test file). One thread per process keeps
both cores busy without fighting; the tests' matrices are small, so a serial run loses little.
"""

import os

import torch
from hypothesis import settings

torch.set_num_threads(1)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

settings.register_profile("qkv", deadline=None, print_blob=True)
settings.load_profile("qkv")
