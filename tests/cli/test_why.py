"""``qkv why`` through the real CLI entry point: the table, --json equal to the library's
``to_dict()``, --png written, a bad key as one line with exit code 2 naming --to; and
``--html FILE``: the viewer's "why this weight" panel as one self-contained page holding the
library's ``to_dict()`` — on an error no file is written (an old one is left as it was), one line
and exit code 2. (The page drawn in a browser: tests/view/test_why_panel.py.)"""

from __future__ import annotations

import json
import re

import pytest

import qkv
from qkv.view.answers import labelled
from qkv.cli import main
from qkv.explain import score_attribution

LM_TEXT = "baka bela dima fona baka bela dima fona"
ARGS = ("why", LM_TEXT, "--model", "lm", "--token", "7", "--to", "4", "--layer", "1", "--head", "0")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def embedded(page: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="qkv-data">(.*?)</script>',
                                page, re.S)[1])


def test_the_page_holds_the_librarys_result_and_nothing_from_outside(capsys, tmp_path):
    path = tmp_path / "why.html"
    code, out, err = run(capsys, *ARGS, "--html", str(path), "--json")
    assert code == 0 and err == f"wrote {path}\n"
    want = score_attribution(qkv.load("lm"), LM_TEXT, layer=1, head=0, token=7, key=4).to_dict()
    assert json.loads(out) == want  # --json still prints the result
    page = path.read_text(encoding="utf-8")
    data = embedded(page)
    [[endpoint, fields, answer]] = data["answers"]
    assert (endpoint, fields) == ("why", {"token": 7, "key": 4, "layer": 1, "head": 0})
    # the page's answer is the library's, with its tokens' display text beside them
    assert answer == labelled(dict(want)) and data["state"]["view"] == "score-attribution"
    assert "connect-src 'none'" in page and not re.search(r"""(src|href)=["']?https?:""", page)


@pytest.mark.parametrize("argv, says", [
    (("--to", "zzz"), "--to 'zzz' is not a token of the text"),
    (("--to", "9"), "--to 9 is out of range"),
    (("--to", "8"), "--to '8' (position 8) is masked for the query at 7"),
    (("--layer", "2"), "--layer 2 is out of range"),
])
def test_an_error_writes_no_file_and_leaves_an_old_one(capsys, tmp_path, argv, says):
    fresh, old = tmp_path / "fresh.html", tmp_path / "old.html"
    old.write_text("before", encoding="utf-8")
    args = list(ARGS)
    flag = args.index(argv[0])
    args[flag + 1] = argv[1]
    for path in (fresh, old):
        code, out, err = run(capsys, *args, "--html", str(path))
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert says in err, err
    assert not fresh.exists() and old.read_text(encoding="utf-8") == "before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.html"]  # no temporary file left


def test_a_missing_directory_is_refused_before_the_model_runs(capsys, tmp_path):
    code, out, err = run(capsys, *ARGS, "--html", str(tmp_path / "no" / "why.html"))
    assert code == 2 and out == ""
    assert err.startswith("qkv: error: --html ") and "does not exist" in err and err.count("\n") == 1


def test_the_table_ranks_the_largest_terms(capsys):
    code, out, err = run(capsys, *ARGS, "--top", "3")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "model: qkv-lm · layer 1 head 0 · query 7:dima → key 4:fona"
    assert lines[3].split()[:3] == ["1", "embed.token", "L0.H1"]  # the previous-token head's write
    assert len([line for line in lines if line.strip()[:1].isdigit()]) == 3


def test_json_is_the_library_result(capsys, tmp_path):
    import qkv
    from qkv.explain import score_attribution

    png = tmp_path / "terms.png"
    code, out, err = run(capsys, *ARGS, "--json", "--png", str(png))
    assert code == 0 and png.stat().st_size > 0 and "wrote" in err
    got = json.loads(out)
    want = score_attribution(qkv.load("lm"), LM_TEXT, layer=1, head=0, token=7, key=4).to_dict()
    assert got["kind"] == "score-attribution" and got["terms"] == want["terms"]
    assert abs(got["terms_sum"] - got["score"]) <= got["bound"]


def test_a_bad_key_is_one_line_naming_the_flag(capsys):
    code, out, err = run(capsys, *ARGS[:-6], "--to", "zzz", "--layer", "1", "--head", "0")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--to" in err


def test_an_mla_layer_prints_its_content_and_rope_parts(capsys, tmp_path):
    """A tiny random DeepSeek-V3 (tests/hf/hybrids.py): the table's header says the score's
    content and RoPE parts, and --json is the library's result with its `latent` split."""
    pytest.importorskip("transformers")
    from hybrids import save_hybrid

    save_hybrid("deepseek_v3", tmp_path)
    capsys.readouterr()  # save_pretrained's progress bar
    args = ("why", "the cat sat on the mat", "--model", str(tmp_path), "--token", "5", "--to", "2",
            "--layer", "1", "--head", "0")
    code, out, err = run(capsys, *args)
    assert code == 0 and err == "", err
    [line] = [line for line in out.splitlines() if line.startswith("latent attention:")]
    assert re.fullmatch(r"latent attention: content q_nope·k_nope = [+-][0-9.]+ · position "
                        r"RoPE\(q_rope\)·RoPE\(k_rope\) = [+-][0-9.]+", line), line
    code, out, err = run(capsys, *args, "--json")
    got = json.loads(out)
    want = score_attribution(qkv.load(tmp_path), "the cat sat on the mat", layer=1, head=0, token=5,
                             key=2).to_dict()
    assert code == 0 and got["latent"] == want["latent"] and got["terms"] == want["terms"]
    assert abs(got["latent"]["content"] + got["latent"]["position"] - got["score"]) <= got["bound"]
