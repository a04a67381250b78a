"""``qkv explain`` / ``qkv heads`` / ``qkv softmax-demo`` through the real CLI entry point:
output (numbers compared within their printed precision, ``tests/numbers_match.py``), --json
contents (checked against the model's traces and Hugging Face, and equal to the library's
``to_dict()``), --png files, and every user error as one line with exit code 2, naming flags."""

import json
import os
import subprocess
import sys

import pytest
import torch
from numbers_match import contains_line, line_matches

import qkv
import qkv.explain
from qkv.cli import main
from qkv.explain import forward

TEXT = "The dog found some pizza next to the baby and ate it"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_overview_text(capsys):
    code, out, err = run(capsys, "explain", TEXT, "--token", "it")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "model: all-MiniLM-L6-v2 (6 layers × 12 heads)"
    assert "ranked by: largest weight in the row" in out
    assert "highlighted: the 7 heads whose largest weight is on 'pizza'" in out
    rows = [l.split() for l in lines if l[:1] in (" ", "*") and "L" in l and "H" in l and "·" in l]
    assert len(rows) == 72
    starred = [r for r in rows if r[0] == "*"]
    assert len(starred) == 7 and all(r[6] == "pizza" for r in starred)
    assert line_matches("* 8 L3 H1 0.750", " ".join(starred[0][:5]))
    assert "where the largest weight lands (72 heads): [CLS] 41" in out


def test_overview_json_matches_traces(capsys, model):
    code, out, _ = run(capsys, "explain", TEXT, "--json", "--top", "2")
    d = json.loads(out)
    assert code == 0 and d["unit"] == "it" and d["unit_index"] == 12 and len(d["heads"]) == 72
    traced = forward.trace(model, TEXT, torch.tensor([12]))
    for h in d["heads"]:
        row = traced.weights(h["layer"])[h["head"], 0]
        assert h["weights"] == pytest.approx(row.double().tolist(), abs=1e-12)
        assert len(h["top"]) == 2 and h["max_weight"] == pytest.approx(float(row.max()))
    assert [h["max_weight"] for h in d["heads"]] == sorted((h["max_weight"] for h in d["heads"]),
                                                           reverse=True)


