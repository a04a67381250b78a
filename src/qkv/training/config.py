"""Checks shared by every training configuration: types, finite floats, bounds, resumability.

A training config is a frozen dataclass (`qkv.translate.train.TrainConfig`,
`qkv.lm.train.LMTrainConfig`, `qkv.reader.train.ReaderTrainConfig`). A field declared with
`option` carries its facts once — help text and bounds — in its metadata:
`check_options` (called by `__post_init__`) checks the value against them and the CLI
(`qkv.cli.train_run.add_config_options`) builds the `--flag`'s help and checked type from
them; a subclass that only changes a default inherits its parent's facts (`option_of`).
Fields without one are checked by `check_int` / `check_float` in `__post_init__`.
`Schedule`'s `from_dict` (every trainer's, inherited) is `config_from_dict`, which
also refuses unknown keys and values of the wrong JSON type (`"steps": "abc"` in a config.json);
`to_dict` is the options by name. Messages name the CLI flag
(`--batch-size`), since that is where a user sets the value.

Examples:
    >>> check_float("lr", float("inf"), low=0.0, high=10.0, low_open=True)
    Traceback (most recent call last):
    ...
    qkv.errors.QkvError: --lr must be a finite number in (0.0, 10.0], got inf
"""

from __future__ import annotations

import math
import sys
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import get_type_hints

from qkv.errors import QkvError


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_int(name: str, value: object, *, low: int, high: int) -> None:
    """`value` must be an int (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise QkvError(f"{flag(name)} must be a whole number, got {value!r}")
    if not low <= value <= high:
        raise QkvError(f"{flag(name)} must be between {low} and {high}, got {value}")


def check_float(name: str, value: object, *, low: float, high: float, low_open: bool = False,
                high_open: bool = False) -> None:
    """`value` must be a finite real number in the interval (open ends as asked)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise QkvError(f"{flag(name)} must be a number, got {value!r}")
    inside = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not math.isfinite(value) or not inside:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise QkvError(f"{flag(name)} must be a finite number in {interval}, got {value}")


@dataclass(frozen=True)
class Option:
    """A training option's facts: what it means (the CLI's help) and the values it may take.
    `low`/`high` None: a bool, or with `text` a non-empty string such as a path (no
    bounds); the ends are closed unless `*_open`."""

    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    text: bool = False

    def check(self, name: str, value: object) -> None:
        """QkvError naming `--flag` unless `value` is of the default's kind and in bounds."""
        if self.text:
            if not isinstance(value, str) or not value:
                raise QkvError(f"{flag(name)} must be a non-empty string, got {value!r}")
        elif self.low is None:  # a yes/no option
            if not isinstance(value, bool):
                raise QkvError(f"{flag(name)} must be true or false, got {value!r}")
        elif isinstance(self.low, int) and isinstance(self.high, int):
            check_int(name, value, low=self.low, high=self.high)
        else:
            check_float(name, value, low=self.low, high=self.high, low_open=self.low_open,
                        high_open=self.high_open)


def option(default, help: str, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False):
    """A dataclass field with its facts in the metadata (see `Option`); ints are bounded
    by int `low`/`high`, floats by float ones, a bool or a string (a path) by none.

    Examples:
        >>> @dataclass(frozen=True)
        ... class C:
        ...     steps: int = option(10, "optimiser steps", low=1, high=100)
        >>> option_of(C, "steps").help
        'optimiser steps'
    """
    spec = Option(help, low, high, low_open, high_open, text=isinstance(default, str))
    return field(default=default, metadata={"option": spec})


def option_of(cls, name: str) -> Option | None:
    """The `Option` of field `name`: its own, or (a subclass that only changed the
    default) the nearest parent's; None for a field declared without one."""
    for klass in getattr(cls, "__mro__", type(cls).__mro__):
        f = getattr(klass, "__dataclass_fields__", {}).get(name)
        if f is not None and "option" in f.metadata:
            return f.metadata["option"]
    return None


def check_options(config) -> None:
    """Check every field of `config` that has an `Option` against it."""
    for f in fields(config):
        spec = option_of(type(config), f.name)
        if spec is not None:
            spec.check(f.name, getattr(config, f.name))


