"""The Experiment tab in a real browser (Playwright driving Debian's chromium, the fixtures of
test_view_browser.py): a patching sweep's heatmaps drawn layer by layer and a clicked cell, the
attribution-patching estimate beside it, zero / mean / resample ablation, steering and
attribution, with no page error or console error."""

# The fixtures are test_view_browser.py's, imported; the tests' parameters then name them again.
# ruff: noqa: F811

import os
import shutil
import threading

import numpy as np
import pytest
from test_view_browser import DOCS, Page, browser, out_dir, page, server, start  # noqa: F401
from view_helpers import make_run

from glassllm.app.view import api
from glassllm.app.view import experiment_api as xp

pytestmark = pytest.mark.browser


def open_tab(page):
    page.click("button[data-tab=experiment]")


def test_patching_sweep_heatmaps_and_a_cell(page, server):
    from playwright.sync_api import expect

    open_tab(page)
    page.click("#xp-patch-run")
    config = server.run.model.config
    expect(page.locator("#xp-resid .xp-cell")).to_have_count(config.n_layer * 8)
    expect(page.locator("#xp-heads .xp-cell")).to_have_count(config.n_layer * config.n_head)
    # axes: the clean prompt's tokens, the layers, titles and a colour scale
    columns = page.locator("#xp-resid .xp-col").all_inner_texts()
    assert columns == ["d", "e", "f", "␣", "f", "1", "(", "x"]
    assert page.locator("#xp-resid .xp-row").all_inner_texts() == ["L0", "L1"]
    expect(page.locator("#xp-resid .xp-axis-y")).to_have_text("layer (resid_pre)")
    expect(page.locator("#xp-patch-status")).to_contain_text("all of L0 patched − clean: ")
    expect(page.locator("#xp-heads .xp-legend .xp-swatch")).to_have_count(21)
    body = {"clean": "def f1(x", "corrupted": "def f2(x", "answer": ",", "wrong": ")"}
    with server.run.lock:
        answer = xp.patch(server.run, body)
    title = page.locator("#xp-resid .xp-cell").nth(8 + 5).get_attribute("title")
    assert title == f"L1, 1: {answer['resid']['values'][1][5]:.4f}"
    page.locator("#xp-heads .xp-cell").nth(1).click()
    expect(page.locator("#xp-cell .xp-value")).to_contain_text(
        f"head L0H1: patched logit diff {answer['heads']['values'][0][1]:.4f}"
    )
    expect(page.locator("#xp-cell table.xp-dist")).to_have_count(2)
    # the attribution estimate of the same grids, beside the sweep, with its correlation
    expect(page.locator("#xp-atp")).to_be_hidden()
    page.click("#xp-atp-run")
    expect(page.locator("#xp-resid-atp .xp-cell")).to_have_count(config.n_layer * 8)
    expect(page.locator("#xp-heads-atp .xp-cell")).to_have_count(config.n_layer * config.n_head)
    expect(page.locator("#xp-atp")).to_contain_text("gradient-times-difference approximation")
    with server.run.lock:
        estimate = xp.patch(server.run, {**body, "method": "attribution"})
    title = page.locator("#xp-resid-atp .xp-cell").nth(8 + 7).get_attribute("title")
    assert title == f"L1, x: {estimate['resid']['values'][1][7]:.4f}"
    r = {
        key: np.corrcoef(np.ravel(answer[key]["values"]), np.ravel(estimate[key]["values"]))[0, 1]
        for key in ("resid", "heads")
    }
    expect(page.locator("#xp-atp-corr")).to_have_text(
        "correlation with the sweep above (Pearson r over the cells): "
        f"residual {r['resid']:.3f}, heads {r['heads']:.3f}"
    )
    page.locator("#xp-heads-atp .xp-cell").nth(2).click()
    expect(page.locator("#xp-cell .xp-value")).to_have_text(
        f"head L1H0: attribution estimate {estimate['heads']['values'][1][0]:.4f}, "
        f"patched logit diff {answer['heads']['values'][1][0]:.4f}"
    )
    # a bad answer token: the server's message in the alert, the heatmaps stay
    page.fill("#xp-answer", "de")
    page.click("#xp-patch-run")
    expect(page.locator("#alert-text")).to_contain_text("'de' is 2 tokens, not one")
    expect(page.locator("#xp-patch-run")).to_be_enabled()
    page.fill("#xp-answer", "#46")  # a token id past the vocabulary
    page.click("#xp-patch-run")
    expect(page.locator("#alert-text")).to_contain_text("answer must be a token id in [0, 46)")


