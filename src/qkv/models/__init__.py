"""Real pretrained models, written with qkv's modules, loaded from Hugging Face checkpoints.

* `bert.py`      — `BertModel` (encoder, post-norm) and `embed` (sentence vectors)
* `gpt2.py`      — `GPT2Model` (decoder-only, pre-norm, causal) and `generate`
* `gpt_neox.py`  — `GPTNeoXModel` (Pythia: parallel residual, partial rotary)
* `llama.py`     — `LlamaModel` (RMSNorm, SwiGLU, RoPE + scaling, GQA); `mistral.py`,
  `qwen2.py`, `qwen3.py` map their configs onto `LlamaConfig`
* `decoder.py`   — `DecoderLM`, the forward, caches and checks GPT-2, GPT-NeoX and Llama share
* `generate.py`  — [`generate`][qkv.models.generate], the decoding loop of every decoder (greedy,
  sampling, EOS)
* `roberta.py`, `distilbert.py` — BERT's encoder with RoBERTa's positions / DistilBERT's names
* `tokenizer.py` — [`Tokenizer`][qkv.models.Tokenizer] with per-token offsets and word ids
* `loading.py`   — [`load`][qkv.models.load]: a checkpoint directory or a known name → a ready model
* `registry.py`  — `FAMILIES` by `model_type`; `family.py`: the `Family` record
* `outputs.py`   — `EncoderOutput`, `DecoderOutput`

No `transformers` import at run time: only `safetensors` and `tokenizers`.

Examples:
    >>> import qkv.models
    >>> model = qkv.models.load("minilm")                           # doctest: +SKIP
    >>> model.embed(["The cat sat.", "A cat was sitting."]).shape   # doctest: +SKIP
    torch.Size([2, 384])
"""

from qkv.models.bert import BertConfig, BertModel
from qkv.models.gpt2 import GPT2Config, GPT2Model
from qkv.models.gpt_neox import GPTNeoXConfig, GPTNeoXModel
from qkv.models.llama import LlamaConfig, LlamaModel
from qkv.models.roberta import RobertaConfig, RobertaModel
from qkv.models.distilbert import DistilBertConfig, DistilBertModel
from qkv.models.family import Family
from qkv.models.loading import load
from qkv.models.registry import FAMILIES, register_family
from qkv.models.outputs import DecoderOutput, EncoderOutput
from qkv.models.tokenizer import BatchEncoding, Encoding, Tokenizer

__all__ = [
    "BatchEncoding", "BertConfig", "BertModel", "DecoderOutput", "EncoderOutput", "Encoding",
    "FAMILIES", "Family", "GPT2Config", "GPT2Model", "Tokenizer", "load", "register_family",
    "GPTNeoXConfig", "GPTNeoXModel", "RobertaConfig", "RobertaModel", "DistilBertConfig",
    "DistilBertModel", "LlamaConfig", "LlamaModel",
]
