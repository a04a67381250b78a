"""Training, shared by qkv's own models: the loop (`loop`), checkpoint
directories (`checkpoint`) and the checks every training config makes
(`config`). The models' data and configs live with them (`qkv.translate`,
`qkv.lm`).
"""
