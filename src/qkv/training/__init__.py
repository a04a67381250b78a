"""Training, shared by qkv's own models: the loop (:mod:`~qkv.training.loop`), checkpoint
directories (:mod:`~qkv.training.checkpoint`) and the checks every training config makes
(:mod:`~qkv.training.config`). The models' data and configs live with them (``qkv.translate``,
``qkv.lm``).
"""
