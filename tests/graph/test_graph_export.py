"""glassllm.graph: graph export, op names, the four graph examples, the standalone HTML."""

import json

import numpy as np
import pytest

import glassllm.functional as F
from glassllm import Tensor, gradcheck, no_grad
from glassllm.graph import export_graph, graph_html, op_name, summarize, write_html
from glassllm.graph.examples import EXAMPLES, run_example


def leaf(values):
    return Tensor(np.array(values, dtype=np.float64), requires_grad=True)


def test_op_names_come_from_the_vjp():
    x, w = leaf([[1.0, 2.0]]), leaf([[1.0], [3.0]])
    cases = {
        "+": x + 1,
        "-": x - 1,
        "*": x * 2,
        "/": x / 2,
        "**": x**2,
        "@": x @ w,
        "neg": -x,
        "[]": x[0],
        "sum": x.sum(),
        "exp": x.exp(),
        "tanh": x.tanh(),
        "reshape": x.reshape(2),
        "transpose": x.transpose(1, 0),
        "softmax": F.softmax(x),
        "layer_norm": F.layer_norm(x),
        "gelu": F.gelu(x),
        "cross_entropy": F.cross_entropy(x, np.array([1])),
        "scaled_dot_product_attention": F.scaled_dot_product_attention(x, x, x),
    }
    for expected, tensor in cases.items():
        assert op_name(tensor) == expected
    assert op_name(x) == "leaf"
    assert op_name(Tensor(np.ones(2))) == "const"


def test_nodes_once_edges_per_use_parents_first():
    x = leaf(3.0)
    c = Tensor(np.array(2.0))
    y = (x * x + c).tanh()
    y.backward()
    graph = export_graph(y, names={"x": x, "c": c})
    ops = [n["op"] for n in graph["nodes"]]
    assert ops == ["leaf", "*", "const", "+", "tanh"]
    assert graph["edges"] == [[0, 1], [0, 1], [1, 3], [2, 3], [3, 4]]
    assert graph["root"] == 4
    by_label = {n["label"]: n for n in graph["nodes"] if n["label"]}
    assert by_label["x"]["grad"] == pytest.approx(float(x.grad))
    assert by_label["c"]["grad"] is None  # a constant gets no gradient
    for child, node in enumerate(graph["nodes"]):
        assert all(p < child for p, c in graph["edges"] if c == child)
        assert node["id"] == child
    json.dumps(graph, allow_nan=False)


def test_a_deep_chain_exports_without_recursion():
    x = leaf(0.5)
    y = x
    for _ in range(2000):  # deeper than Python's recursion limit
        y = y * 1.0
    graph = export_graph(y)
    assert len(graph["nodes"]) == 2 * 2000 + 1  # each * adds its constant 1.0
    for _ in range(500):
        y = y * 1.0
    with pytest.raises(ValueError, match="more than 5000 nodes"):
        export_graph(y)


def test_small_tensors_in_full_large_as_statistics_non_finite_as_text():
    assert summarize(np.arange(4.0).reshape(2, 2)) == [[0.0, 1.0], [2.0, 3.0]]
    assert summarize(np.array([np.nan, np.inf, -np.inf, 1.0])) == ["nan", "inf", "-inf", 1.0]
    big = np.arange(100, dtype=np.float32)
    stats = summarize(big)
    assert stats["min"] == 0 and stats["max"] == 99 and stats["mean"] == pytest.approx(49.5)
    assert stats["std"] == pytest.approx(np.std(big)) and stats["rms"] == pytest.approx(
        np.sqrt(np.mean(big.astype(np.float64) ** 2))
    )
    assert summarize(np.array([np.nan] * 20))["mean"] == "nan"


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_gradients_agree_with_gradcheck(name):
    example = EXAMPLES[name]
    leaves = example.leaves(None)
    order = list(leaves)

    def fn(*tensors):
        return example.fn(dict(zip(order, tensors, strict=True)))[0]

    assert gradcheck(fn, [leaves[k] for k in order])
    graph = run_example(name)
    output, labels = example.build(None)
    output.backward()
    exported = {n["label"]: n for n in graph["nodes"]}
    for key in order:  # the exported gradients are the engine's
        np.testing.assert_allclose(exported[key]["grad"], labels[key].grad, rtol=1e-12)
    assert graph["nodes"][graph["root"]]["shape"] == []
    json.dumps(graph, allow_nan=False)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_gradients_agree_with_gradcheck_at_other_inputs(name):
    example = EXAMPLES[name]
    rng = np.random.default_rng(3)
    values = {k: rng.normal(size=np.shape(v)) for k, v in example.defaults.items()}
    leaves = example.leaves(values)
    order = list(leaves)
    assert gradcheck(
        lambda *t: example.fn(dict(zip(order, t, strict=True)))[0], [leaves[k] for k in order]
    )


