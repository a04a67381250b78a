"""Atomic writes: new files get the umask's permissions, failures leave the old file and no litter."""

import os
import re
import stat

import pytest

from qkv.files import atomic_write, atomic_write_bytes, atomic_write_text


@pytest.fixture
def umask():
    """Set the process umask for one test and put the old one back afterwards."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield lambda mask: os.umask(mask)
    os.umask(saved)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_new_file_gets_the_permissions_the_umask_allows(tmp_path, umask, mask):
    umask(mask)
    path = tmp_path / "a.txt"
    atomic_write_text(path, "x")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # what open() gives: the oracle for "the usual permissions"
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)


def test_replaces_the_old_content_and_creates_missing_directories(tmp_path):
    path = tmp_path / "deep" / "er" / "b.bin"
    atomic_write_bytes(path, b"old")
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
    assert os.listdir(path.parent) == ["b.bin"]


class Boom(Exception):
    pass


@pytest.mark.parametrize("error", [Boom, KeyboardInterrupt])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, error):
    path = tmp_path / "keep.txt"
    path.write_text("old")

    def half_then_fail(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise error

    with pytest.raises(error):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["keep.txt"]


def test_the_writer_gets_an_empty_file_beside_the_target(tmp_path):
    seen = {}

    def write(tmp):
        seen["dir"], seen["size"] = os.path.dirname(tmp), os.path.getsize(tmp)
        with open(tmp, "w") as f:
            f.write("x")

    atomic_write(tmp_path / "c.txt", write)
    assert seen == {"dir": str(tmp_path), "size": 0}  # same directory: os.replace stays one rename


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o640])
def test_an_overwritten_file_keeps_its_permissions(tmp_path, umask, mode):
    umask(0o077)  # a strict umask must not tighten a file the user already has
    path = tmp_path / "map.png"
    path.write_bytes(b"old")
    path.chmod(mode)
    atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == mode


# -- links and devices: written through, as a shell redirection writes them (issue 23, item 1) ---
def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    real, link = tmp_path / "real.txt", tmp_path / "link.txt"
    real.write_text("old")
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "created.txt")
    atomic_write_text(dangling, "made")  # `> dangling` creates the file the link names
    assert dangling.is_symlink() and (tmp_path / "created.txt").read_text() == "made"
    assert sorted(os.listdir(tmp_path)) == ["created.txt", "dangling.txt", "link.txt", "real.txt"]


def test_a_device_stays_a_device(tmp_path):
    before = os.stat("/dev/null")
    atomic_write_bytes("/dev/null", b"x" * 1000)
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert stat.S_IMODE(after.st_mode) == stat.S_IMODE(before.st_mode)


def test_a_fifo_is_written_in_place(tmp_path):
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    atomic_write_text(fifo, "through the pipe")
    reader.join(timeout=10)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_directory_is_refused_naming_it(tmp_path):
    with pytest.raises(IsADirectoryError) as e:
        atomic_write_text(tmp_path, "x")
    assert e.value.filename == str(tmp_path)


def test_a_failed_write_names_the_target_not_the_temporary_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError) as e:
        atomic_write_text(tmp_path / "file" / "page.html", "x")  # a file where a directory must be
    assert e.value.filename == str(tmp_path / "file" / "page.html")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("root writes into a 0500 directory")
        with pytest.raises(PermissionError) as e:
            atomic_write_text(locked / "page.html", "x")
        assert e.value.filename == str(locked / "page.html") and ".tmp" not in str(e.value)
    finally:
        locked.chmod(0o700)


def test_check_writable_refuses_what_cannot_be_written(tmp_path):
    from qkv.errors import QkvError
    from qkv.files import check_writable

    check_writable(tmp_path / "new" / "deeper" / "x.png", "--plot")  # parents made later: fine
    assert os.listdir(tmp_path) == []  # the probe left nothing behind
    (tmp_path / "file").write_text("x")
    for bad, reason in [(tmp_path, "directory"), (tmp_path / "file" / "x.png", "not a directory"),
                        ("/proc/qkv-test/x.png", "")]:
        with pytest.raises(QkvError, match=r"--plot .* cannot be written"):
            check_writable(bad, "--plot")


# -- reading from outside: regular files, bounded JSON (issue 23, item 4 and the FIFO) ----------
def test_read_json_refuses_deep_nesting_fifos_and_non_numbers(tmp_path):
    import time

    from qkv.errors import QkvError
    from qkv.files import MAX_JSON_DEPTH, read_json

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(QkvError, match=f"more than {MAX_JSON_DEPTH} levels"):
        read_json(deep)
    ok = tmp_path / "ok.json"
    ok.write_text("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    read_json(ok)  # at the limit: read
    quoted = tmp_path / "quoted.json"
    quoted.write_text('{"a": "' + "[" * 500 + '\\"["}')  # brackets inside strings do not nest
    assert read_json(quoted) == {"a": "[" * 500 + '"['}
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(QkvError, match="not a regular file"):
        read_json(fifo)
    assert time.monotonic() - start < 5
    for constant in ("NaN", "Infinity", "-Infinity"):
        (tmp_path / "c.json").write_text('{"rope_theta": %s}' % constant)
        with pytest.raises(QkvError, match=f"holds {constant}"):
            read_json(tmp_path / "c.json")


@pytest.mark.parametrize("number", ["1e999", "-1e400", "1E+309"])
def test_read_json_refuses_numbers_beyond_a_float(tmp_path, number):
    """1e999 parses to inf: a config with ``rope_theta: 1e999`` must not load."""
    from qkv.errors import QkvError
    from qkv.files import read_json

    path = tmp_path / "config.json"
    path.write_text('{"rope_theta": ' + number + ', "ok": 1e308}')
    with pytest.raises(QkvError, match=re.escape(f"config.json holds {number}, which is too large for a float")):
        read_json(path)
    path.write_text('{"rope_theta": 1e308}')
    assert read_json(path) == {"rope_theta": 1e308}
