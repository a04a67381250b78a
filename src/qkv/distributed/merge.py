"""Merging partial attention results by their log-sum-exps: the formula lives in
`qkv.attention.merge` (ring attention and the spans path share it); re-exported here for
ring.py."""

from qkv.attention.merge import merge_into

__all__ = ["merge_into"]
