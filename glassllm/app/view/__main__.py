"""``python -m glassllm.app.view [OUT_DIR] [--port N] [--no-browser]``: the viewer, no CLI."""

import argparse
import sys

from .server import serve

parser = argparse.ArgumentParser(prog="python -m glassllm.app.view")
parser.add_argument("out_dir", nargs="?", default="out")
parser.add_argument("--checkpoint", default=None)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, default=8000)
parser.add_argument("--no-browser", action="store_true")
args = parser.parse_args()
try:
    serve(args.out_dir, args.checkpoint, args.host, args.port, not args.no_browser)
except ValueError as err:
    print(f"glassllm: error: {err}", file=sys.stderr)
    sys.exit(2)
