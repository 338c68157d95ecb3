"""How to install an optional extra, said in one place for every message and document.

The name ``glassllm`` on the public package index belongs to another project, so no hint may install
the project or its extras by that name: that would install a stranger's code.
Until this project is published under a name it owns, an extra is installed from the source
checkout (tests/test_install_hints.py holds every hint in the package and the documents to it).

>>> install_hint("hf")
"the glassllm[hf] extra: pip install -e '.[hf]' in glassllm's source checkout"
"""

from __future__ import annotations

EXTRAS = ("hf", "mpi", "fast", "plot", "gguf", "chat", "test", "dev")


def install_hint(extra: str) -> str:
    """The words that tell a user how to install ``extra`` (one of `EXTRAS`) of this project."""
    if extra not in EXTRAS:
        raise ValueError(f"no extra {extra!r}; the extras are {', '.join(EXTRAS)}")
    return f"the glassllm[{extra}] extra: pip install -e '.[{extra}]' in glassllm's source checkout"