def test_a_sweep_draws_its_rows_and_progress_as_the_layers_come(page, monkeypatch):
    from playwright.sync_api import expect

    release = threading.Event()
    asked = []
    sweep = api.ROUTES[("POST", "/api/experiment/patch")][0]

    def held(run, body):  # layer 1 waits for the test: the page's state half-way through
        asked.append(body.get("layer"))
        assert body.get("layer") != 1 or release.wait(60)
        return sweep(run, body)

    monkeypatch.setitem(api.ROUTES, ("POST", "/api/experiment/patch"), (held, True))
    open_tab(page)
    page.click("#xp-patch-run")
    expect(page.locator("#xp-resid .xp-cell")).to_have_count(8)  # layer 0's row, drawn
    expect(page.locator("#xp-heads .xp-cell")).to_have_count(2)
    expect(page.locator("#xp-resid .xp-row")).to_have_text(["L0"])
    expect(page.locator("#xp-patch-status")).to_have_text("computing… 1 of 2 layers")
    expect(page.locator("#xp-patch-status")).to_have_class("muted computing")
    expect(page.locator("#xp-patch-progress")).to_be_visible()
    assert page.eval_on_selector("#xp-patch-progress", "p => [p.value, p.max]") == [1, 2]
    expect(page.locator("#xp-patch-run")).to_be_disabled()
    expect(page.locator("#xp-atp-run")).to_be_disabled()
    release.set()
    expect(page.locator("#xp-resid .xp-cell")).to_have_count(16)
    expect(page.locator("#xp-resid .xp-row")).to_have_text(["L0", "L1"])
    expect(page.locator("#xp-patch-status")).to_contain_text("clean")
    expect(page.locator("#xp-patch-progress")).to_be_hidden()
    expect(page.locator("#xp-patch-run")).to_be_enabled()
    assert asked == [0, 1]  # one bounded request per layer


def test_a_sweep_stops_when_the_checkpoint_changes_between_layers(page, monkeypatch):
    from playwright.sync_api import expect

    sweep = api.ROUTES[("POST", "/api/experiment/patch")][0]

    def reloaded(run, body):  # layer 1 answers as if training had saved a new checkpoint
        answer = sweep(run, body)
        if body.get("layer") == 1:
            answer["checkpoint"] = [*answer["checkpoint"], 1]
        return answer

    monkeypatch.setitem(api.ROUTES, ("POST", "/api/experiment/patch"), (reloaded, True))
    open_tab(page)
    page.click("#xp-patch-run")
    expect(page.locator("#alert-text")).to_contain_text("the checkpoint changed during the sweep")
    expect(page.locator("#xp-patch-status")).to_have_text("stopped after 1 of 2 layers")
    expect(page.locator("#xp-resid .xp-row")).to_have_text(["L0"])  # no row of another model
    expect(page.locator("#xp-patch-run")).to_be_enabled()


