"""The notebook panels: well-formed HTML (every tag closed), token text escaped, the numbers
present, nothing fetched; and each result type's ``_repr_html_`` draws its panel."""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np
import pytest

from glassllm import html, interp
from glassllm.models import GPT, GPTConfig
from glassllm.models.inspect import inspect

VOID = {"br", "img", "hr", "meta", "input"}
EVIL = "<script>alert(1)</script>"


class Checker(HTMLParser):
    """Collects the tags, the text and the attributes; fails on a tag closed out of order."""

    def __init__(self):
        super().__init__()
        self.open: list[str] = []
        self.tags: list[str] = []
        self.text: list[str] = []
        self.attrs: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(k, v or "") for k, v in attrs]
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> Checker:
    checker = Checker()
    checker.feed(page)
    checker.close()
    assert checker.open == [], f"unclosed tags {checker.open}"
    assert "script" not in checker.tags and "link" not in checker.tags  # nothing runs or loads
    assert not any(k in ("src", "href") for k, _ in checker.attrs)
    return checker


def test_heatmap_is_well_formed_escaped_and_holds_its_numbers():
    values = np.array([[0.25, -1.5, 3.0], [0.0, 2.0, -0.125]])
    page = html.heatmap(values, ["L0", "L1"], ["a", EVIL, "c&d"], "title <b>", "layer", "pos")
    checker = parse(page)
    text = "".join(checker.text)
    assert EVIL in text and "c&d" in text and "title <b>" in text  # shown as text
    assert EVIL not in page and "&lt;script&gt;" in page
    for v in ("0.25", "-1.5", "3", "2", "-0.125"):
        assert v in checker.text
    titles = [v for k, v in checker.attrs if k == "title"]
    assert f"L0, {EVIL}: -1.5" in titles
    assert "layer" in text and "pos" in text  # the axis titles
    assert "colour: -3" in text  # the legend spans the signed range symmetrically


def test_heatmap_refuses_a_shape_that_does_not_match_its_labels():
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        html.heatmap(np.zeros((3, 2)), ["a", "b"], ["x", "y", "z"])


def test_wide_heatmaps_keep_the_numbers_in_the_tooltips():
    values = np.arange(2 * 40, dtype=np.float64).reshape(2, 40)
    checker = parse(html.heatmap(values, ["r0", "r1"], [str(i) for i in range(40)]))
    titles = [v for k, v in checker.attrs if k == "title"]
    assert len(titles) == 80 and "r1, 39: 79" in titles


def test_bars_tokens_line_and_table_escape_and_hold_numbers():
    checker = parse(html.bars([1.0, -0.5], [EVIL, "b"], "t", "note"))
    assert EVIL in "".join(checker.text) and "-0.5" in checker.text
    checker = parse(html.tokens_line([EVIL, "x"], [0.5, 1.0], "saliency"))
    assert [v for k, v in checker.attrs if k == "title"] == [f"{EVIL}: 0.5", "x: 1"]
    checker = parse(html.table(["name", "shape"], [[EVIL, "1x2"]]))
    assert EVIL in checker.text and "1x2" in checker.text


def test_nbytes_reads_as_a_size():
    assert [html.nbytes(n) for n in (12, 1500, 2_500_000)] == ["12 B", "1.5 kB", "2.5 MB"]


@pytest.fixture(scope="module")
def model():
    config = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)
    return GPT(config, rng=np.random.default_rng(0))


def test_every_result_type_draws_its_panel(model):
    clean, corrupted = [1, 2, 3, 4], [1, 5, 3, 4]
    tokens = [EVIL, "b", "c", "d"]
    patch = interp.activation_patch(model, clean, corrupted, answer=6, wrong=7, tokens=tokens)
    by_head = interp.activation_patch(model, clean, corrupted, "z", "pos_head", answer=6, wrong=7)
    _, cache = model.run_with_cache([[1, 2, 3]])
    results = {
        "Inspection": inspect(model, clean),
        "ActivationCache": cache,
        "PatchingResult": patch,
        "PatchingResult by position and head": by_head,
        "LogitAttribution": interp.direct_logit_attribution(model, clean, answer=6, wrong=7),
        "TokenAttribution": interp.integrated_gradients(model, clean, answer=6, wrong=7),
        "AblationResult": interp.ablate(model, clean, heads=[(0, 1)]),
    }
    for what, result in results.items():
        checker = parse(result._repr_html_())
        assert checker.text, what
    assert "&lt;script&gt;" in patch._repr_html_()
    text = "".join(parse(cache._repr_html_()).text)
    assert "blocks.1.attn.hook_pattern" in text and "1x2x3x3" in text and "float32" in text
    normalized = patch.normalized
    titles = [v for k, v in parse(patch._repr_html_()).attrs if k == "title"]
    assert f"L0, {EVIL}: {normalized[0, 0]:.3g}" in titles
    dla = results["LogitAttribution"]
    assert f"{dla.logit_diff:.6g}" in "".join(parse(dla._repr_html_()).text)
    ablation = results["AblationResult"]
    assert f"KL {ablation.kl:.4g} nats" in "".join(parse(ablation._repr_html_()).text)
