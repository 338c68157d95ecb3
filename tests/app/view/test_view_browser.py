"""glassllm view in a real browser: Playwright driving Debian's chromium.

Skipped when playwright or chromium is missing, except under CI=true, where that fails.
Every test checks that the page raised no error (``pageerror``) and logged no console error.
"""

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from view_helpers import make_run

from glassllm.app.view import api, make_server
from glassllm.app.view.run import Run
from glassllm.models import generation

pytestmark = pytest.mark.browser

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DOCS = Path(__file__).resolve().parents[3] / "docs"


def _missing(reason):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: browser tests must run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[test]')")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        _missing("chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import expect

    # A loaded 2-core machine can take seconds to answer: wait for the page as long as a person
    # would, not Playwright's 5 s default (a wait ends as soon as its condition holds).
    expect.set_options(timeout=30_000)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def start(out_dir):
    server = make_server(out_dir, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("browser") / "out")


@pytest.fixture(scope="module")
def server(out_dir):
    server = start(out_dir)
    yield server
    server.shutdown()
    server.server_close()


class Page:
    """A fresh page on ``url`` that records page errors and console errors."""

    def __init__(self, browser, url):
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(30_000)
        self.errors = []
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on(
            "console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}")
        )
        self.page.goto(url)


@pytest.fixture
def page(browser, server):
    from playwright.sync_api import expect

    opened = Page(browser, f"http://127.0.0.1:{server.port}/")
    expect(opened.page.locator("#info")).to_contain_text("step 60")
    yield opened.page
    opened.context.close()
    # Error answers (4xx) that a test provokes are logged by chromium as failed resources.
    real = [e for e in opened.errors if "the server responded with a status of 4" not in e]
    assert real == []


def generate(page, prompt="def ", tokens=30, **fields):
    from playwright.sync_api import expect

    page.fill("#prompt", prompt)
    page.fill("#max-tokens", str(tokens))
    for name, value in fields.items():
        page.fill(f"#{name}", str(value))
    page.click("#generate")
    expect(page.locator("#tokens .tok.gen")).to_have_count(tokens)


def test_generate_alternatives_and_branch(page, server):
    from playwright.sync_api import expect

    generate(page, "def ", 30, seed=11)
    assert page.locator("#tokens .tok.prompt").all_inner_texts() == ["d", "e", "f", " "]
    # The same tokens as the API (and so as glassllm sample --explain).
    run = server.run
    with run.lock:
        answer = api.generate(
            run, {"prompt": "def ", "max_new_tokens": 30, "seed": 11, "temperature": 0.8}
        )
    shown = page.eval_on_selector_all("#tokens .tok.gen", "s => s.map(x => x.textContent)")
    assert shown == [t["text"].replace("\n", "⏎") for t in answer["tokens"]]
    page.locator("#tokens .tok.gen").nth(5).click()
    expect(page.locator("#alts-cap")).to_contain_text("step 6")
    rows = page.locator("#alts tr.alt")
    assert 1 <= rows.count() <= 5
    ps = [float(t.rstrip("%")) for t in page.locator("#alts td.p span").all_inner_texts()]
    assert ps == sorted(ps, reverse=True) and sum(ps) <= 100.5
    expect(page.locator("#dist-box")).to_be_visible()
    expect(page.locator("#dist .drow")).to_have_count(16)
    # A temperature near 0 puts (almost) all the mass on the most likely token.
    page.locator("#dist-temp").fill("0.05")
    first = float(page.locator("#dist .drow .pv").first.inner_text().rstrip("%"))
    assert first > 90
    if rows.count() >= 2:
        alternative = answer["tokens"][5]["top"][1]["text"].replace("\n", "⏎")
        rows.nth(1).locator("button.branch").click()
        expect(page.locator("#breadcrumb")).to_contain_text("branched at step 6")
        expect(page.locator("#tokens .tok.prompt")).to_have_count(4 + 5 + 1)
        expect(page.locator("#tokens .tok.gen")).to_have_count(30)
        prompt = page.locator("#tokens .tok.prompt").all_inner_texts()
        assert prompt[:9] == ["d", "e", "f", " "] + shown[:5] and prompt[9] == alternative
        page.locator("#breadcrumb .crumb").first.click()  # back to the first generation
        expect(page.locator("#tokens .tok.prompt")).to_have_count(4)


