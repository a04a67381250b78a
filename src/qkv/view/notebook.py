"""A [`qkv.explain`][qkv.explain] result in a notebook: the viewer's page for its numbers, in a
sandboxed iframe. Registered from this side (`qkv.explain` knows nothing of the viewer):

```text
%load_ext qkv.view.notebook          # or: qkv.view.notebook.register()
```

after which `explain(...)`, `explain_head(...)`, `attention_map(...)`, `cross_attention(...)`
… display as the page. `html` is the same page for any result, without IPython.
"""

from __future__ import annotations

from qkv.explain.kinds import KINDS
from qkv.view.export import result_page
from qkv.view.page import iframe

# The result classes a notebook displays, by kind: the rows of the table that name one.
SHOWN = {k.name: k.result for k in KINDS.values() if k.result is not None}


def html(result) -> str:
    """`result` as a notebook shows it: the viewer for its numbers only, in a sandboxed iframe
    (the page draws it with its row's panel: `PANELS[kind]`; `qkv.view.export.result_page`)."""
    return iframe(result_page(result))


def register(ipython=None) -> None:
    """Make `ipython` (default: the running one) display every result kind with `html`."""
    if ipython is None:
        from IPython import get_ipython

        ipython = get_ipython()
    formatter = ipython.display_formatter.formatters["text/html"]
    for cls in SHOWN.values():
        formatter.for_type_by_name(cls.__module__, cls.__name__, html)


def load_ipython_extension(ipython) -> None:
    """`%load_ext qkv.view.notebook`."""
    register(ipython)
