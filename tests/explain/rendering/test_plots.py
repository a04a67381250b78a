"""Heat maps are real images, written atomically; bad paths are clean errors."""

import os
import stat

import matplotlib.image
import pytest
import torch

from qkv.errors import QkvError
from qkv.explain.rendering.plots import check_writable, grid_map, head_map, save_atomic


def test_head_map_png(tmp_path):
    path = tmp_path / "head.png"
    w = torch.rand(5, 5).softmax(-1)
    save_atomic(head_map(w, list("abcde"), title="t"), str(path))
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert os.listdir(tmp_path) == ["head.png"]  # no temporary file left behind


def test_grid_map_svg(tmp_path):
    path = tmp_path / "grid.svg"
    rows = torch.rand(12, 6).softmax(-1)
    save_atomic(grid_map(rows, list("abcdef"), heads=4, title="t", highlight=[True] + [False] * 11),
                str(path))
    text = path.read_text()
    assert text.lstrip().startswith("<?xml") and "L2 H3" in text


def test_failed_render_leaves_nothing(tmp_path):
    fig = head_map(torch.eye(2), ["a", "b"], title=r"$\frac$")  # bad mathtext fails in savefig
    with pytest.raises(ValueError):
        save_atomic(fig, str(tmp_path / "x.png"))
    assert os.listdir(tmp_path) == []


def test_existing_file_survives_a_failed_write(tmp_path):
    path = tmp_path / "keep.png"
    path.write_bytes(b"old")
    with pytest.raises(ValueError):
        save_atomic(head_map(torch.eye(2), ["a", "b"], title=r"$\frac$"), str(path))
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["keep.png"]


@pytest.mark.parametrize("name, message", [
    ("missing/x.png", "does not exist"),
    ("x.jpg", "must end in .png, .svg or .pdf"),
    ("", "must end in"),
])
def test_bad_paths(tmp_path, name, message):
    with pytest.raises(QkvError, match=message):
        check_writable(str(tmp_path / name) if name else name)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_read_only_directory(tmp_path):
    tmp_path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(QkvError, match="not writable"):
            check_writable(str(tmp_path / "x.png"))
    finally:
        tmp_path.chmod(stat.S_IRWXU)


def test_directory_as_path(tmp_path):
    (tmp_path / "d.png").mkdir()
    with pytest.raises(QkvError, match="is a directory"):
        check_writable(str(tmp_path / "d.png"))
