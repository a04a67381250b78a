"""RoBERTa (Liu et al., 2019): BERT's encoder, with positions counted from `padding_idx + 1`.

The layers, names and checkpoint layout are BERT's (`qkv.models.bert`); what differs:

* position ids start at `pad_token_id + 1` (Fairseq reserved the rows up to the padding id),
  so token i reads row `pad_token_id + 1 + i` of the position table — a 514-row table holds
  512 tokens;
* a byte-level BPE tokenizer (`<s> … </s>`, `Ġ`-marked words) from `tokenizer.json`;
* checkpoints saved from a model with a head carry `roberta.` and an `lm_head`.

```text
token i ─► word[id_i] + token_type[0] + position[pad_token_id + 1 + i] ─► LayerNorm ─► BERT layers
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from qkv.errors import QkvError
from qkv.models import bert
from qkv.models.bert import BertConfig, BertEmbeddings, BertModel
from qkv.models.family import Family

ROBERTA_ARCHITECTURES = ("RobertaModel", "RobertaForMaskedLM")


@dataclass(frozen=True)
class RobertaConfig(BertConfig):
    """BERT's sizes with RoBERTa's defaults (`max_position_embeddings` counts the
    `pad_token_id + 1` reserved rows: 514 for 512 tokens).

    Examples:
        >>> RobertaConfig(max_position_embeddings=514, pad_token_id=1).max_tokens
        512
    """

    vocab_size: int = 50265
    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.max_tokens < 1:
            raise QkvError(f"max_position_embeddings ({self.max_position_embeddings}) leaves no "
                           f"position after the pad_token_id + 1 = {self.position_offset} reserved rows")

    @property
    def position_offset(self) -> int:
        """The row of the position table that token 0 reads."""
        return self.pad_token_id + 1

    @property
    def max_tokens(self) -> int:
        """The most tokens a text may have."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "config.json") -> "RobertaConfig":
        """Read a Hugging Face RoBERTa `config.json` (as a dict); unsupported features raise.

        Examples:
            >>> RobertaConfig.from_dict({"hidden_size": 64, "num_attention_heads": 4}).position_offset
            2
        """
        return bert.read_config(cls, d, "roberta", ROBERTA_ARCHITECTURES, where=where)


class RobertaEmbeddings(BertEmbeddings):
    """BERT's embeddings reading position row `offset + p` for the token at position p."""

    def __init__(self, config: RobertaConfig):
        super().__init__(config)
        self.offset = config.position_offset

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(b, t) ids → (b, t, E); `position_ids` (b, t) or (t,) count from 0 as BERT's do."""
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[-1], device=input_ids.device)  # (t,)
        return super().forward(input_ids, token_type_ids, position_ids + self.offset)


class RobertaModel(BertModel):
    """A RoBERTa encoder: `BertModel` with `RobertaEmbeddings`.

    Examples:
        >>> model = RobertaModel(RobertaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
        ...                                    num_attention_heads=4, intermediate_size=64,
        ...                                    max_position_embeddings=20))
        >>> model(torch.tensor([[0, 7, 8, 2]])).last_hidden_state.shape
        torch.Size([1, 4, 32])
    """

    def __init__(self, config: RobertaConfig, *, tokenizer=None, name: str = "roberta",
                 max_seq_length: int | None = None):
        super().__init__(config, tokenizer=tokenizer, name=name,
                         max_seq_length=min(max_seq_length or config.max_tokens, config.max_tokens))
        self.embeddings = RobertaEmbeddings(config)

    def _check_ids(self, input_ids: torch.Tensor, varlen=None) -> tuple[int, int]:
        t = varlen.max_len if varlen is not None else (
            input_ids.shape[-1] if isinstance(input_ids, torch.Tensor) else 0)
        if t > self.config.max_tokens:
            raise QkvError(f"input is {t} tokens; {self.name} takes at most {self.config.max_tokens} "
                           f"(max_position_embeddings {self.config.max_position_embeddings} − "
                           f"{self.config.position_offset} reserved rows)")
        return super()._check_ids(input_ids, varlen)


def build(config: RobertaConfig, *, tokenizer=None, name: str = "roberta",
          directory: str | None = None) -> RobertaModel:
    return RobertaModel(config, tokenizer=tokenizer, name=name,
                        max_seq_length=bert.sentence_length(directory, config.max_tokens))


FAMILY = Family(
    config_from_dict=RobertaConfig.from_dict, build=build, max_length=lambda c: c.max_tokens,
    prefix="roberta.", shapes=bert.bert_shapes,
    # position_ids / token_type_ids: saved buffers; pooler / lm_head: heads the encoder does not use
    ignored=re.compile(r"^(embeddings\.(position_ids|token_type_ids)|pooler\..*|lm_head\..*)$"),
    convert=bert.bert_convert,
)
