"""qkv.hf.load: a saved transformers directory on qkv's attention, or one error naming why not."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra
import torch  # noqa: E402

import qkv.hf  # noqa: E402
from archs import DECODERS, build  # noqa: E402
from qkv.errors import QkvError  # noqa: E402
from tolerance import assert_within  # noqa: E402



def test_load_runs_on_qkv_and_equals_eager(tmp_path):
    model = build(DECODERS, "olmo2")
    model.save_pretrained(tmp_path)
    ours = qkv.hf.load(tmp_path)
    assert ours.config._attn_implementation == "qkv" and not ours.training
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.no_grad():
        plain = model(ids).logits
        truth = model.double()(ids).logits  # eager in float64
        assert_within(ours(ids).logits, truth, plain)


def write(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("config,msg", [
    (dict(model_type="my_model", auto_map={"AutoModel": "x.Y"}),
     r"cannot build model_type 'my_model' \(its config names remote code, which qkv never runs\)"),
    (dict(model_type="llama", architectures=["NotAClass"]), "architecture 'NotAClass' is not a transformers class"),
    (dict(model_type="bloom", architectures=["BloomForCausalLM"]),
     "BloomForCausalLM: its attention does not go through transformers' AttentionInterface"),
])
def test_refused_by_name(tmp_path, config, msg):
    with pytest.raises(QkvError, match=msg):
        qkv.hf.load(write(tmp_path, **config))


def test_no_config(tmp_path):
    with pytest.raises(QkvError, match="cannot read a transformers config"):
        qkv.hf.load(tmp_path)
