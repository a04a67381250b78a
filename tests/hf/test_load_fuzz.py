"""Issue 40 item 6: damaged hybrid checkpoints (tests/hf/fuzz_configs.py: a size missing, zero,
negative, huge or of another type, an unknown layer-type name, a kv-lora rank above hidden, a
weight of another shape) load or are refused in one line by ``qkv.load`` — never a traceback
from inside transformers or torch. A short seeded run; a long one: ``python
tests/hf/fuzz_configs.py 864 3`` (0 of 864 failed, 33 loaded)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # the qkv[hf] extra

from fuzz_configs import run  # noqa: E402
from qkv.errors import QkvError  # noqa: E402


def test_damaged_hybrid_checkpoints_load_or_are_refused_in_one_line(tmp_path):
    results = run(72, seed=0, work=str(tmp_path))  # 4 per hybrid
    failed = [r for r in results if r[3].startswith("FAILED")]
    assert not failed, failed
    assert sum(r[3].startswith("refused") for r in results) >= 60  # most are refused


@pytest.mark.parametrize("key,value,message", [
    ("kv_lora_rank", -1, "kv_lora_rank must be an integer >= 1, got -1"),
    ("qk_rope_head_dim", 0, "qk_rope_head_dim must be an integer >= 1, got 0"),
    ("hidden_size", 10**18, "hidden_size 1000000000000000000 is beyond any model's size"),
    ("num_experts_per_tok", 9, "num_experts_per_tok 9 is more than n_routed_experts 4"),
])
def test_a_bad_size_is_named(tmp_path, key, value, message):
    import qkv
    from fuzz_configs import apply
    from hybrids import save_hybrid

    save_hybrid("deepseek_v3", tmp_path / "good")
    apply(tmp_path / "good", tmp_path / "bad", key, value)
    with pytest.raises(QkvError, match=f"config.json: {message}[^\n]*$"):
        qkv.load(tmp_path / "bad")


def test_a_layer_type_the_forward_has_no_path_for_is_named(tmp_path):
    """GraniteMoeHybrid's config accepts "conv" in layer_types; its forward has no mask for it."""
    import qkv
    from fuzz_configs import apply
    from hybrids import save_hybrid

    save_hybrid("granitemoehybrid", tmp_path / "good")
    apply(tmp_path / "good", tmp_path / "bad", "layer_types", ["mamba", "attention", "mamba", "conv"])
    with pytest.raises(QkvError, match=r"config.json: layer_types names 'conv', which "
                                       r"GraniteMoeHybridForCausalLM has no layer for$"):
        qkv.load(tmp_path / "bad")
