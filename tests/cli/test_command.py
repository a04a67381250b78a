"""The one command pattern (cli/command.py) and what every command that loads a model takes:
``--device`` and ``--dtype`` (issue 42 item 4), checked by the parser and passed to qkv.load."""

from __future__ import annotations

import argparse
import functools
import json

import pytest
import torch

from qkv.cli import build_parser, main
from qkv.cli.command import Command, load_model, run

PARSER = build_parser()
COMMANDS = PARSER._subparsers._group_actions[0].choices
LOADING = ("explain", "heads", "faithfulness", "needle", "atlas", "why", "show", "view")
TEXT = "The dog found some pizza next to the baby and ate it"


def call(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", ["why", "atlas", "needle", "faithfulness", "show"])
def test_a_result_command_is_its_arguments_and_one_command(name):
    """No command writes the steps again: its func runs its Command (check → load → progress →
    result → show)."""
    func = COMMANDS[name].get_default("func")
    assert isinstance(func, functools.partial) and func.func is run
    assert isinstance(func.args[0], Command)


@pytest.mark.parametrize("name", LOADING)
def test_every_command_that_loads_a_model_takes_device_and_dtype(name):
    dests = {a.dest: a for a in COMMANDS[name]._actions}
    assert {"model", "device", "dtype"} <= dests.keys(), name
    assert list(dests["dtype"].choices) == ["float32", "bfloat16", "float16", "float64"]


def test_device_and_dtype_reach_qkv_load():
    model = load_model(argparse.Namespace(model="lm", device="cpu", dtype="float64"))
    tensors = [*model.parameters(), *model.buffers()]
    assert {t.device.type for t in tensors} == {"cpu"}
    # the weights; buffers such as RoPE's frequencies keep the precision the library gives them
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    kept = load_model(argparse.Namespace(model="lm"))  # neither given: the checkpoint's dtype
    assert next(kept.parameters()).dtype == torch.float32


def test_a_command_runs_in_the_dtype_asked(capsys):
    """The float64 run's own error bound is float64's (~1e-13, against ~1e-5 stored float32: the
    dtype reached the forward), and the two scores agree to float32's rounding: a few ulp of
    the terms summed (64 ulp of Σ|term| leaves room for the layers the score went through)."""
    argv = ["why", TEXT, "--model", "reader", "--token", "it", "--to", "pizza", "--layer", "1",
            "--head", "0", "--json"]
    code32, out32, _ = call(capsys, *argv)
    code64, out64, _ = call(capsys, *argv, "--dtype", "float64")
    assert code32 == code64 == 0
    a, b = json.loads(out32), json.loads(out64)
    assert b["bound"] < 1e-9 < a["bound"]
    scale = sum(abs(t) for row in a["terms"] for t in row)
    assert abs(a["score"] - b["score"]) <= 64 * torch.finfo(torch.float32).eps * scale


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_an_unavailable_device_is_one_line_before_anything_loads(capsys):
    code, out, err = call(capsys, "why", TEXT, "--to", "pizza", "--layer", "0", "--head", "0",
                          "--device", "cuda")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("qkv: error: --device must be a device this machine has: cuda is not")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the device tool lends one)")
def test_a_command_on_cuda_gives_the_cpu_numbers(capsys):
    argv = ["why", TEXT, "--token", "it", "--to", "pizza", "--layer", "3", "--head", "1", "--json"]
    code, cpu, _ = call(capsys, *argv)
    code_gpu, gpu, _ = call(capsys, *argv, "--device", "cuda")
    assert code == code_gpu == 0
    a, b = json.loads(cpu), json.loads(gpu)
    # float32 on two devices: the sums round differently, by a few ulp of the terms summed
    scale = sum(abs(t) for row in a["terms"] for t in row)
    assert abs(a["score"] - b["score"]) <= 64 * torch.finfo(torch.float32).eps * scale


# -- issue 41 item 9: the CLI's small things -------------------------------------------------------
@pytest.mark.parametrize("name", ["needle", "atlas"])
def test_needle_and_atlas_model_help_lists_decoders_only(name):
    model = next(a for a in COMMANDS[name]._actions if a.dest == "model")
    help = str(model.help)
    assert help.startswith("a decoder: ") and "lm" in help and "reader" in help
    assert "minilm" not in help and "translate" not in help


def test_view_file_on_a_short_model_names_the_cli_way_not_pythons(capsys, tmp_path):
    book = tmp_path / "book.txt"
    book.write_text("the cat sat on the mat. " * 200)
    code, out, err = call(capsys, "view", "--file", str(book), "--model", "minilm", "--port", "0",
                          "--no-browser")
    assert code == 2 and err.count("\n") == 1, err
    assert "takes at most 512" in err and "--model reader" in err and "truncate" not in err


def test_one_needle_input_is_singular():
    from rich.console import Console

    from qkv.explain.rendering.render_retrieval import render_needle
    import qkv

    result = qkv.explain.needle_map(qkv.load("lm"), lengths=[30], depths=[0.5], samples=1, top=1)
    console = Console(record=True, width=200)
    render_needle(console, result)
    text = console.export_text()
    assert "1 input per cell" in text and "input(s)" not in text
