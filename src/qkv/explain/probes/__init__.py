"""Probes: which heads do a known job (coreference, induction, previous-token, retrieval), needles
and the head atlas. A probe is one :class:`~qkv.explain.probes.base.Probe` record; the table is
:mod:`qkv.explain.probes.registry` (``register_probe``, ``probe``)."""
