"""`qkv view`: the local web viewer (a server on 127.0.0.1), or one self-contained HTML file.

    qkv view [TEXT] [--model NAME|DIR] [--port 8765|0] [--no-browser] [--host HOST] [--html FILE]
    qkv view --file BOOK.txt [--model NAME|DIR] [--port …] [--no-browser] [--host HOST]   (default model: reader)

The server, its API and the page are `qkv.view`; this command checks the flags, loads the
model once (so a bad `--model` fails here, not in the page), prints the URL and serves until
Ctrl-C. `--html FILE` writes the page with the numbers for TEXT inlined and exits (a bar on
stderr while it computes them, on a terminal).

`--file`: a long text (up to the model's positions) read from a file and explained once,
before the server starts, by
[`qkv.explain.long.document.document`][qkv.explain.long.document.document] (one forward, O(N)
memory; its memory estimate — tokenising, then the tokens and the recorded forward — is checked
before each; bars on stderr on a terminal). A missing, empty or non-UTF-8 file, more tokens than the
model takes or more memory than there is: one error line, and no server.
"""

from __future__ import annotations

import argparse
import functools
import sys
import threading
import urllib.parse

from qkv.cli import options
from qkv.cli.command import check_length, load_model
from qkv.cli.progress import Bars
from qkv.errors import QkvError
from qkv.paths import check_output_path

DEFAULT_PORT = 8765
EXAMPLE = "The dog found some pizza next to the baby and ate it"


def add_view(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Start a local server (127.0.0.1) with a page showing the model view (every layer × "
        "head), the head view (lines and heat map) and the step panel (q·k, /√d, softmax, Σ w·v "
        "with the model's own numbers). Nothing is loaded from the network. With --html FILE: "
        "write one self-contained page instead.")
    p.epilog = f'examples:\n  qkv view "{EXAMPLE}"\n  qkv view "{EXAMPLE}" --html it.html'
    p.add_argument("text", nargs="?", default=None, type=options.text(most=20000),
                   help="the text to open with (it can be typed in the page too)")
    p.add_argument("--model", type=options.name(), default=None,
                   help=options.Later(lambda: f"a shipped model ({options.model_names()}) or a "
                                              "model directory (default minilm; with --file, "
                                              "reader: it reads any length)"))
    options.add_device_arguments(p)
    p.add_argument("--port", type=options.integer(0, 65535), default=DEFAULT_PORT,
                   help=f"the port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--host", type=options.name(), default="127.0.0.1",
                   help="the address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--no-browser", action="store_true", help="print the URL, do not open a browser")
    p.add_argument("--html", type=options.path(), default=None, metavar="FILE",
                   help="write a self-contained page for TEXT to FILE (no server) and exit")
    p.add_argument("--file", type=options.path(), default=None, metavar="FILE",
                   help="a long text from FILE (UTF-8; up to the model's positions): explained "
                        "once at O(N) memory, then any token, the block map and the attention "
                        "received in the page")
    p.set_defaults(func=run_view)


def _served_models(model: str) -> list[str]:
    """The models the page may choose from: the one asked for first, then the shipped ones."""
    from qkv.models.loading import KNOWN_MODELS

    names = [model]
    if model not in KNOWN_MODELS:
        names.append("minilm")
    names.append("translate")
    return list(dict.fromkeys(names))


@options.in_flags({"model": "--model"})
def run_view(args: argparse.Namespace) -> int:
    from qkv.view.api import Api, Models

    if args.file is not None and (args.text is not None or args.html is not None):
        raise QkvError("--file serves a long text's page; give it without TEXT or --html")
    if args.model is None:
        from qkv.reader import NAME as READER

        args.model = READER if args.file is not None else "minilm"
    if args.html is not None:
        return _export(args)
    book = _read_file(args.file) if args.file is not None else None  # before a port or a model
    from qkv.view.server import LOCAL_HOSTS, allowed_hosts, bind, create_app, serve, url_of

    if args.host not in LOCAL_HOSTS:
        print(f"qkv: warning: listening on {args.host}: anyone who can reach this machine can "
              "run models through this page (there is no login); use the default 127.0.0.1 "
              "unless you mean it", file=sys.stderr)
    sock = bind(args.host, args.port)  # first: a port in use fails before a model loads
    models = Models([args.model] if book is not None else _served_models(args.model),
                    loader=functools.partial(load_model, args))
    try:
        model = models.get(args.model)  # load once now: a bad --model fails here, not in the page
        if book is not None:
            check_length(model, book)
        doc = _document(model, args.file, book) if book is not None else None
    except BaseException:  # a bad --model (QkvError, ApiError among them) or Ctrl-C while loading
        sock.close()
        raise
    query = {"model": args.model} | ({"text": args.text} if args.text else {})
    url = url_of(sock) + "?" + urllib.parse.urlencode(query)
    print(f"qkv view: serving {args.model} at {url}  (Ctrl-C stops)", flush=True)

    def open_browser() -> None:
        import webbrowser

        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()

    try:
        app = create_app(Api(models, text=args.text, document=doc), hosts=allowed_hosts(args.host))
        serve(app, sock, on_started=None if args.no_browser else open_browser)
    except KeyboardInterrupt:
        pass  # uvicorn has closed the connections; Ctrl-C is how this command ends
    finally:
        sock.close()
    print("qkv view: stopped", file=sys.stderr)
    return 0


def _read_file(path: str) -> str:
    """The text of `path` (read and decoded by qkv.files / qkv.text); QkvError for a missing
    or unreadable file, bytes that are not UTF-8, or a file with nothing to read."""
    import os

    from qkv.files import read_regular
    from qkv.text import clean_text, is_blank

    text = clean_text(read_regular(os.path.expanduser(path)), what=path)
    if is_blank(text):
        raise QkvError(f"{path} is empty (nothing but white space); give a file with a text in it")
    return text


def _document(model, path: str, text: str):
    """The Document of `text` (one forward); its own checks — the memory tokenising takes, the
    model's positions, the memory estimate — raise before the forward. Bars on stderr while it
    tokenises, runs each layer and records it (a terminal only)."""
    from qkv.explain.long.document import document

    print(f"qkv view: reading {path} (one forward over the whole text)…", file=sys.stderr, flush=True)
    with Bars() as bars:
        doc = document(model, text, progress=bars)
    print(f"qkv view: {path}: {len(doc):,} tokens, {doc.nbytes / 2**20:.1f} MiB kept",
          file=sys.stderr, flush=True)
    return doc


def _export(args: argparse.Namespace) -> int:
    from qkv.view.api import Api, ApiError, Models
    from qkv.view.export import export_html

    if args.text is None:
        raise QkvError("--html needs a TEXT to put in the page, e.g. qkv view "
                       f"\"{EXAMPLE}\" --html it.html")
    check_output_path(args.html, flag="--html", example="view.html")  # before the model runs
    try:
        with Bars() as bars:  # on a terminal only: the answers of every head and token
            api = Api(Models([args.model], loader=functools.partial(load_model, args)))
            size = export_html(args.html, args.model, args.text, api=api, progress=bars)
    except ApiError as e:
        raise QkvError(e.message if e.field in ("text", "model") else f"{e.field}: {e.message}") from None
    print(f"qkv view: wrote {args.html} ({size / 1e6:.1f} MB): open it in any browser, no server "
          "and no network needed")
    return 0
