"""The needle map's page — ``qkv needle --html`` (the result embedded) and ``qkv view``'s ``/needle``
(a saved ``qkv needle --json`` opened, checked by the server's ``NeedleMap.from_dict``): both
depth × length tables show the result's numbers to the digits shown, the exact value in each
cell's tooltip (a real browser); a saved file that is not a needle map is a one-line 4xx."""

from __future__ import annotations

import json

import httpx
import pytest
from view_checks import assert_shown

import qkv
from qkv.explain.probes.needle import NeedleMap, needle_map
from qkv.view.needle_page import needle_page

READY = "() => document.body.dataset.state === 'ready'"


@pytest.fixture(scope="module")
def saved():
    m = needle_map(qkv.load("lm"), lengths=[32, 48, 64], depths=[0.0, 0.5, 1.0], top=2)
    return json.loads(json.dumps(m.to_dict()))


def check_tables(page, d: dict) -> None:
    for name in ("accuracy", "attention"):
        header = page.eval_on_selector_all(f"#{name} tr:first-child th", "ths => ths.map(t => t.textContent)")
        assert header == ["depth \\ length", "32", "48", "64"]
        rows = page.eval_on_selector_all(f"#{name} tr th[scope=row]", "ths => ths.map(t => t.textContent)")
        assert rows == ["0%", "50%", "100%"]
        for i in range(3):
            for j in range(3):
                cell = page.locator(f'#{name} td[data-depth="{i}"][data-length="{j}"]')
                assert_shown(cell.text_content(), d[name][i][j], f"{name}[{i}][{j}]")
                tip = cell.get_attribute("title")
                assert tip.startswith(f"depth {rows[i]}, {d['lengths'][j]} tokens: {name} ")
                exact = tip.rsplit(" ", 1)[1]
                assert len(exact.split(".")[1]) == 6
                assert_shown(exact, d[name][i][j], f"{name}[{i}][{j}] (tooltip)")
    heads = ", ".join(f"L{layer} H{head}" for layer, head in d["heads"])
    assert page.locator("#heads").text_content() == f"({heads})"
    # "1 input per cell" / "8 inputs per cell", never "input(s)" (issue 41)
    samples = d["samples"]
    assert f"; {samples} input{'s' if samples != 1 else ''} per cell" in page.locator("#about").text_content()


def test_one_input_per_cell_is_singular(watched, saved, tmp_path):
    path = tmp_path / "needle.html"
    path.write_text(needle_page({**saved, "samples": 1}), encoding="utf-8")
    watched.page.goto(path.as_uri())
    watched.page.wait_for_function(READY)
    assert "; 1 input per cell," in watched.page.locator("#about").text_content()


def test_the_html_file(watched, saved, tmp_path):
    path = tmp_path / "needle.html"
    path.write_text(needle_page(saved), encoding="utf-8")
    watched.page.goto(path.as_uri())
    watched.page.wait_for_function(READY)
    check_tables(watched.page, saved)


def test_a_saved_needle_map_in_the_viewer(watched, served, saved, tmp_path):
    path = tmp_path / "needle.json"
    path.write_text(json.dumps(saved), encoding="utf-8")
    page = watched.page
    page.goto(served.url + "needle")
    page.wait_for_function(READY)
    page.set_input_files("#file", str(path))
    page.wait_for_function(READY)
    check_tables(page, saved)


def post(served, body) -> httpx.Response:
    return httpx.post(served.url + "api/needle", content=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})


def test_the_server_answers_the_map_it_was_sent(served, saved):
    r = post(served, saved)
    assert r.status_code == 200 and r.json() == saved
    assert NeedleMap.from_dict(r.json()).to_dict() == saved


@pytest.mark.parametrize("change, message", [
    ({"kind": "atlas"}, "this is not a saved needle-map: its kind is 'atlas'"),
    ({"lengths": []}, "needle map: lengths must be a list of at least 1 item(s), got []"),
    ({"lengths": [32, 1, 64]}, "needle map lengths[1]: lengths must be a whole number ≥ 2, got 1"),
    ({"depths": [0.0, 0.5, 1.5]}, "needle map: depths[2] must be a finite number in 0 … 1, got 1.5"),
    ({"accuracy": [[0.0, 0.0, 0.0]] * 2}, "needle map: accuracy must be a list of at least 3 item(s)"),
    ({"attention": [[0.0, 0.0]] * 3}, "needle map: attention[0] must be a list of a number per length (3)"),
    ({"heads": [[0, "1"]]}, "needle map: heads[0] must be [layer, head], two whole numbers, got [0, '1']"),
    ({"haystack": "hay"}, "needle map: haystack must be 'random' or 'text', got 'hay'"),
    ({"samples": 0}, "needle map: samples must be a whole number ≥ 1, got 0"),
])
def test_a_bad_saved_map_is_one_line_4xx(served, saved, change, message):
    r = post(served, {**saved, **change})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "body" and error["message"].startswith(message), error
    assert "\n" not in error["message"]
