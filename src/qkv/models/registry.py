"""Model families by ``model_type``: the one table :func:`qkv.models.load` consults.

A family is one file (``bert.py``, ``gpt2.py``) holding its config dataclass, its model, and a
:class:`~qkv.models.family.Family` record (how to read ``config.json``, which tensors a
checkpoint must hold, how to rename them). Adding a family is that file plus one line in
:func:`_families`; ``load`` knows nothing family-specific.
"""

from __future__ import annotations

from qkv.models import bert, gpt2, llama, mistral, qwen2, qwen3
from qkv.models import distilbert, gpt_neox, roberta
from qkv.models.family import Family


def _families() -> dict[str, Family]:
    return {
        "bert": bert.FAMILY,
        "gpt2": gpt2.FAMILY,
        "gpt_neox": gpt_neox.FAMILY,
        "roberta": roberta.FAMILY,
        "distilbert": distilbert.FAMILY,
        "llama": llama.FAMILY,
        "mistral": mistral.FAMILY,
        "qwen2": qwen2.FAMILY,
        "qwen3": qwen3.FAMILY,
    }


FAMILIES: dict[str, Family] = _families()


def register_family(model_type: str, family: Family) -> None:
    """Make ``load`` read checkpoints whose ``config.json`` says ``"model_type": model_type``.

    Raises ``ValueError`` when the name is taken: a silent replacement would change what every
    existing checkpoint of that type loads as.
    """
    if model_type in FAMILIES:
        raise ValueError(f"model family {model_type!r} is already registered "
                         f"(registered: {', '.join(sorted(FAMILIES))})")
    if not isinstance(family, Family):
        raise ValueError(f"family must be a qkv.models.family.Family, got {type(family).__name__}")
    FAMILIES[model_type] = family
