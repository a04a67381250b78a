"""Causal tools: changing a forward (ablate, patch) and measuring what a head does."""
