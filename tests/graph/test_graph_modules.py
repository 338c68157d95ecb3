"""Each node of a model's graph knows the module that produced it (by default, from
`Module.__call__`; or recorded by `record_modules`), and the drawing folds each module into one
box that opens on click (Chromium, the view's recipe)."""

from __future__ import annotations

import contextlib
import shutil

import numpy as np
import pytest

from glassllm import Tensor, nn
from glassllm.graph import export_graph, record_modules, write_html
from glassllm.models import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)


def _gpt_loss(recorded=False):
    model = GPT(CONFIG)
    ids = np.arange(4, dtype=np.int64)[None] % CONFIG.vocab_size
    with record_modules(model) if recorded else contextlib.nullcontext():
        _, loss = model(ids, ids)
    loss.backward()
    return model, loss


@pytest.mark.parametrize("recorded", [False, True], ids=["default", "record_modules"])
def test_each_op_is_tagged_with_the_module_that_ran_it(recorded):
    model, loss = _gpt_loss(recorded)
    nodes = export_graph(loss)["nodes"]
    modules = {n["module"] for n in nodes}
    assert {"blocks.0.attn", "blocks.1.mlp.fc", "blocks.1", "ln_f", "wte"} <= modules
    assert nodes[-1]["op"] == "cross_entropy" and nodes[-1]["module"] == ""
    parameters = [n for n in nodes if n["op"] == "leaf"]
    assert {(n["module"], n["label"]) for n in parameters} == {
        tuple(name.rpartition(".")[::2]) for name, _ in model.named_parameters()
    }
    # Outside the block no hook is left registered, and a new forward gets, by default, the
    # tags record_modules' hooks gave, node for node.
    assert not any(m._forward_hooks or m._forward_pre_hooks for _, m in model.named_modules())
    ids = np.arange(4, dtype=np.int64)[None] % CONFIG.vocab_size
    later = export_graph(model(ids, ids)[1])["nodes"]
    with record_modules(model):
        recorded_nodes = export_graph(model(ids, ids)[1])["nodes"]
    tags = lambda nodes: [(n["op"], n["module"], n["label"]) for n in nodes]
    assert tags(later) == tags(recorded_nodes)


def test_operations_outside_every_module_and_a_lone_module_are_not_folded():
    layer = nn.Linear(2, 2)
    x = Tensor(np.ones((1, 2), dtype=np.float32), requires_grad=True)
    nodes = export_graph((layer(x) * 2).sum())["nodes"]
    # the lone module is the outermost one, its operation at the top: nothing to fold, so
    # the graph is the plain one (no module, parameters unlabelled)
    assert [n["op"] for n in nodes] == ["leaf", "leaf", "leaf", "linear", "const", "*", "sum"]
    assert {(n["module"], n["label"]) for n in nodes} == {("", "")}


def test_hooks_are_removed_after_an_exception():
    layer = nn.Linear(2, 2)
    with pytest.raises(ValueError), record_modules(layer):
        layer(Tensor(np.ones((1, 3), dtype=np.float32)))
    assert not layer._forward_hooks and not layer._forward_pre_hooks
    with pytest.raises(TypeError, match="glassllm Module"):
        with record_modules("model"):
            pass


@pytest.fixture(scope="module")
def chromium():
    from conftest import optional

    optional("playwright")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()


@pytest.mark.browser
def test_a_gpts_graph_is_drawn_folded_and_a_module_opens_on_click(chromium, tmp_path):
    from playwright.sync_api import expect

    _, loss = _gpt_loss()
    graph = export_graph(loss)
    path = write_html(loss, tmp_path / "gpt.html", title="2-layer GPT")
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    boxes = page.locator("svg.graph g.node")
    expect(boxes.first).to_be_visible()
    folded = boxes.count()
    # wte, wpe, their sum, blocks.0, blocks.1, ln_f, the head's transpose and linear, the
    # targets and the loss: a dozen boxes, not the graph's every node.
    assert folded <= 12 < len(graph["nodes"])
    assert page.locator("svg.graph g.node.module").count() == 5
    width = page.eval_on_selector("svg.graph", "s => s.width.baseVal.value")
    assert width < 2500
    attn_box = page.locator("svg.graph g.node.module", has_text="blocks.0.attn  (module")
    page.locator("svg.graph g.node.module", has_text="blocks.0  (module").click()
    expect(attn_box).to_have_count(1)
    opened = boxes.count()
    assert opened > folded
    attn_box.click()
    expect(page.locator("svg.graph g.node", has_text="attention")).not_to_have_count(0)
    expect(attn_box).to_have_count(0)
    # Clicking one of an opened module's nodes folds that module again.
    page.locator("svg.graph g.node", has_text="attention").first.click()
    expect(attn_box).to_have_count(1)
    assert errors == []
    page.close()