def test_inspect_attention_lens_and_neurons(page):
    from playwright.sync_api import expect

    generate(page, "def ", 20)
    page.click("button[data-tab=inside]")
    page.click("#inspect")
    expect(page.locator("#inspect-summary")).to_have_text("24 tokens")
    expect(page.locator("#badge")).to_contain_text("logits| 0.0e+0")
    expect(page.locator("#attn-layer option")).to_have_count(2)
    expect(page.locator("#attn-grid canvas")).to_have_count(4)
    box = page.locator("#attn").bounding_box()
    page.mouse.click(box["x"] + 5, box["y"] + box["height"] * 3.5 / 24)
    expect(page.locator("#attn-readout")).to_contain_text("query 3")
    page.locator("#attn-grid canvas").nth(3).click()
    assert page.input_value("#attn-layer") == "1" and page.input_value("#attn-head") == "1"
    expect(page.locator("#lens tr")).to_have_count(1 + 3)
    expect(page.locator("#lens tr").nth(3).locator("td")).to_have_count(24)
    page.locator("#mlp-strip .tok").nth(5).click()
    expect(page.locator("#mlp-units .unit-row")).to_have_count(2)
    page.locator("#mlp-units .unit").first.click()
    expect(page.locator("#mlp-active")).to_contain_text("layer 0, unit")
    colours = page.eval_on_selector_all("#mlp-strip .tok", "s => s.map(x => x.style.background)")
    page.locator("#mlp-units .unit-row").nth(1).locator(".unit").nth(2).click()
    expect(page.locator("#mlp-active")).to_contain_text("layer 1, unit")
    assert (
        page.eval_on_selector_all("#mlp-strip .tok", "s => s.map(x => x.style.background)")
        != colours
    )


def test_large_attention_comes_one_layer_at_a_time(page, monkeypatch):
    from playwright.sync_api import expect

    monkeypatch.setattr(api, "ATTENTION_INLINE", 0)  # as for a model too large to send at once
    generate(page, "def ", 10)
    page.click("button[data-tab=inside]")
    page.click("#inspect")
    expect(page.locator("#inspect-summary")).to_have_text("14 tokens")
    # Every thumbnail gets drawn: query 0 attends to key 0 alone, a dark top-left cell.
    page.wait_for_function("""() => [...document.querySelectorAll('#attn-grid canvas')].every(
        c => c.getContext('2d').getImageData(1, 1, 1, 1).data[0] < 100)""")
    page.select_option("#attn-layer", "1")
    box = page.locator("#attn").bounding_box()
    page.mouse.click(box["x"] + 5, box["y"] + box["height"] * 5.5 / 14)
    expect(page.locator("#attn-readout")).to_contain_text("query 5")


def test_graph_edit_and_rerun(page):
    from playwright.sync_api import expect

    page.click("button[data-tab=graph]")
    node = page.locator("svg.graph g.node", has_text="x1  (leaf)")
    expect(node).to_contain_text("data 2.0000")
    expect(node).to_contain_text("grad -1.5000")
    expect(page.locator("svg.graph g.node", has_text="o  (tanh)")).to_contain_text("grad 1.0000")
    w2 = page.locator("svg.graph g.node", has_text="w2  (leaf)")
    expect(w2).to_contain_text("grad 0.0000")
    page.locator("input[data-name=x2]").fill("1")
    page.click("#graph-run")
    expect(w2).to_contain_text("grad 0.0887")  # x2 (1 - tanh(n)^2), n = 1.8814
    page.select_option("#graph-example", "attention")
    expect(page.locator("svg.graph g.node")).to_have_count(18)
    page.locator("input[data-name=x][data-r='0'][data-c='0']").fill("")
    page.click("#graph-run")
    expect(page.locator("#alert")).to_contain_text("input 'x' must be")


