"""The autograd graph as data and as a picture: micrograd's ``draw_dot`` without graphviz.

>>> import numpy as np
>>> from glassllm import Tensor
>>> from glassllm.graph import export_graph
>>> x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
>>> loss = (x * x).sum()
>>> loss.backward()
>>> [node["op"] for node in export_graph(loss)["nodes"]]
['leaf', '*', 'sum']

`write_html(loss, "graph.html")` writes the same graph as a standalone page (open it in a browser,
no server or internet needed); `glassllm.graph.examples` holds the four expressions of
``glassllm view``'s graph panel. A model's forward is drawn with each module folded into one box
that opens on click (`glassllm.graph.modules`; ``with record_modules(model):`` is the explicit,
hook-based way, still honoured).
"""

from glassllm.graph.export import export_graph, op_name, summarize
from glassllm.graph.html import graph_html, write_html
from glassllm.graph.modules import record_modules

__all__ = ["export_graph", "op_name", "summarize", "graph_html", "write_html", "record_modules"]
