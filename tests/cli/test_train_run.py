"""The run options and the repeat command every ``qkv train MODEL`` shares (qkv.cli.train_run)."""

from __future__ import annotations

import argparse
import shlex

import pytest

from qkv.cli import build_parser
from qkv.cli.train_run import given_options, run_command
from qkv.translate.train import TrainConfig


@pytest.mark.parametrize("model", ["lm", "translate"])
def test_every_train_command_takes_the_run_options(model):
    args = build_parser().parse_args(["train", model, "--out", "runs/x", "--resume", "--force",
                                      "--quiet", "--threads", "2"])
    assert (args.out, args.resume, args.slim, args.force, args.quiet, args.threads) == \
        ("runs/x", True, False, True, True, 2)
    defaults = build_parser().parse_args(["train", model])
    assert (defaults.out, defaults.resume, defaults.slim, defaults.threads) == (None, False, False, 1)


def test_the_command_parses_back_to_the_same_run():
    given = {"dropout": 0.0, "norm_first": False, "steps": 12, "lr": 0.002}
    args = argparse.Namespace(resume=False, slim=True, force=False, threads=3)
    line = run_command("translate", "runs/a b", args, given)
    again = build_parser().parse_args(shlex.split(line)[1:])
    assert (again.out, again.slim, again.threads) == ("runs/a b", True, 3)
    assert given_options(again, TrainConfig) == given  # only what was given, in field order
