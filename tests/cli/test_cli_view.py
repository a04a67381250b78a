"""``qkv view``: flags checked before anything runs, a port in use is one line, Ctrl-C stops the
server cleanly, ``--html`` writes one self-contained file."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from qkv.cli import main


def test_html_needs_a_text(capsys):
    assert main(["view", "--html", "out.html"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qkv: error: --html needs a TEXT") and "\n" not in err


def test_html_into_a_missing_directory(capsys, tmp_path):
    assert main(["view", "the cat", "--html", str(tmp_path / "no" / "x.html")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_port_out_of_range(capsys):
    assert main(["view", "--port", "70000", "--no-browser"]) == 2
    assert capsys.readouterr().err.strip() == "qkv: error: --port must be at most 65535, got 70000"


def test_a_port_in_use_is_one_line_and_another_host_warns(capsys):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["view", "--port", str(port), "--no-browser", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "qkv: warning: listening on 0.0.0.0" in err
    assert f"qkv: error: port {port} on 0.0.0.0 is in use; pick another with --port N" in err


def test_html_for_the_translation_model(capsys, tmp_path):
    path = tmp_path / "fr.html"
    assert main(["view", "the red apple is next to the black cats", "--model", "translate",
                 "--html", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    page = path.read_text(encoding="utf-8")
    assert '"kind":"cross"' in page and "la pomme rouge" in page


def test_ctrl_c_stops_the_server_cleanly():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "qkv", "view", "the cat sat", "--port", "0",
                             "--no-browser", "--model", "translate"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert select.select([proc.stdout], [], [], 120)[0], "qkv view printed no URL in 120 s"
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, f"no URL in {line!r}"
        url = url[0]
        deadline = time.monotonic() + 60
        while True:  # the URL is printed just before uvicorn starts listening
            try:
                with urllib.request.urlopen(url + "api/info", timeout=5) as r:
                    assert r.status == 200
                    info = json.loads(r.read())
                break
            except OSError:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.1)
        assert info["default_text"] == "the cat sat"  # the bare URL opens at TEXT (issue 23)
        rebound = urllib.request.Request(url, headers={"Host": "attacker.example"})
        try:  # DNS rebinding: a name that is not this server's is refused (issue 23, item 10)
            urllib.request.urlopen(rebound, timeout=5)
            raise AssertionError("a foreign Host was served")
        except urllib.error.HTTPError as e:
            assert e.code == 403
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # a failed assertion above: no server is left on the port
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "qkv view: stopped" in err and "Traceback" not in err


# -- qkv view --file: a long text; every bad file is one line, before any server starts -------------
def _file_error(capsys, args) -> str:
    assert main(["view", "--no-browser", "--port", "0", *args]) == 2
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.startswith("qkv: error:")]
    assert len(err) == 1 and "serving" not in captured.out, captured
    return err[0]


def test_file_missing_empty_or_not_utf8(capsys, tmp_path):
    assert _file_error(capsys, ["--file", str(tmp_path / "no.txt")]).endswith("no.txt is missing")
    (tmp_path / "empty.txt").write_bytes(b"\xef\xbb\xbf \n\t\n")  # a BOM and white space
    assert "empty.txt is empty" in _file_error(capsys, ["--file", str(tmp_path / "empty.txt")])
    (tmp_path / "bad.txt").write_bytes(b"the cat \xff sat")
    assert _file_error(capsys, ["--file", str(tmp_path / "bad.txt")]).endswith(
        "bad.txt is not valid UTF-8 (byte 0xff at position 8)")
    assert "without TEXT" in _file_error(capsys, ["the cat", "--file", str(tmp_path / "bad.txt")])
    # issue 31: a directory was "[Errno 21] Is a directory: 3", naming the file descriptor
    assert _file_error(capsys, ["--file", str(tmp_path), "--model", "minilm"]).endswith(
        f"{tmp_path} is not a regular file (a directory, FIFO or device is never read)")


def test_file_longer_than_the_models_positions(capsys, tmp_path):
    book = tmp_path / "book.txt"
    book.write_text("the cat sat on the mat " * 200)  # 1,200 words; MiniLM takes 512 tokens
    err = _file_error(capsys, ["--file", str(book), "--model", "minilm"])
    assert "512" in err, err


def test_progress_bars_only_on_a_terminal(capsys):
    """view --file draws its bars on stderr when it is a terminal; in a pipe or a log (here:
    pytest's capture) nothing but its two lines."""
    from qkv.cli.view import Bars

    with Bars() as bars:
        assert bars.progress.disable  # stderr is captured: not a terminal
        for stage, done, total in [("tokenising", 0, 1), ("tokenising", 1, 1), ("forward", 1, 2)]:
            bars(stage, done, total)
    assert capsys.readouterr().err == ""