def test_bad_input_shows_an_alert_and_the_page_keeps_working(page):
    from playwright.sync_api import expect

    for prompt, tokens, message in [
        ("日本", 5, "cannot be encoded"),
        ("", 5, "the prompt is empty"),
        ("x" * 100_000, 5, "larger than 64 KiB"),
        ("def ", 5000, "max_new_tokens must be between 0 and 500"),
    ]:
        page.fill("#prompt", prompt)
        page.fill("#max-tokens", str(tokens))
        page.click("#generate")
        expect(page.locator("#alert")).to_be_visible()
        expect(page.locator("#alert-text")).to_contain_text(message)
        page.click("#alert-close")
        expect(page.locator("#alert")).to_be_hidden()
    generate(page, "def ", 5)


def test_token_text_is_never_markup(page):
    from playwright.sync_api import expect

    generate(page, "<img src=x onerror=window.__xss=1>", 10)
    expect(page.locator("#tokens .tok.prompt")).to_have_count(34)
    assert page.locator("img").count() == 0
    page.click("button[data-tab=inside]")
    page.click("#inspect")
    expect(page.locator("#inspect-summary")).to_contain_text("32 tokens (cropped")
    assert page.locator("img").count() == 0
    assert page.evaluate("window.__xss === undefined")


def test_dashboard_follows_the_log(browser, out_dir, tmp_path):
    from playwright.sync_api import expect

    copy = tmp_path / "run"
    shutil.copytree(out_dir, copy)
    server = start(copy)
    try:
        opened = Page(browser, f"http://127.0.0.1:{server.port}/")
        page = opened.page
        page.click("button[data-tab=training]")
        expect(page.locator("#train-status")).to_contain_text("4 evaluations")
        expect(page.locator("#train-status")).to_contain_text("33 stats steps")
        expect(page.locator("#chart-loss circle.val")).to_have_count(4)
        parameters = len(server.run.model.state_dict())
        # after the evaluations at 0, 20, 40, and the last one's (60) weights on their own
        expect(page.locator("#hist-step option")).to_have_count(4)
        expect(page.locator("#hists .hist-cell")).to_have_count(parameters)
        assert page.input_value("#hist-step") == "61"
        expect(page.locator("#chart-grad path.line")).to_have_count(2)  # raw + running mean
        assert page.locator("#chart-ratio path.line").count() == len(server.run.model.state_dict())
        with open(copy / "log.jsonl", "a") as log:
            log.write(
                json.dumps({"iter": 80, "train_loss": 0.2, "val_loss": 0.3, "lr": 1e-3}) + "\n"
            )
        expect(page.locator("#train-status")).to_contain_text("5 evaluations", timeout=10_000)
        records = [json.loads(line) for line in (copy / "stats.jsonl").read_text().splitlines()]
        with open(copy / "stats.jsonl", "a") as stats:  # the step after the evaluation at 80
            stats.write(
                json.dumps(
                    {
                        **records[-2],  # [-1]: the last evaluation's histograms
                        "iter": 81,
                        "hist": records[0]["hist"],
                        "grad_norm": 5.0,
                        "clipped": True,
                    }
                )
                + "\n"
            )
        expect(page.locator("#train-status")).to_contain_text("34 stats steps", timeout=10_000)
        expect(page.locator("#hist-step option")).to_have_count(5)
        assert page.input_value("#hist-step") == "81"  # the newest, as the run goes on
        expect(page.locator("#chart-grad circle.clipped")).to_have_count(
            1 + sum(r.get("clipped", False) for r in records)
        )
        make_run(copy, steps=4, eval_interval=2)  # a new run: a new checkpoint, saved atomically
        expect(page.locator("#info")).to_contain_text(
            "checkpoint updated to step 4", timeout=10_000
        )
        page.uncheck("#smooth")
        expect(page.locator("#chart-grad path.line")).to_have_count(1)
        opened.context.close()
        assert opened.errors == []
    finally:
        server.shutdown()
        server.server_close()


