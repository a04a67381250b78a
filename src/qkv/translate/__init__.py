"""English→French translation on a toy grammar: the data, with gold word alignments
(``qkv.translate.grammar``), and what learns from it."""