def test_step_by_step_json(capsys, model, hf):
    code, out, _ = run(capsys, "explain", TEXT, "--token", "it", "--layer", "3", "--head", "1", "--json")
    d = json.loads(out)
    assert code == 0
    for key in ("tokens", "layer", "head", "token_index", "x", "query", "keys", "values", "scores",
                "scaled", "weights", "output", "model_output", "max_abs_diff"):
        assert key in d, key
    assert (d["layer"], d["head"], d["token_index"]) == (3, 1, 12)
    assert len(d["keys"]) == len(d["values"]) == len(d["tokens"]) == 14
    assert d["max_abs_diff"] < 1e-5 and sum(d["weights"]) == pytest.approx(1.0, abs=1e-12)
    ids = forward.encode(model, TEXT).ids
    with torch.no_grad():
        att = hf(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    assert d["weights"] == pytest.approx(att[3][0, 1, 12].tolist(), abs=2e-6)
    w, v = torch.tensor(d["weights"]), torch.tensor(d["values"])
    assert (w @ v).tolist() == pytest.approx(d["model_output"], abs=1e-5)


def test_step_by_step_text(capsys):
    code, out, _ = run(capsys, "explain", TEXT, "--token", "it", "--layer", "3", "--head", "1")
    assert code == 0
    assert "q = x·W_Q + b_Q" in out and "(384)" in out and "/√32" in out
    assert "sum of the weights = 1.000000" in out
    diff = float(out.split("max |difference| = ")[1].split()[0])
    assert diff < 1e-5
    # j, token, k_j, q·k_j, /√32, weight, v_j
    assert contains_line(" 5   pizza   [0.082, -1.784, …, 0.287] (32)      27.938    4.9388   "
                         "0.7500   [0.753, -0.597, …, -1.286] (32)", out)


def test_words_and_split_word(capsys):
    text = "The pizzeria's owner found it"
    code, out, err = run(capsys, "explain", text, "--words", "--token", "pizzeria")
    assert code == 0 and "words: 0:[CLS] 1:The 2:pizzeria" in out
    assert "weights into a word are summed over its tokens, weights from a word averaged" in out
    code, out, err = run(capsys, "explain", text, "--token", "pizzeria", "--top", "1")
    assert code == 0 and "is 3 tokens (pi ##zz ##eria); using its last token" in err


def test_duplicate_word_note(capsys):
    code, out, err = run(capsys, "explain", "the cat saw the dog", "--token", "the", "--top", "1")
    assert code == 0
    assert err.strip() == ("qkv: note: 'the' occurs 2 times (tokens 1, 4); using the last (token 4). "
                           "Pick another with --token the@0 (occurrences count from 0) or --token 1.")
    assert "attention from token 4 'the'" in out
    code, out, err = run(capsys, "explain", "the cat saw the dog", "--token", "the@0", "--top", "1")
    assert err == "" and "attention from token 1 'the'" in out


def test_png_grid_and_head(capsys, tmp_path):
    import matplotlib.image

    grid, head = tmp_path / "grid.png", tmp_path / "head.png"
    assert run(capsys, "explain", TEXT, "--png", str(grid), "--json")[0] == 0
    assert run(capsys, "explain", TEXT, "--layer", "3", "--head", "1", "--png", str(head), "--words")[0] == 0
    assert matplotlib.image.imread(grid).shape[0] > 300
    assert matplotlib.image.imread(head).shape[1] > 300
    svg = tmp_path / "layer5.svg"
    assert run(capsys, "explain", TEXT, "--layer", "5", "--png", str(svg), "--top", "1")[0] == 0
    text = svg.read_text()
    assert "L5 H3" in text and "L0 H0" not in text and "on 'pizza'" in text
    assert sorted(os.listdir(tmp_path)) == ["grid.png", "head.png", "layer5.svg"]


def test_heads_pair_json(capsys):
    code, out, _ = run(capsys, "heads", TEXT, "--from", "it", "--to", "pizza", "--json")
    d = json.loads(out)
    assert code == 0 and len(d) == 72 and set(d[0]) == {"layer", "head", "weight"}
    assert [x["weight"] for x in d] == sorted((x["weight"] for x in d), reverse=True)
    assert (d[0]["layer"], d[0]["head"]) == (3, 1) and d[0]["weight"] == pytest.approx(0.75, abs=5e-3)


def test_heads_probe(capsys):
    code, out, _ = run(capsys, "heads", "--probe", "coref", "--top", "3")
    assert code == 0 and "coref probe: 49 sentences" in out
    assert "other than the pronoun itself" in out and "chance (a word picked at random)" in out
    assert "held out: the best head on the even-numbered sentences" in out
    code, out, _ = run(capsys, "heads", "--probe", "coref", "--json")
    d = json.loads(out)
    assert len(d) == 72 and d[0]["accuracy"] >= d[-1]["accuracy"] and d[0]["n"] == 49


def test_no_projection(capsys):
    code, out, _ = run(capsys, "explain", "The boy kicked the ball over the fence and then chased it.",
                       "--no-projection")
    assert code == 0 and "q = k = v = x" in out
    assert "overall: without projections 85/90 (94%)" in out


def test_no_projection_json_equals_hugging_face_by_hand(capsys, model, hf):
    """Both rates of every layer, recomputed from Hugging Face's hidden states and attention
    maps: without projections token i attends most to itself iff x_i·x_i ≥ x_i·x_j for all j;
    with them, iff a head's attention row peaks at i."""
    code, out, _ = run(capsys, "explain", TEXT, "--no-projection", "--json")
    d = json.loads(out)
    assert code == 0 and len(d["layers"]) == 6
    ids = torch.tensor([forward.encode(model, TEXT).ids])
    with torch.no_grad():
        ref = hf(input_ids=ids, output_hidden_states=True, output_attentions=True)
    t = ids.shape[1]
    for layer, got in zip(range(6), d["layers"]):
        x = ref.hidden_states[layer][0].double()  # (t, E): what BERT's layer projects (post-norm)
        gram = x @ x.T
        plain = [bool(gram[i, i] >= gram[i].max()) for i in range(t)]
        att = ref.attentions[layer][0]  # (h, t, s)
        learned = [[int(att[h, i].argmax()) == i for i in range(t)] for h in range(12)]
        assert got["no_projection_self"] == plain
        assert got["no_projection_self_rate"] == sum(plain) / t
        assert got["learned_self_per_head"] == pytest.approx([sum(r) / t for r in learned], abs=1e-12)
        assert got["learned_self_rate"] == pytest.approx(sum(map(sum, learned)) / (12 * t), abs=1e-12)


def test_softmax_demo(capsys):
    code, out, _ = run(capsys, "softmax-demo", "--dims", "4,1024", "--trials", "200", "--json")
    d = json.loads(out)
    assert code == 0 and [r["d"] for r in d] == [4, 1024]
    assert d[1]["max_weight_raw"] > d[0]["max_weight_raw"]


@pytest.mark.parametrize("argv, message", [
    (["explain", ""], "the text is empty ('')"),
    (["explain", "   "], "the text is empty ('   ')"),
    (["explain", TEXT, "--token", "cat"], "--token 'cat' is not a token of the text; the tokens are: 0:[CLS] 1:the"),
    (["explain", TEXT, "--token", "14"], "--token 14 is out of range: the text has 14 tokens (0–13)"),
    (["explain", TEXT, "--token", "it@1"], "--token 'it@1': 'it' occurs 1 time(s)"),
    (["explain", TEXT, "--layer", "6"], "--layer 6 is out of range: all-MiniLM-L6-v2 has 6 layers (0–5)"),
    (["explain", TEXT, "--layer", "-1", "--head", "0"], "--layer -1 is out of range"),
    (["explain", TEXT, "--layer", "0", "--head", "12"], "--head 12 is out of range: all-MiniLM-L6-v2 has 12 heads per layer (0–11)"),
    (["explain", TEXT, "--head", "1"], "--head 1 needs --layer"),
    (["explain", TEXT, "--top", "0"], "--top must be at least 1, got 0"),
    (["explain", TEXT, "--png", "/nonexistent-dir/x.png"], "the directory '/nonexistent-dir' does not exist"),
    (["explain", TEXT, "--png", "/proc/qkv-test.png"], "--png '/proc/qkv-test.png'"),
    (["explain", TEXT, "--png", "map.gif"], "must end in .png, .svg or .pdf"),
    (["explain", TEXT, "--model", "nosuchmodel"], "nosuchmodel"),
    (["heads", TEXT, "--from", "it"], "--to is needed"),
    (["heads", TEXT, "--from", "it", "--to", "cat"], "--to 'cat' is not a word of the text"),
    (["heads", "--probe", "winograd"], "unknown probe 'winograd'; known probes: coref, induction, previous-token"),
    (["heads"], "give a TEXT with --from/--to"),
    (["heads", "--probe", "coref", "--model", "lm"], "--probe coref cannot run on qkv-lm: its tokenizer"),
    (["softmax-demo", "--dims", "4,x"], "--dims must be comma-separated whole numbers from 1 to 16384, got 'x'"),
])
def test_user_errors_are_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("qkv: error: ") and err.count("\n") == 1, err
    assert message in err


def test_subprocess_errors_have_no_traceback(tmp_path):
    for argv in (["explain", TEXT, "--token", "cat"], ["explain", TEXT, "--png", "/proc/x/y.png"]):
        r = subprocess.run([sys.executable, "-m", "qkv", *argv], capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.startswith("qkv: error: ") and r.stderr.count("\n") == 1
    assert os.listdir(tmp_path) == []


def test_subprocess_overview_is_plain_text():
    r = subprocess.run([sys.executable, "-m", "qkv", "explain", TEXT, "--layer", "3", "--top", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "\x1b[" not in r.stdout  # no colour codes in a pipe
    assert contains_line("*      2   L3 H1    0.750      1.41   pizza 0.750", r.stdout)


def test_translation_model_dir_is_dispatched(capsys, tmp_path):
    """A directory whose config.json says qkv-translation is read by qkv.load as a translation
    checkpoint, which reports what is wrong with it as a one-line error (not the BERT/GPT-2
    loader's "model_type is not supported")."""
    (tmp_path / "config.json").write_text('{"model_type": "qkv-translation"}')
    code, out, err = run(capsys, "explain", "the red apple", "--model", str(tmp_path))
    assert code == 2 and err.startswith("qkv: error: ") and err.count("\n") == 1
    assert "unsupported format_version" in err and "is not supported" not in err
    from qkv.errors import QkvError
    from qkv.models import load

    with pytest.raises(QkvError) as error:  # the library says the same
        load(str(tmp_path))
    assert err == f"qkv: error: {error.value}\n"


def test_heads_on_a_translation_model_says_what_to_use_instead(capsys):
    assert main(["heads", "the cat is red", "--from", "cat", "--to", "red", "--model", "translate"]) == 2
    err = capsys.readouterr().err
    assert "is a translation model" in err and "qkv explain TEXT --model translate" in err


# -- the CLI is the library plus printing -----------------------------------------------------------
LIBRARY_CALLS = [
    (["explain", TEXT, "--json"], lambda m: qkv.explain.explain(m, TEXT)),
    (["explain", TEXT, "--token", "the@0", "--to", "dog", "--top", "1", "--layer", "2", "--json"],
     lambda m: qkv.explain.explain(m, TEXT, token="the@0", to="dog", top=1, layer=2)),
    (["explain", "The pizzeria's owner", "--words", "--token", "pizzeria", "--json"],
     lambda m: qkv.explain.explain(m, "The pizzeria's owner", token="pizzeria", words=True)),
    (["explain", TEXT, "--token", "it", "--layer", "3", "--head", "1", "--json"],
     lambda m: qkv.explain.explain_head(m, TEXT, token="it", layer=3, head=1)),
    (["explain", TEXT, "--no-projection", "--layer", "4", "--json"],
     lambda m: qkv.explain.no_projection(m, TEXT, layer=4)),
]


@pytest.mark.parametrize("argv, call", LIBRARY_CALLS, ids=[" ".join(a[2:]) for a, _ in LIBRARY_CALLS])
def test_json_is_the_library_results_to_dict(capsys, model, argv, call):
    code, out, _ = run(capsys, *argv)
    assert code == 0
    d = call(model).to_dict()
    assert json.loads(out) == json.loads(json.dumps(d, allow_nan=False))


def test_heads_json_is_the_library_results_heads(capsys, model):
    code, out, _ = run(capsys, "heads", TEXT, "--from", "it", "--to", "pizza", "--json")
    assert code == 0
    assert json.loads(out) == qkv.explain.heads(model, TEXT, source="it", target="pizza").to_dict()["heads"]


def test_softmax_demo_json_is_the_library_result(capsys):
    from qkv.explain.saturation import saturation

    code, out, _ = run(capsys, "softmax-demo", "--dims", "8,32", "--trials", "50", "--json")
    assert code == 0 and json.loads(out) == [r.to_dict() for r in saturation([8, 32], trials=50)]


@pytest.mark.parametrize("argv, library, message", [
    (["--token", "cat"], dict(token="cat"), "--token 'cat' is not a token of the text"),
    (["--token", "the", "--to", "99"], dict(token="the", to="99"), "--to 99 is out of range"),
    (["--layer", "6"], dict(layer=6), "--layer 6 is out of range"),
    (["--top", "0"], dict(top=0), "--top must be at least 1, got 0"),
])
def test_the_library_names_arguments_the_cli_names_flags(capsys, model, argv, library, message):
    """One message, two spellings: the library's starts with the argument's name, the CLI's with
    its flag, and the rest is the same."""
    with pytest.raises(qkv.explain.ArgumentError) as e:
        qkv.explain.explain(model, TEXT, **library)
    flag, library_message = message.split()[0], str(e.value)
    assert library_message.startswith(e.value.argument + " ") and flag == "--" + e.value.argument
    code, out, err = run(capsys, "explain", TEXT, *argv)
    assert code == 2 and err.startswith(f"qkv: error: {message}")
    assert err == f"qkv: error: {flag}{library_message[len(e.value.argument):]}\n"


def test_notes_name_flags(capsys, model):
    code, _, err = run(capsys, "heads", "the cat saw the dog", "--from", "the", "--to", "cat")
    assert code == 0 and "Pick another with --from the@0 (occurrences count from 0) or --from 1." in err
    ranking = qkv.explain.heads(model, "the cat saw the dog", source="the", target="cat")
    assert "Pick another with source the@0 (occurrences count from 0) or source 1." in str(ranking.notes[0])


@pytest.mark.parametrize("probe", ["induction", "previous-token", "coref"])
def test_every_probe_refuses_a_nan_model_naming_layer_and_head(capsys, monkeypatch, probe):
    """issue 23, item 5: a NaN model passed the induction and previous-token probes (printing nan)."""
    import torch

    import qkv
    import qkv.cli.explain as cli_explain

    model = qkv.load("lm" if probe != "coref" else "minilm")
    d = model.layers[1].self_attn.head_dim
    with torch.no_grad():
        model.layers[1].self_attn.q_proj.weight[d:2 * d] = float("nan")  # head 1's queries
    monkeypatch.setattr(cli_explain, "load_model", lambda args: model)
    for json_flag in ([], ["--json"]):
        code = main(["heads", "--probe", probe, *json_flag])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.count("\n") == 1, (out[:200], err)
        assert "computes NaN at layer 1, head 1" in err, err