def test_screenshots(browser, out_dir, tmp_path):
    """Screenshots of the four tabs, looked at by a person; GLASSLLM_SCREENSHOTS=1 trains a
    longer run first and keeps them in docs/."""
    from playwright.sync_api import expect

    keep = os.environ.get("GLASSLLM_SCREENSHOTS") == "1"
    target = DOCS if keep else tmp_path
    run_dir = (
        make_run(tmp_path / "long", steps=1500, eval_interval=250, stats_interval=10)
        if (keep)
        else out_dir
    )
    evaluations = len((run_dir / "log.jsonl").read_text().splitlines())
    server = start(run_dir)
    try:
        opened = Page(browser, f"http://127.0.0.1:{server.port}/")
        page = opened.page
        expect(page.locator("#info")).to_contain_text("step")
        generate(page, "def ", 160, seed=3)
        page.locator("#tokens .tok.gen").nth(8).click()
        expect(page.locator("#dist .drow")).to_have_count(16)
        page.screenshot(path=str(target / "view-sample.png"))
        page.click("button[data-tab=inside]")
        page.click("#inspect")
        expect(page.locator("#lens tr")).to_have_count(4)
        page.locator("#attn-strip .tok").nth(20).click()
        page.locator("#mlp-strip .tok").nth(20).click()
        page.locator("#mlp-units .unit").first.click()
        expect(page.locator("#mlp-active")).to_contain_text("layer 0, unit")
        page.screenshot(path=str(target / "view-inside.png"), full_page=True)
        page.click("button[data-tab=graph]")
        expect(page.locator("svg.graph g.node")).to_have_count(10)
        page.screenshot(path=str(target / "view-graph.png"))
        page.click("button[data-tab=training]")
        expect(page.locator("#chart-loss circle.val")).to_have_count(evaluations)
        page.screenshot(path=str(target / "view-training.png"), full_page=True)
        opened.context.close()
        assert opened.errors == []
        assert (target / "view-sample.png").stat().st_size > 10_000
    finally:
        server.shutdown()
        server.server_close()


def test_dashboard_only_without_checkpoint(browser, tmp_path, out_dir):
    from playwright.sync_api import expect

    shutil.copy(out_dir / "log.jsonl", tmp_path / "log.jsonl")
    assert Run(tmp_path).model is None
    server = start(tmp_path)
    try:
        opened = Page(browser, f"http://127.0.0.1:{server.port}/")
        expect(opened.page.locator("#info")).to_contain_text("no checkpoint yet")
        expect(opened.page.locator("#train-status")).to_contain_text("4 evaluations")
        assert opened.page.locator("#generate").is_disabled()
        opened.context.close()
        assert opened.errors == []
    finally:
        server.shutdown()
        server.server_close()


