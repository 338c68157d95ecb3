"""``python -m glassllm.app.view [options]``: the same as ``glassllm view [options]``."""

import sys

from glassllm.app.cli import main

sys.exit(main(["view", *sys.argv[1:]]))
