"""A model's parts as the circuits read them: `model.parts`, kept per model.

Examples:
    >>> import qkv
    >>> lm = qkv.load("lm")
    >>> parts_of(lm) is parts_of(lm)
    True
"""

from __future__ import annotations

import weakref

# Each model's parts (`model.parts`, rebuilt from its modules on every access: ~90 µs on the lm,
# a tenth of its forward), kept while its layers are the same modules. A table swapped since is
# not seen, but cannot mislead: `embed.split` checks that the tables rebuild layer 0's input.
_PARTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def parts_of(model):
    """`model.parts` ([`ModelParts`][qkv.models.protocol.ModelParts]), read once while the
    model's layers stay the same modules."""
    key = tuple(map(id, model.layers))
    kept = _PARTS.get(model)
    if kept is None or kept[0] != key:
        kept = _PARTS[model] = (key, model.parts)
    return kept[1]


__all__ = ["parts_of"]
