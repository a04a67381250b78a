"""A small Llama-architecture language model trained on text with repeated spans, so that
induction heads form: its data (`qkv.lm.data`) and training (`qkv.lm.train`,
`qkv train lm`). The model itself is `qkv.models.llama`; the trained checkpoint ships in
`qkv/data/lm` and loads with `qkv.load("lm")`-style paths like any Hugging Face directory.
"""