def test_neuron_gives_micrographs_known_answers():
    nodes = {n["label"]: n for n in run_example("neuron")["nodes"]}
    assert nodes["o"]["value"] == pytest.approx(0.7071, abs=1e-4)
    assert nodes["o"]["grad"] == 1.0
    assert nodes["x1"]["grad"] == pytest.approx(-1.5)
    assert nodes["w1"]["grad"] == pytest.approx(1.0)
    assert nodes["x2"]["grad"] == pytest.approx(0.5)
    assert nodes["w2"]["grad"] == 0.0
    edited = {n["label"]: n for n in run_example("neuron", {"x2": 1.0})["nodes"]}
    assert edited["w2"]["grad"] != 0.0


def test_cross_entropy_example_equals_the_fused_loss():
    logits = [0.3, -1.2, 2.5]
    graph = run_example("cross_entropy", {"logits": logits})
    value = graph["nodes"][graph["root"]]["value"]
    fused = F.cross_entropy(Tensor(np.array([logits])), np.array([0]))
    assert value == pytest.approx(float(fused.data), rel=1e-12)


def test_attention_example_weights_are_causal_probabilities():
    nodes = {n["label"]: n for n in run_example("attention")["nodes"]}
    p = np.array(nodes["P"]["value"])
    np.testing.assert_allclose(p.sum(-1), 1.0)
    assert p[0, 1] == p[0, 2] == p[1, 2] == 0.0
    assert nodes["causal mask"]["value"][0][1] == "-inf"


def test_example_inputs_are_checked():
    with pytest.raises(ValueError, match="unknown example"):
        run_example("eval")
    with pytest.raises(ValueError, match="no input 'z'"):
        run_example("neuron", {"z": 1.0})
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        run_example("layer_norm", {"x": [1.0, 2.0]})
    with pytest.raises(ValueError, match="finite"):
        run_example("neuron", {"b": float("nan")})
    with pytest.raises(ValueError, match="must be numbers"):
        run_example("neuron", {"b": "1; import os"})


def test_write_html_is_standalone_and_escapes_labels(tmp_path):
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    y.backward()
    path = write_html(y, tmp_path / "g.html", names={"</script><img src=x>": x}, title="<b>t</b>")
    text = path.read_text(encoding="utf-8")
    assert "drawGraph(" in text and "export function drawGraph" in text
    assert "<img src=x>" not in text  # the label stays inside the JSON, escaped
    assert "&lt;b&gt;t&lt;/b&gt;" in text
    assert "http" not in text.replace("http://www.w3.org/2000/svg", "")  # nothing fetched
    data = text.split('id="graph-data">')[1].split("</script>")[0]
    assert json.loads(data)["nodes"][0]["label"] == "</script><img src=x>"
    assert graph_html(y) == graph_html(y)


def double(t):
    def vjp(g):
        return (2 * g,)

    return Tensor.from_op(2 * t.data, (t,), vjp)


def test_op_name_is_the_name_the_op_gave_else_the_vjps_qualname():
    x = leaf([1.0, 2.0])
    named = Tensor.from_op(2 * x.data, (x,), lambda g: (2 * g,), name="twice")
    assert (named.op, op_name(named)) == ("twice", "twice")
    unnamed = double(x)
    assert unnamed.op is None and op_name(unnamed) == "double"
    assert F.layer_norm(x).op == "layer_norm" and (x * x).op == "*"
    with no_grad():
        assert Tensor.from_op(x.data, (x,), lambda g: (g,), name="twice").op is None
