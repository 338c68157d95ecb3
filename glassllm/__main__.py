"""``python -m glassllm``: the same as the ``glassllm`` command."""

import sys

from glassllm.cli import main

sys.exit(main())
