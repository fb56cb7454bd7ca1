"""`specdec explain`: a static page that explains when speculation pays, with live numbers.

The page (static/) is plain HTML, CSS and JavaScript: no build step and nothing fetched from the network.
Its formulas are a JavaScript copy of specdec.theory.economics, pinned by static/vectors.json
(regenerate with `python -m specdec.explain.vectors`).
"""

from __future__ import annotations

import functools
import http.server
import shutil
from pathlib import Path

from specdec.errors import SpecdecError

STATIC_DIR = Path(__file__).with_name("static")
DEFAULT_OUT = "specdec-explainer"
DEFAULT_PORT = 8765


def register(sub) -> None:
    p = sub.add_parser("explain", help="an interactive page: when does speculative decoding pay?")
    p.add_argument("--out", metavar="DIR", default=None,
                   help=f"write the page's files into DIR (default ./{DEFAULT_OUT}; not written with --serve "
                        "unless given)")
    p.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 until Ctrl-C")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port for --serve (default {DEFAULT_PORT})")
    p.add_argument("--open", action="store_true", help="open the page in a web browser")
    p.set_defaults(func=run_explain)


def page_files() -> list[Path]:
    return sorted(f for f in STATIC_DIR.iterdir() if f.is_file() and not f.name.startswith("."))


def write_page(out: str | Path) -> Path:
    """Copy the page into `out` (created if needed) and return the path of its index.html."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SpecdecError(f"--out {out}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for f in page_files():
            shutil.copyfile(f, out / f.name)
    except OSError as e:
        raise SpecdecError(f"cannot write the page into {out}: {e.strerror or e}") from None
    return (out / "index.html").resolve()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:
        pass


def make_server(directory: str | Path, port: int = DEFAULT_PORT, host: str = "127.0.0.1"):
    """An HTTP server for `directory` (port 0 picks a free port); call serve_forever(), then server_close()."""
    if not 0 <= port <= 65535:
        raise SpecdecError(f"--port must be in 0..65535, got {port}")
    handler = functools.partial(_QuietHandler, directory=str(directory))
    try:
        return http.server.ThreadingHTTPServer((host, port), handler)
    except OSError as e:
        raise SpecdecError(f"cannot serve on {host}:{port}: {e.strerror or e} (pick another --port)") from None


def _open(url: str) -> None:
    import webbrowser

    if not webbrowser.open(url):
        print(f"could not start a web browser; open {url} yourself")


def run_explain(args) -> int:
    directory = STATIC_DIR
    if args.out is not None or not args.serve:
        index = write_page(args.out if args.out is not None else DEFAULT_OUT)
        print(index)
        directory = index.parent
        if not args.serve and args.open:
            _open(index.as_uri())
    if args.serve:
        server = make_server(directory, args.port)
        url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
        print(f"serving the explainer at {url} (Ctrl-C to stop)", flush=True)
        if args.open:
            _open(url)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            print("stopped")
        finally:
            server.server_close()
    return 0
