"""Probes: which heads do a known job (coreference, induction, previous-token, retrieval), needles and the head atlas."""
