"""qkv.training.config: types, finite floats and bounds, named by their CLI flag."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from qkv.errors import QkvError
from qkv.training.config import changed_options, check_float, check_int, config_from_dict


@dataclass(frozen=True)
class Cfg:
    steps: int = 10
    lr: float = 0.1
    tied: bool = True


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 0.0, 11.0, "1", None])
def test_check_float_refuses(value):
    with pytest.raises(QkvError, match="--lr must be a"):
        check_float("lr", value, low=0.0, high=10.0, low_open=True)


@pytest.mark.parametrize("value", [0, 101, 1.5, True, "3"])
def test_check_int_refuses(value):
    with pytest.raises(QkvError, match="--batch-size must be"):
        check_int("batch_size", value, low=1, high=100)


def test_from_dict_checks_keys_and_json_types():
    assert config_from_dict(Cfg, {"steps": 3, "lr": 1}) == Cfg(steps=3, lr=1.0)
    with pytest.raises(QkvError, match="unknown training option 'step'"):
        config_from_dict(Cfg, {"step": 3})
    with pytest.raises(QkvError, match="'steps' must be int, got 'abc'"):
        config_from_dict(Cfg, {"steps": "abc"})
    with pytest.raises(QkvError, match="'tied' must be bool, got 1"):
        config_from_dict(Cfg, {"tied": 1})
    with pytest.raises(QkvError, match="must be a JSON object, got list"):
        config_from_dict(Cfg, [])


def test_changed_options():
    assert changed_options(Cfg(), Cfg(steps=20, lr=0.2), frozenset({"steps"})) == ["lr=0.1 (now 0.2)"]
