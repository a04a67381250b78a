"""qkv.training.config: types, finite floats and bounds, named by their CLI flag."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from qkv.errors import QkvError
from qkv.training.config import (Schedule, changed_options, check_float, check_int, check_options,
                                 config_from_dict, option, option_of)


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


# -- an option's facts once: the dataclass field's metadata, read by the check and the CLI ---------

def _trainers():
    from qkv.lm.train import LMTrainConfig
    from qkv.reader.train import ReaderTrainConfig
    from qkv.translate.train import TrainConfig

    return [Schedule, TrainConfig, LMTrainConfig, ReaderTrainConfig]


def _edges(spec):
    """(values the option takes, values it refuses) at its bounds."""
    if isinstance(spec.low, int) and isinstance(spec.high, int):
        return [spec.low, spec.high], [spec.low - 1, spec.high + 1]
    inside = [spec.high] if spec.high_open is False else []
    inside += [spec.low] if not spec.low_open else []
    return inside, [x for x in (spec.low, spec.high) if x not in inside] + [float("nan")]


@pytest.mark.parametrize("cls", _trainers(), ids=lambda c: c.__name__)
def test_the_cli_parses_each_option_with_the_bounds_the_config_checks(cls):
    """Every field with an Option: the --flag's type takes exactly what the dataclass takes at
    both ends (before, the CLI's own bounds drifted: --batch-size to 10**7 against 4096)."""
    import argparse

    from qkv.cli.train_run import add_config_options

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_config_options(parser, f"{cls.__module__}:{cls.__qualname__}", helps={})
    checked = 0
    for f in fields(cls):
        spec = option_of(cls, f.name)
        if spec is None or spec.low is None:
            continue
        action = next(a for a in parser._actions if a.dest == f.name)
        inside, outside = _edges(spec)
        for value in inside:
            assert action.type(str(value)) == value
            spec.check(f.name, value)
        for value in outside:
            with pytest.raises(argparse.ArgumentTypeError):
                action.type(str(value))
            with pytest.raises(QkvError, match=f"--{f.name.replace('_', '-')} must be"):
                spec.check(f.name, value)
        assert spec.help in action.help or f.name in ("batch_size", "eval_every")  # a trainer's wording
        checked += 1
    assert checked >= 9  # Schedule's nine at least


def test_a_subclass_changing_a_default_keeps_the_option():
    from qkv.translate.train import TrainConfig

    assert TrainConfig().steps == 1200 and option_of(TrainConfig, "steps") is option_of(Schedule, "steps")
    with pytest.raises(QkvError, match=r"--clip must be a finite number in \(0.0, 1000000.0\], got 0"):
        TrainConfig(clip=0)
    with pytest.raises(QkvError, match="--steps must be between 1 and 10000000, got 0"):
        TrainConfig(steps=0)


def test_option_declares_help_and_bounds_once():
    @dataclass(frozen=True)
    class C:
        n: int = option(3, "how many", low=1, high=5)
        x: float = option(0.5, "a share", low=0.0, high=1.0, high_open=True)
        yes: bool = option(True, "whether")

        def __post_init__(self):
            check_options(self)

    assert C().n == 3
    with pytest.raises(QkvError, match="--n must be between 1 and 5, got 6"):
        C(n=6)
    with pytest.raises(QkvError, match=r"--x must be a finite number in \[0.0, 1.0\), got 1.0"):
        C(x=1.0)
    with pytest.raises(QkvError, match="--yes must be true or false, got 1"):
        C(yes=1)
    assert option_of(C, "x").help == "a share"
