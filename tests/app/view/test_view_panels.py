"""The page's panels drawn as a plotting library would draw them (Chromium, the recipe of
test_view_browser.py): axis titles, legends, tick labels inside the chart, the clip threshold,
the attention heatmap labelled with the tokens, the logit lens's row labels kept in view."""

import pytest
import test_view_browser as shared

# The fixtures of test_view_browser.py, used here under the same names.
browser, out_dir, server, page = shared.browser, shared.out_dir, shared.server, shared.page
generate = shared.generate

pytestmark = pytest.mark.browser

CHARTS = ["chart-loss", "chart-grad", "chart-lr", "chart-ratio"]

# Every <text> of a chart's SVG: its text and its box in the SVG's own coordinates.
TEXT_BOXES = """svg => [...svg.querySelectorAll('text')].map(t => {
    const b = t.getBBox(), m = t.getCTM();
    const corners = [[b.x, b.y], [b.x + b.width, b.y + b.height]].map(([x, y]) => {
        const p = new DOMPoint(x, y).matrixTransform(m);
        return [p.x, p.y];
    });
    return {text: t.textContent, corners};
})"""


def visible_alone(text):
    return text.replace("\n", "⏎").replace("\t", "→").replace(" ", "␣")


def test_every_chart_has_axis_titles_a_legend_and_unclipped_ticks(page):
    from playwright.sync_api import expect

    page.click("button[data-tab=training]")
    expect(page.locator("#train-status")).to_contain_text("4 evaluations")
    for chart in CHARTS:
        svg = page.locator(f"#{chart} svg")
        expect(svg.locator("text.axis-title.x")).to_have_text("step")
        assert svg.locator("text.axis-title.y").text_content().strip() != ""
        assert svg.locator("g.legend g.legend-item").count() >= 1
        assert svg.locator("text.tick.y").count() >= 2 and svg.locator("text.tick.x").count() >= 2
        width, height = page.eval_on_selector(
            f"#{chart} svg", "s => [s.width.baseVal.value, s.height.baseVal.value]"
        )
        # getCTM: a text's box in the SVG's user space (the y title is rotated)
        for box in page.eval_on_selector(f"#{chart} svg", TEXT_BOXES):
            (x0, y0), (x1, y1) = box["corners"]
            lo_x, hi_x, lo_y, hi_y = min(x0, x1), max(x0, x1), min(y0, y1), max(y0, y1)
            assert 0 <= lo_x and hi_x <= width and 0 <= lo_y and hi_y <= height, (chart, box)
    legend = page.locator("#chart-loss g.legend").text_content()
    assert "train (evaluation)" in legend and "val (evaluation)" in legend
    # The run clipped at grad_clip 1.0 (the default): the threshold is drawn, and named.
    expect(page.locator("#chart-grad line.threshold")).to_have_count(1)
    expect(page.locator("#chart-grad g.legend")).to_contain_text("clip threshold (grad_clip 1)")
    expect(page.locator("#hists .hist-legend")).to_contain_text("weights")
    # The last evaluation (step 60) has its histograms too, weights only.
    assert page.locator("#hist-step option").all_inner_texts()[-1].startswith("60 (the last")


def test_attention_heatmap_is_labelled_with_the_prompts_tokens(page):
    from playwright.sync_api import expect

    generate(page, "def ", 12)
    page.click("button[data-tab=inside]")
    with page.expect_response("**/api/inspect") as response:
        page.click("#inspect")
    tokens = [visible_alone(t["text"]) for t in response.value.json()["tokens"]]
    expect(page.locator("#attn-keys .attn-label")).to_have_count(len(tokens))
    for axis in ("keys", "queries"):
        assert page.locator(f"#attn-{axis} .attn-label").all_text_contents() == tokens
    # Each key label sits over its column, each query label beside its row.
    canvas = page.locator("#attn").bounding_box()
    cell = canvas["width"] / len(tokens)
    for k in (0, len(tokens) // 2, len(tokens) - 1):
        key = page.locator("#attn-keys .attn-label").nth(k).bounding_box()
        assert abs(key["x"] + key["width"] / 2 - (canvas["x"] + (k + 0.5) * cell)) < cell / 2
        assert key["y"] + key["height"] <= canvas["y"] + 1
        query = page.locator("#attn-queries .attn-label").nth(k).bounding_box()
        assert abs(query["y"] + query["height"] / 2 - (canvas["y"] + (k + 0.5) * cell)) < cell / 2
        assert query["x"] + query["width"] <= canvas["x"] + 1
    expect(page.locator(".attn-corner")).to_contain_text("query")


def test_logit_lens_row_labels_stay_in_view_when_it_scrolls(page):
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 640, "height": 900})
    generate(page, "def ", 28)
    page.click("button[data-tab=inside]")
    page.click("#inspect")
    expect(page.locator("#lens tr")).to_have_count(4)
    scroller = page.locator("#lens").locator("xpath=..")
    scroller.scroll_into_view_if_needed()
    scrolled = scroller.evaluate("s => { s.scrollLeft = s.scrollWidth; return s.scrollLeft; }")
    assert scrolled > 100  # the table is wider than its pane
    left = scroller.bounding_box()["x"]
    for r in range(3):
        label = page.locator("#lens th.rowname").nth(r)
        box = label.bounding_box()
        assert abs(box["x"] - left) <= 3
        # On top: the cell scrolled under it does not cover it.
        on_top = page.evaluate(
            "([x, y]) => document.elementFromPoint(x, y).classList.contains('rowname')",
            [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2],
        )
        assert on_top, label.inner_text()
