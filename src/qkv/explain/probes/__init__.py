"""Probes: which heads do a known job (coreference, induction, previous-token, retrieval), needles
and the head atlas. A probe is one `Probe` record; the table is
`qkv.explain.probes.registry` (`register_probe`, `probe`)."""
