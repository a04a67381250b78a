"""``qkv explain``: one token's attention on a real model, number by number.

Where things are:

* ``forward.py``  — the one traced forward pass every number comes from (``trace_rows``)
* ``select.py``   — tokens vs words (``--words``) and ``--token it@1``
* ``overview.py`` — every layer and head ranked for one token
* ``steps.py``    — one head's arithmetic redone in float64, compared with the forward
* ``heads.py``    — heads ranked from one word to another; the coreference probe
* ``ablation.py`` — ``--no-projection``: attention with q = k = v = x
* ``saturation.py`` — why divide by √d_k (``qkv softmax-demo``)
* ``render.py``, ``plots.py`` — terminal tables and heat maps
* ``cross.py``    — the same for a translation model's cross-attention

    >>> from qkv.explain import forward                               # doctest: +SKIP
    >>> model = forward.load_model("minilm")                          # doctest: +SKIP
    >>> traced = forward.trace(model, "The dog ate it", torch.tensor([4]))   # doctest: +SKIP
    >>> traced.weights(3).shape      # (heads, traced rows, tokens)   # doctest: +SKIP
    torch.Size([12, 1, 6])
"""