def test_another_site_cannot_use_the_api(browser, server, monkeypatch):
    """A page served from another origin (another port on 127.0.0.1) cannot call the API."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class OtherSite(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<!doctype html><title>another site</title>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    calls = []
    generate_route = api.ROUTES[("POST", "/api/generate")]
    monkeypatch.setitem(
        api.ROUTES,
        ("POST", "/api/generate"),
        (lambda run, body: calls.append(body) or generate_route[0](run, body), True),
    )
    other = ThreadingHTTPServer(("127.0.0.1", 0), OtherSite)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        opened = Page(browser, f"http://127.0.0.1:{other.server_address[1]}/")
        result = opened.page.evaluate(
            """async (target) => {
              const out = {};
              const body = JSON.stringify({prompt: "def ", max_new_tokens: 1});
              try {
                await fetch(target + "api/generate", {method: "POST", body,
                  headers: {"Content-Type": "application/json"}});
                out.json = "answered";
              } catch (e) { out.json = e.name; }
              try {
                const r = await fetch(target + "api/generate", {method: "POST", mode: "no-cors",
                  body, headers: {"Content-Type": "text/plain"}});
                out.noCors = r.type;
              } catch (e) { out.noCors = e.name; }
              try { await fetch(target + "api/info"); out.get = "answered"; }
              catch (e) { out.get = e.name; }
              return out;
            }""",
            f"http://127.0.0.1:{server.port}/",
        )
        opened.context.close()
    finally:
        other.shutdown()
        other.server_close()
    assert result["json"] == "TypeError"  # the preflight is never granted
    assert result["get"] == "TypeError"  # no CORS headers: the answer stays unreadable
    assert result["noCors"] in ("opaque", "TypeError")  # sent blind, and refused by the server
    assert calls == []  # the model never ran for another site
    assert [e for e in opened.errors if e.startswith("pageerror")] == []


@pytest.mark.parametrize("temperature, top_k", [(1.0, 46), (0.7, 3), (2.0, 1), (0.3, 5)])
def test_page_reshapes_the_distribution_as_the_sampler_does(page, temperature, top_k):
    """The sliders' softmax(logits / T) over the top-k equals generation.probabilities."""
    import numpy as np

    logits = np.random.default_rng(top_k).normal(size=46).astype(np.float32)
    logits[[3, 7]] = logits.max()  # a tie at the top
    logits[[10, 11, 12]] = np.sort(logits)[-4]  # ties around the k-th
    mine = page.evaluate(
        "async ([z, t, k]) => (await import('/sample.js')).probabilities(z, t, k)",
        [logits.tolist(), temperature, top_k],
    )
    expected = generation.probabilities(logits[None].astype(np.float64), temperature, top_k)[0]
    np.testing.assert_allclose(mine, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("top_p, min_p", [(0.5, None), (None, 0.2), (0.9, 0.05), (1.0, 0.0)])
def test_page_applies_top_p_and_min_p_as_the_sampler_does(page, top_p, min_p):
    """The page's distribution after top-k, top-p and min-p equals sampling.distribution's."""
    import numpy as np

    from glassllm.models import sampling

    logits = np.random.default_rng(7).normal(size=46) * 2.0
    mine = page.evaluate(
        "async ([z, t, k, p, m]) => (await import('/sample.js')).probabilities(z, t, k, p, m)",
        [logits.tolist(), 0.8, 30, top_p, min_p],
    )
    expected = sampling.distribution(logits[None], 0.8, 30, top_p, min_p)[0]
    np.testing.assert_array_equal(np.asarray(mine) > 0, expected > 0)
    np.testing.assert_allclose(mine, expected, rtol=1e-12, atol=1e-15)


def test_the_chat_mode_answers_through_the_models_template(browser, tmp_path):
    """Chat mode on a tiny instruct GGUF: each Send renders the whole conversation, the answer
    is explained token by token and joins the conversation shown above."""
    import sys

    from playwright.sync_api import expect

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_chat import chat_gguf

    path = chat_gguf(tmp_path / "talks.gguf", ends=False)
    server = make_server(tmp_path, path, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    opened = Page(browser, f"http://127.0.0.1:{server.port}/")
    try:
        page = opened.page
        expect(page.locator("#info")).to_contain_text("talks.gguf")
        page.check("#chat-mode")
        expect(page.locator("#generate")).to_have_text("Send")
        page.fill("#max-tokens", "3")
        page.fill("#top-k", "1")
        for turn, message in enumerate(["hello", "more"], start=1):
            page.fill("#prompt", message)
            page.click("#generate")
            expect(page.locator("#chat-log .msg")).to_have_count(2 * turn)
        assert page.locator("#chat-log .msg").all_inner_texts() == [
            "user: hello", "assistant: aaa", "user: more", "assistant: aaa"
        ]  # fmt: skip
        expect(page.locator("#tokens .tok.gen")).to_have_count(3)
        prompt = "".join(page.locator("#tokens .tok.prompt").all_inner_texts())
        assert prompt.count("<|im_start|>") == 4 and "more" in prompt
        page.click("#chat-reset")
        expect(page.locator("#chat-log")).to_be_hidden()
        assert opened.errors == []
    finally:
        opened.context.close()
        server.shutdown()
        server.server_close()
