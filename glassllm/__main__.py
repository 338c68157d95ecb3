"""``python -m glassllm``: the same as the ``glassllm`` command."""

import sys

from glassllm.app import main

if __name__ == "__main__":  # not when a tool (e.g. pytest --doctest-modules) imports this file
    sys.exit(main())
