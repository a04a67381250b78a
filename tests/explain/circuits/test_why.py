"""``qkv why`` through the real CLI entry point: the table, --json equal to the library's
``to_dict()``, --png written, and a bad key as one line with exit code 2 naming --to."""

import json

from qkv.cli import main

LM_TEXT = "baka bela dima fona baka bela dima fona"
ARGS = ("why", LM_TEXT, "--model", "lm", "--token", "7", "--to", "4", "--layer", "1", "--head", "0")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


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