def test_ablation_steering_and_attribution(page, server):
    from playwright.sync_api import expect

    open_tab(page)
    expect(page.locator("#xp-parts input.xp-part")).to_have_count(2 * (2 + 2))
    page.locator("#xp-parts .xp-part-row").nth(0).locator("input").nth(1).check()
    page.locator("#xp-parts .xp-part-row").nth(1).locator("input").nth(3).check()
    page.select_option("#xp-how", "mean")
    page.fill("#xp-abl-tokens", "12")
    page.click("#xp-abl-run")
    expect(page.locator("#xp-abl-status")).to_contain_text("mean-ablated L0H1, L1 mlp")
    expect(page.locator("#xp-abl-out .xp-text")).to_have_count(2)
    expect(page.locator("#xp-abl-out .xp-text").nth(1).locator(".tok.gen")).to_have_count(12)
    # resample: the same heads from another prompt of as many tokens; no ablated continuation
    page.select_option("#xp-how", "resample")
    page.fill("#xp-abl-ref", "class(x")
    page.click("#xp-abl-run")
    expect(page.locator("#alert-text")).to_contain_text("as many tokens as the prompt, got 7 and 8")
    page.fill("#xp-abl-ref", "def f2(x")
    page.click("#xp-abl-run")
    expect(page.locator("#xp-abl-status")).to_contain_text("resample-ablated L0H1, L1 mlp")
    expect(page.locator("#xp-abl-out .xp-text")).to_have_count(1)
    expect(page.locator("#xp-abl-out .xp-no-continuation")).to_contain_text("'def f2(x'")
    resample = {"prompt": "def f1(x", "heads": [[0, 1]], "layers": [["mlp", 1]]}
    with server.run.lock:
        resampled = xp.ablate(
            server.run, {**resample, "how": "resample", "reference": "def f2(x", "seed": 1337}
        )
    expect(page.locator("#xp-abl-status")).to_contain_text(f"{resampled['kl']:.4f} nats")
    top = page.locator("#xp-abl-out table.xp-dist").nth(1).locator("td.p").first
    p = resampled["ablated"][0]["p"]
    expect(top).to_have_text(f"{100 * p:.{1 if p >= 0.1 else 2}f}%")  # util.js's percent

    expect(page.locator("#xp-steer-layer option")).to_have_count(2)
    page.select_option("#xp-steer-layer", "1")
    page.click("#xp-steer-run")
    expect(page.locator("#xp-steer-status")).to_contain_text("blocks.1.hook_resid_pre")
    expect(page.locator("#xp-steer-out .xp-text")).to_have_count(2)
    body = {"positive": "class", "negative": "def ", "prompt": "def f", "layer": 1, "strength": 4}
    with server.run.lock:
        answer = xp.steer(server.run, {**body, "max_new_tokens": 20, "seed": 1337})
    steered = page.locator("#xp-steer-out .xp-text").nth(1).locator(".tok.gen").all_inner_texts()
    assert steered == [t["text"].replace("\n", "⏎") for t in answer["steered_continuation"]]

    page.select_option("#xp-method", "integrated_gradients")
    page.click("#xp-attr-run")
    with server.run.lock:
        attributed = xp.attribute(
            server.run,
            {"prompt": "def f1(x", "answer": ",", "wrong": ")", "method": "integrated_gradients"},
        )
    expect(page.locator("#xp-attr-out .xp-bar-row")).to_have_count(len(attributed["dla"]["labels"]))
    expect(page.locator("#xp-attr-out .xp-saliency .tok")).to_have_count(8)
    expect(page.locator("#xp-attr-out")).to_contain_text("completeness gap")


def test_experiment_screenshot(browser, tmp_path):
    """The tab after a sweep, its attribution estimate, a clicked cell and an attribution;
    GLASSLLM_SCREENSHOTS=1 trains a longer run and keeps docs/view-experiment.png."""
    from playwright.sync_api import expect

    keep = os.environ.get("GLASSLLM_SCREENSHOTS") == "1"
    target = DOCS if keep else tmp_path
    run_dir = make_run(tmp_path / "run", steps=600 if keep else 20, eval_interval=100)
    server = start(run_dir)
    try:
        opened = Page(browser, f"http://127.0.0.1:{server.port}/")
        shot = opened.page
        expect(shot.locator("#info")).to_contain_text("step")
        open_tab(shot)
        shot.click("#xp-patch-run")
        expect(shot.locator("#xp-heads .xp-cell")).to_have_count(4)
        shot.click("#xp-atp-run")
        expect(shot.locator("#xp-heads-atp .xp-cell")).to_have_count(4)
        expect(shot.locator("#xp-atp-corr")).to_contain_text("residual")
        shot.locator("#xp-resid .xp-cell").nth(13).click()
        expect(shot.locator("#xp-cell table.xp-dist")).to_have_count(2)
        shot.click("#xp-attr-run")
        expect(shot.locator("#xp-attr-out .xp-saliency .tok")).to_have_count(8)
        shot.locator("#tab-experiment").screenshot(path=str(target / "view-experiment.png"))
        opened.context.close()
        assert opened.errors == []
        assert (target / "view-experiment.png").stat().st_size > 5_000
    finally:
        server.shutdown()
        server.server_close()


def test_no_checkpoint_no_experiment(browser, tmp_path, out_dir):
    from playwright.sync_api import expect

    shutil.copy(out_dir / "log.jsonl", tmp_path / "log.jsonl")
    server = start(tmp_path)
    try:
        opened = Page(browser, f"http://127.0.0.1:{server.port}/")
        expect(opened.page.locator("#info")).to_contain_text("no checkpoint yet")
        open_tab(opened.page)
        buttons = ("#xp-patch-run", "#xp-atp-run", "#xp-abl-run", "#xp-steer-run", "#xp-attr-run")
        for button in buttons:
            expect(opened.page.locator(button)).to_be_disabled()
        opened.context.close()
        assert opened.errors == []
    finally:
        server.shutdown()
        server.server_close()
