"""``qkv needle`` and ``qkv atlas``: the tables, the JSON, the picture, and one-line errors with
exit 2 before any model runs where the flags alone are wrong."""

from __future__ import annotations

import json

import pytest

from qkv.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_needle_table_json_and_png(capsys, tmp_path):
    png = tmp_path / "n.png"
    page = tmp_path / "n.html"
    code, out, err = run(capsys, "needle", "--model", "lm", "--lengths", "30,50", "--depths", "0,100",
                         "--top", "2", "--png", str(png), "--html", str(page))
    assert code == 0 and "needle accuracy" in out and png.stat().st_size > 0
    shown = embedded(page)  # the viewer's needle page, the map's to_dict() in it
    assert shown["kind"] == "needle-map" and [len(r) for r in shown["accuracy"] + shown["attention"]] == [2] * 4
    code, out, _ = run(capsys, "needle", "--model", "lm", "--lengths", "30", "--depths", "50", "--json")
    d = json.loads(out)
    assert code == 0 and d["kind"] == "needle-map" and d["depths"] == [0.5] and len(d["accuracy"]) == 1


def test_atlas_json(capsys, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("baka bela dima fona gisa doma feta " * 10)
    code, out, _ = run(capsys, "atlas", "--model", "lm", "--file", str(corpus), "--json",
                       "--samples", "2", "--contexts", "1")
    d = json.loads(out)
    assert code == 0 and d["kind"] == "atlas" and len(d["heads"]) == 4
    assert len(d["heads"][0]["contexts"]) == 1
    page = tmp_path / "atlas.html"
    code, out, err = run(capsys, "atlas", "--model", "lm", "--file", str(corpus), "--samples", "2",
                         "--html", str(page))
    assert code == 0 and "previous-token" in out and f"wrote {page}" in err
    shown = embedded(page)  # the viewer's atlas page, the atlas's to_dict() in it
    assert shown["kind"] == "atlas" and len(shown["heads"]) == 4 and len(shown["heads"][0]["contexts"]) == 3


def embedded(page) -> dict:
    """The result a page written by --html shows: its <script id="qkv-data"> JSON."""
    import re

    text = page.read_text(encoding="utf-8")
    assert '<script src=' not in text and "connect-src 'none'" in text  # self-contained, offline
    return json.loads(re.search(r'<script type="application/json" id="qkv-data">(.*?)</script>', text, re.S)[1])


@pytest.mark.parametrize("argv, message", [
    (["needle", "--model", "lm", "--lengths", "30,99"],
     "qkv: error: --lengths 99 is more tokens than qkv-lm takes (65)"),
    (["needle", "--model", "lm", "--lengths", "30", "--depths", "101"],
     "qkv: error: --depths must be comma-separated whole numbers from 0 to 100, got '101'"),
    (["needle", "--model", "lm", "--lengths", "x"],
     "qkv: error: --lengths must be comma-separated whole numbers from 2 to 131072, got 'x'"),
    (["needle", "--model", "minilm", "--lengths", "30"],
     "qkv: error: retrieval needs a decoder that predicts the next token"),
    (["needle", "--model", "lm", "--lengths", "30", "--top", "9"],
     "qkv: error: --top must be a whole number of heads in 1–4, got 9"),
    (["atlas", "--model", "lm", "--file", "/nonexistent/corpus.txt"],
     "qkv: error: [Errno 2] No such file or directory"),
    (["atlas", "--model", "lm", "--file", "CORPUS", "--window", "99"],
     "qkv: error: --window must be a whole number of tokens in 3–65, got 99"),
    (["atlas", "--model", "lm", "--file", "CORPUS", "--html", "/nonexistent-dir/x/a.html"],
     "qkv: error: --html '/nonexistent-dir/x/a.html': the directory '/nonexistent-dir/x' does not exist"),
    (["atlas", "--model", "minilm", "--file", "CORPUS"],
     "qkv: error: retrieval needs a decoder that predicts the next token"),
])
def test_one_line_errors(capsys, tmp_path, argv, message):
    corpus = tmp_path / "c.txt"
    corpus.write_text("baka bela dima")
    argv = [str(corpus) if a == "CORPUS" else a for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.startswith(message) and err.count("\n") == 1, err


def test_heads_probe_retrieval_ablate_scores_are_the_probes(capsys):
    import qkv
    from qkv.explain.probes.retrieval import retrieval_probe

    code, out, _ = run(capsys, "heads", "--probe", "retrieval", "--ablate", "--model", "lm", "--json")
    d = json.loads(out)
    assert code == 0 and d["probe"] == "retrieval"
    assert d["scores"] == retrieval_probe(qkv.load("lm")).scores.tolist()
