"""`linearise`: a norm frozen at one forward's scale, checked against its output — computed, or
the one the forward recorded (`output=`)."""

from __future__ import annotations

import pytest
import torch

from qkv.errors import QkvError
from qkv.explain.circuits.norms import linearise


@pytest.mark.parametrize("norm", [torch.nn.LayerNorm(8), torch.nn.RMSNorm(8, eps=1e-6)])
def test_a_recorded_output_gives_the_computed_outputs_form(norm):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in norm.parameters():
            p.normal_()
    x = torch.randn(3, 8)
    with torch.no_grad():
        recorded = norm(x)  # what a forward would have kept
    own, given = linearise(norm, x), linearise(norm, x, recorded)
    # the same numbers checked against: the very same form (linearise checked it rebuilds them)
    assert torch.equal(own.scale, given.scale) and torch.equal(own.shift, given.shift)
    assert own.centres == given.centres


def test_an_output_no_norm_form_rebuilds_is_refused():
    norm = torch.nn.LayerNorm(8)
    x = torch.randn(3, 8)
    with pytest.raises(QkvError, match="neither LayerNorm nor RMSNorm"):
        linearise(norm, x, torch.randn(3, 8))
