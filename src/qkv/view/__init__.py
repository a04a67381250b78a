"""`qkv view`: a local, offline web viewer for attention — the page shows, the library computes.

Where things are (a newcomer finds "where is the step panel drawn" and "where are its numbers
computed" in two different files):

* `api.py`    — the JSON API: a request's fields checked, a [`qkv.explain`][qkv.explain] result's
  `to_dict()` returned. Models are loaded once and shared (one lock around torch calls).
* `server.py` — the Starlette app (routes, body limits, static files, errors as JSON) and the
  uvicorn runner bound to 127.0.0.1.
* `page.py`   — the page itself as one HTML string: the static files inlined, a
  Content-Security-Policy, and (for `--html` and notebooks) the API's answers embedded.
* `export.py` — `qkv view TEXT --html FILE`: precompute the answers a page needs, write one
  self-contained file.
* `answers.py` — a result as the page receives it (its `to_dict()`; whole maps as float32).
* `notebook.py` — a result in a notebook (`%load_ext qkv.view.notebook`): the page in an iframe.
* `static/`   — `frame.html` (every page's `<head>` and the `<body>` around its
  content), `index.html` (the text page's body), `style.css`, `app.js` (each result kind
  drawn by its entry of `PANELS`), `document.html`/`document.js` (a long document),
  `atlas.html`/`needle.html` (+ `.js`: saved results) and `shared.js` (what the pages
  share): plain HTML/SVG/canvas, no build step, no network access beyond the server that sent
  them.

Nothing is imported here, so the export and the notebook display do not pull in the server.
The endpoints, the fields they take (with their defaults and bounds), how each answer is encoded,
which panel draws it and which model they need are the rows of `qkv.explain.kinds.KINDS`;
`qkv.explain` never imports this package.
"""
