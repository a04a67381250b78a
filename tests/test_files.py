"""Atomic writes: new files get the umask's permissions, failures leave the old file and no litter."""

import os
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
