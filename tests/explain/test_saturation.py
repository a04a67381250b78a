"""The √d_k demo: unscaled softmax saturates as d grows; scaled, it does not."""

import math

import pytest
import torch

from qkv.errors import QkvError
from qkv.explain.saturation import _jacobian_norm, saturation


def test_saturation_grows_without_scaling():
    rows = saturation([4, 64, 1024], trials=1000)
    raw = [r.max_weight_raw for r in rows]
    assert raw == sorted(raw) and raw[-1] > 0.9
    assert max(r.max_weight_scaled for r in rows) - min(r.max_weight_scaled for r in rows) < 0.05
    grads = [r.grad_raw for r in rows]
    assert grads == sorted(grads, reverse=True) and grads[-1] < 0.25 * rows[-1].grad_scaled
    for r in rows:
        # q·k of unit normals: variance d, kurtosis κ = 3 + 6/d; the sample standard deviation
        # of N = trials · keys scores has a relative standard error of √((κ − 1) / 4N). Six of
        # those (a 1-in-10⁹ miss for a correct demo; keys sharing a query only widen it slightly,
        # hence the ×√2 for the dependence).
        n = 1000 * 10
        rel = 6 * math.sqrt(2) * math.sqrt((2 + 6 / r.d) / (4 * n))
        assert r.score_std == pytest.approx(math.sqrt(r.d), rel=rel)
        assert r.scaled_std == pytest.approx(1.0, rel=rel)


def test_jacobian_norm_matches_autograd():
    z = torch.randn(5, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(lambda v: v.softmax(-1), z)
    assert _jacobian_norm(z.softmax(-1)[None])[0] == pytest.approx(float(jac.norm()))


def test_reproducible_and_checked():
    assert saturation([8], trials=50, seed=3) == saturation([8], trials=50, seed=3)
    with pytest.raises(QkvError, match="^keys must be at least 2, got 1$"):
        saturation([8], keys=1)
    with pytest.raises(QkvError, match=r"^dims must be positive whole numbers, got \[0\]$"):
        saturation([0])
    with pytest.raises(QkvError, match="^trials must be at least 1, got 0$"):
        saturation([8], trials=0)
