"""A standalone HTML picture of an autograd graph (`write_html`): open it in any browser.

The page holds the graph's JSON, the renderer (``render.js``, the very file ``glassllm view``
serves) and its stylesheet inline, so it needs no server, no internet and no graphviz.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from glassllm.graph.export import MAX_FULL, export_graph
from glassllm.tensor import Tensor


def asset(name: str) -> str:
    """The text of a file shipped beside this module (``render.js``, ``graph.css``)."""
    return resources.files("glassllm.graph").joinpath(name).read_text(encoding="utf-8")


def graph_html(
    root: Tensor,
    names: Mapping[str, Tensor] | None = None,
    title: str = "autograd graph",
    max_full: int = MAX_FULL,
) -> str:
    """The standalone page for the graph below ``root`` (see `export_graph` for ``names``)."""
    graph = export_graph(root, names=names, max_full=max_full)
    # No "<" at all inside the <script> element (JSON reads "\u003c" as "<"), so no label can
    # end it early or open a comment.
    data = json.dumps(graph).replace("<", "\\u003c")
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ margin: 16px; font: 14px system-ui, sans-serif; color: #1d2433; }}
{asset("graph.css")}
</style>
</head>
<body>
<h1 style="font-size:18px">{html.escape(title)}</h1>
<p>Each box: name and operation, shape, value (<b>data</b>) and gradient (<b>grad</b>) of the
output with respect to it. Green boxes are leaves, the orange outline is the output.</p>
<div id="graph"></div>
<script type="application/json" id="graph-data">{data}</script>
<script type="module">
{asset("render.js")}
drawGraph(document.getElementById("graph"),
          JSON.parse(document.getElementById("graph-data").textContent));
</script>
</body>
</html>
"""


def write_html(
    root: Tensor,
    path: str | Path,
    names: Mapping[str, Tensor] | None = None,
    title: str = "autograd graph",
) -> Path:
    """Write `graph_html` to ``path`` (UTF-8) and return the path."""
    path = Path(path)
    path.write_text(graph_html(root, names=names, title=title), encoding="utf-8")
    return path
