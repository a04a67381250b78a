"""The reader's corpus: prose out of the documentation's HTML, the tutorial held out."""

from __future__ import annotations

import pytest

from reader_corpus import write_docs
from qkv.errors import QkvError
from qkv.reader.corpus import page_text, read_corpus


def test_page_text_keeps_the_main_prose_and_leaves_out_code_links_and_navigation():
    html = ('<p>nav</p><div role="main"><h1>4.1. if Statements<a class="headerlink">¶</a></h1>'
            '<p>Perhaps the most <code>well-known</code>\n  statement &amp; type.</p>'
            '<div class="highlight"><pre><span>x</span> = <a href="#">1</a></pre></div>'
            '<ul><li>one</li><li>two<br>three</li></ul><div><p>nested</p></div></div><p>footer</p>')
    assert page_text(html) == ("4.1. if Statements\nPerhaps the most well-known statement & type.\n"
                               "one\ntwo\nthree\nnested")


def test_a_page_without_a_main_div_has_no_text():
    assert page_text("<html><body><p>only navigation</p></body></html>") == ""


def test_the_tutorial_is_held_out_and_indexes_are_skipped(tmp_path):
    c = read_corpus(write_docs(tmp_path))
    assert c.train_pages == ["library/p0.html", "library/p1.html", "library/p2.html"]
    assert c.heldout_pages == ["tutorial/t.html"]
    assert c.heldout[0].startswith("Tutorial\n") and "code is left out" not in c.heldout[0]
    assert c.source["pages"] == 3 and c.source["heldout"] == ["tutorial/"]
    assert "package" not in c.source  # not the Debian package's directory: no licence claimed


def test_a_directory_without_both_kinds_of_page_is_one_error(tmp_path):
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "a.html").write_text('<div role="main"><p>text</p></div>')
    with pytest.raises(QkvError, match=r"found 1 training and 0 held-out pages"):
        read_corpus(tmp_path)
    with pytest.raises(QkvError, match="is not a directory"):
        read_corpus(tmp_path / "missing")
