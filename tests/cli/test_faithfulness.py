"""``qkv faithfulness`` and ``qkv heads --probe P --ablate``: the table, the JSON, the picture,
and one-line errors with exit 2."""

from __future__ import annotations

import json

import pytest

from qkv.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["faithfulness", "--model", "lm", "--probe", "copying"],
     "qkv: error: unknown --probe 'copying'; known: induction, previous-token, coref"),
    (["faithfulness", "--model", "lm", "--probe", "induction", "--mode", "half"],
     "qkv: error: unknown --mode 'half'; known: zero, mean"),
    (["faithfulness", "--model", "lm", "--probe", "coref"],
     "qkv: error: --probe coref cannot run on qkv-lm: its tokenizer does not split"),
    (["faithfulness", "--model", "minilm", "--probe", "induction"],
     "qkv: error: --probe induction measures next-token loss; all-MiniLM-L6-v2 is an encoder"),
    (["faithfulness", "--model", "lm", "--probe", "induction", "--sequences", "0"],
     "qkv: error: --sequences must be at least 1, got 0"),
    (["heads", "--ablate", "the cat", "--to", "cat"],
     "qkv: error: --ablate needs --probe"),
    *[(["faithfulness", "--model", "translate", "--probe", probe],
       f"qkv: error: --probe {probe} does not apply to translate (shipped): an encoder-decoder "
       f"supports no probe (induction, previous-token, coref read the heads of a self-attention "
       f"model); explain its cross-attention instead") for probe in ("coref", "induction")],
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.startswith(message) and err.count("\n") == 1


def test_faithfulness_json_and_png(capsys, tmp_path):
    png = tmp_path / "effects.png"
    code, out, err = run(capsys, "faithfulness", "--model", "lm", "--probe", "previous-token",
                         "--sequences", "2", "--json", "--png", str(png))
    assert code == 0, err
    d = json.loads(out)
    assert d["kind"] == "faithfulness" and d["probe"] == "previous-token"
    assert len(d["effects"]) == 2 and len(d["effects"][0]) == 2
    methods = {m["method"]: m for m in d["methods"]}
    assert methods["weight"]["per"] == "head" and methods["weight"]["n"] == 4
    assert methods["rollout"]["per"] == "layer" and methods["rollout"]["n"] == 2
    assert "flow" in d["skipped"]  # 51-token sequences: past flow's 24
    assert png.stat().st_size > 1000 and "wrote" in err


def test_heads_ablate_prints_effects_beside_scores(capsys):
    code, out, err = run(capsys, "heads", "--probe", "induction", "--model", "lm", "--ablate")
    assert code == 0, err
    assert "effect = metric with the head ablated − clean" in out
    assert out.count(" L1 H") == 2 and out.count(" L0 H") == 2


def test_a_transformers_encoder_decoder_supports_no_probe(capsys, tmp_path):
    """A BART directory: no probe applies (before: AttributeError tracebacks), said in one line;
    the library says the same and lists no probe for it."""
    pytest.importorskip("transformers")
    import qkv
    from qkv.explain.causal.faithfulness import faithfulness
    from qkv.explain.causal.head_effects import probes_for
    from qkv.explain.wording import ArgumentError
    from seq2seq_dirs import save

    path, _ = save(tmp_path, "bart")
    capsys.readouterr()
    for probe in ("coref", "previous-token"):
        code, out, err = run(capsys, "faithfulness", "--model", path, "--probe", probe)
        # the last line: transformers' own loading bar may come before it (issue 31, minor)
        assert code == 2 and out == "" and "Traceback" not in err, err
        assert err.strip().splitlines()[-1].startswith(
            f"qkv: error: --probe {probe} does not apply to bart: an encoder-decoder supports no "
            f"probe"), err
    model = qkv.load(path)
    with pytest.raises(ArgumentError, match="^probe coref does not apply to bart") as e:
        faithfulness(model, "coref")
    assert e.value.argument == "effects_probe" and probes_for(model) == []


def test_progress_is_told_and_drawn_on_a_terminal_only():
    """The library tells each stage's progress (issue 32: coref ran 4 minutes without a word);
    Bars draws it on a terminal, and nothing under --json or in a pipe."""
    import io

    import qkv
    from rich.console import Console

    from qkv.cli.progress import Bars
    from qkv.explain.causal.faithfulness import faithfulness

    told = []
    methods = ["weight", "rollout", "flow"]  # flow is skipped on 51-token sequences: still a step
    faithfulness(qkv.load("lm"), "previous-token", methods=methods, sequences=2,
                 progress=lambda *a: told.append(a))
    ablating = [a for a in told if a[0] == "ablating"]
    L, H = 2, 2
    assert ablating[-1] == ("ablating", 1 + L * H + L, 1 + L * H + L)  # clean + heads + layers
    assert [d for _, d, _ in ablating] == sorted(d for _, d, _ in ablating)
    assert [a for a in told if a[0] == "methods"] == [("methods", i, 3) for i in range(4)]
    assert told.index(ablating[-1]) < told.index(("methods", 0, 3))  # ablations first

    for enabled, terminal, drawn in ((True, True, True), (False, True, False), (True, False, False)):
        out = io.StringIO()
        with Bars(enabled=enabled, console=Console(file=out, force_terminal=terminal)) as bars:
            for stage, done, total in told:
                bars(stage, done, total)
        assert ("ablating" in out.getvalue() and "3/3" in out.getvalue()) == drawn, out.getvalue()
