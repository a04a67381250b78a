"""Sequences with copied spans: the data on which induction heads form.

A sequence is new tokens in which, now and then, a span of earlier tokens is written again:

```text
bika doma feta bona gisa  dela ...  fora  doma feta bona gisa dela  bapa ...
     └──── span ────┘               └──── its copy ────────┘
```

The first token of a copy is unpredictable (which earlier span is copied, and when, is random);
every later token of it is predictable *only* by looking back: find the current token's earlier
occurrence and read the token after it — what an induction head does, with a previous-token head
in an earlier layer (Olsson et al., 2022). Copies start at random distances back, so no head can
predict them by position alone.

`qkv train lm` draws its made-up words this way (`qkv.lm.data`) and `qkv train reader`
its copying windows (`qkv.reader.data`); the rule lives here once.

Examples:
    >>> import random
    >>> rng = random.Random(0)
    >>> ids, copied = copy_sequence(rng, 12, lambda ids: rng.randrange(100), copy_prob=1.0,
    ...                             min_span=3, max_span=4)
    >>> len(ids), len(copied), copied[:3]          # the first tokens cannot be copies
    (12, 12, [False, False, False])
"""

from __future__ import annotations

import random
from typing import Callable


def copy_sequence(rng: random.Random, length: int, draw: Callable[[list[int]], int], *,
                  copy_prob: float, min_span: int, max_span: int,
                  reach: int | None = None) -> tuple[list[int], list[bool]]:
    """`length` token ids and, for each, whether it continues a copy (predictable by induction).

    After each new token (`draw(ids so far)`), with chance `copy_prob` a span of
    `min_span … max_span` earlier tokens is written again, taken from at most `reach` tokens
    back (None: anywhere) — a model with a window must be able to see what it copies.
    """
    ids: list[int] = []
    copied: list[bool] = []
    while len(ids) < length:
        if len(ids) >= min_span and rng.random() < copy_prob:
            back = len(ids) if reach is None else min(len(ids), reach)
            span = rng.randint(min_span, min(max_span, back))
            start = rng.randint(len(ids) - back, len(ids) - span)
            ids += ids[start:start + span]
            copied += [False] + [True] * (span - 1)
        ids.append(draw(ids))
        copied.append(False)
    return ids[:length], copied[:length]