def config_from_dict(cls, d: object, *, where: str = "training options"):
    """Build `cls` from a dict: unknown keys and wrong JSON types are one clear error."""
    if not isinstance(d, dict):
        raise QkvError(f"{where} must be a JSON object, got {type(d).__name__}")
    hints = get_type_hints(cls)
    known = sorted(f.name for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING)
    values = {}
    for key, value in d.items():
        if key not in known:
            raise QkvError(f"unknown training option {key!r} (known: {', '.join(known)})")
        kind = hints[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind in (int, float, bool, str) and (type(value) is not kind):
            raise QkvError(f"{where}: {key!r} must be {kind.__name__}, got {value!r}")
        values[key] = value
    return cls(**values)


def changed_options(old, new, allowed: frozenset[str]) -> list[str]:
    """`name=old (now new)` for every field of two configs that differs and may not change."""
    return [f"{f.name}={getattr(old, f.name)!r} (now {getattr(new, f.name)!r})" for f in fields(old)
            if f.name not in allowed and getattr(old, f.name) != getattr(new, f.name)]


def check_threads(meta: dict, out: object, *, allow_inexact: bool) -> bool:
    """Is the resumed run still exact? A different torch thread count changes how sums are split,
    so the parameters would no longer be those of an uninterrupted run: refused unless
    `allow_inexact` (`--force`), which says so on stderr and records `"exact": false`."""
    import torch

    saved, now = meta.get("threads"), torch.get_num_threads()
    if saved is None or saved == now:
        return bool(meta.get("exact", True))
    if not allow_inexact:
        raise QkvError(f"--resume: {out} was trained with --threads {saved}, this run has {now}: "
                       f"the result would differ from an uninterrupted run; pass --threads "
                       f"{saved}, or --force to continue anyway (recorded as inexact)")
    print(f"qkv: warning: resuming {out} with --threads {now} instead of {saved}: the run is no "
          f"longer a pure function of its options (recorded in config.json as \"exact\": false)",
          file=sys.stderr)
    return False


@dataclass(frozen=True)
class Schedule:
    """The optimiser and bookkeeping options every trainer has — one place for their meaning,
    bounds and resumability. `qkv.translate.train.TrainConfig` and `qkv.lm.train.LMTrainConfig`
    extend it with their model and data options (and give some of these other defaults).

    Examples:
        >>> s = Schedule(steps=1000, warmup=100, lr=1e-3)
        >>> s.lr_at(49), s.lr_at(99), round(s.lr_at(999), 6)     # warm-up, peak, last step
        (0.0005, 0.001, 0.0001)
    """

    # Bounds: what a CPU run of these toy models can do, so a typo (--batch-size 100000000) is
    # refused at once instead of failing minutes later.
    # optimisation
    steps: int = option(2000, "optimiser steps in all", low=1, high=10**7)
    batch_size: int = option(32, "sequences per step", low=1, high=4096)
    lr: float = option(3e-3, "peak learning rate (after warm-up)", low=0.0, high=10.0, low_open=True)
    warmup: int = option(100, "linear warm-up steps", low=0, high=10**7)
    min_lr_ratio: float = option(0.1, "the cosine decay ends at lr × this", low=0.0, high=1.0)
    weight_decay: float = option(0.01, "AdamW weight decay", low=0.0, high=10.0)
    clip: float = option(1.0, "max gradient norm", low=0.0, high=1e6, low_open=True)
    # bookkeeping
    eval_every: int = option(100, "steps between evaluations (0: only at the end)", low=0, high=10**7)
    save_every: int = option(100, "steps between checkpoints (the last step is always saved)",
                             low=0, high=10**7)

    # Options that may change when resuming: they do not change the parameters' trajectory up to
    # the step where the first run stopped (a subclass adds its own evaluation sizes).
    RESUMABLE_CHANGES = frozenset({"steps", "eval_every", "save_every"})

    def __post_init__(self) -> None:
        check_options(self)

    @classmethod
    def from_dict(cls, d: dict):
        """The config a `config.json`'s options describe (`config_from_dict`: unknown
        keys and wrong JSON types are one error) — every trainer's config, as its own class."""
        return config_from_dict(cls, d)

    def to_dict(self) -> dict:
        """Every option by name, plain JSON (what `config.json` records)."""
        return asdict(self)

    def lr_at(self, step: int) -> float:
        """Learning rate for (0-based) `step`: linear warm-up to `lr`, cosine down to
        `lr · min_lr_ratio` (`qkv.training.loop.lr_at`)."""
        from qkv.training import loop

        return loop.lr_at(step, lr=self.lr, warmup=self.warmup, steps=self.steps,
                          min_lr_ratio=self.min_lr_ratio)
