"""How fast ``glassllm view`` answers: page load, inspection, generation, attention of a big model.

    python bench/view.py                 # 5 repetitions of each, medians
    python bench/view.py --repeat 1 --no-browser

Measured, each the median of ``--repeat`` tries (the first try of each, which warms caches, is
not counted):

* **page load to first paint**: Playwright's chromium opens the page of a running viewer; the
  time from navigation start to the browser's first contentful paint
  (``performance.getEntriesByType("paint")``), and to the header showing the checkpoint (the
  first API answer drawn);
* **inspect, 64 tokens**: the server's time for ``/api/inspect`` of 64 tokens on the default
  model (4 layers x 4 heads x 128 wide, context 64): `api.inspect` with the inspection cache
  emptied, plus encoding the answer as JSON, and its size;
* **generate 300 tokens**: `api.generate` with ``max_new_tokens=300`` on the default model;
* **6 x 384 at context 256**: a 6-layer, 6-head, 384-wide model on 256 tokens: ``/api/inspect``
  (attention left out: 6*6*256*256 numbers are over the inline limit) and one layer's
  ``/api/attention``, the request the page makes per layer, each with its JSON size.

The models are untrained (speed does not depend on the weights), saved as a run's checkpoint.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common as C


def make_checkpoint(workdir: Path, size: str) -> Path:
    """A run directory holding an untrained checkpoint of ``size`` and a one-line log."""
    trainer = C.glassllm_trainer(workdir / size, size, max_iters=0)
    trainer.save_checkpoint()
    (trainer.out_dir / "log.jsonl").write_text(
        '{"iter": 0, "train_loss": 4.2, "val_loss": 4.2, "lr": 0.001}\n'
    )
    return trainer.out_dir


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median seconds of ``repeat`` calls of ``fn`` after one untimed call; and its result."""
    return C.median(C.time_calls(fn, repeat, warmup=1)), fn()


def server_side(out_dir: Path, tokens: int, repeat: int, generate: int) -> dict[str, float]:
    from glassllm.app.view import api
    from glassllm.app.view.run import Run
    from glassllm.app.view.server import encode_json

    run = Run(out_dir)
    ids = [int(i) for i in (list(range(run.model.config.vocab_size)) * 10)[:tokens]]

    def inspect():
        run._inspections.clear()  # a new text each time: no cached trace
        return encode_json(api.inspect(run, {"ids": ids}))

    figures: dict[str, float] = {}
    seconds, body = timed(inspect, repeat)
    figures.update(inspect_ms=1e3 * seconds, inspect_kib=len(body) / 1024)
    if run.model.config.n_layer * run.model.config.n_head * tokens * tokens > api.ATTENTION_INLINE:
        seconds, body = timed(
            lambda: encode_json(api.attention(run, {"ids": ids, "layer": 0})), repeat
        )
        figures.update(attention_layer_ms=1e3 * seconds, attention_layer_kib=len(body) / 1024)
    if generate:
        seconds, body = timed(
            lambda: api.generate(run, {"prompt": "0", "max_new_tokens": generate, "seed": 1}),
            repeat,
        )
        figures.update(generate_s=seconds, generated=len(body["tokens"]))
    return figures


def page_load(out_dir: Path, repeat: int) -> dict[str, float]:
    from playwright.sync_api import expect, sync_playwright

    from glassllm.app.view import make_server

    server = make_server(out_dir, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    paints, ready = [], []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=executable, args=["--headless", "--no-sandbox", "--disable-gpu"]
            )
            for attempt in range(repeat + 1):
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                page = context.new_page()
                page.goto(f"http://127.0.0.1:{server.port}/")
                expect(page.locator("#info")).to_contain_text("step")
                shown = page.evaluate("performance.now()")
                paint = page.evaluate(
                    """() => { const p = performance.getEntriesByType('paint')
                         .find(e => e.name === 'first-contentful-paint');
                         return p ? p.startTime : null; }"""
                )
                if attempt:  # the first load warms the browser's and the server's caches
                    paints.append(paint)
                    ready.append(shown)
                context.close()
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    return {"first_paint_ms": C.median(paints), "info_shown_ms": C.median(ready)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--generate", type=int, default=300)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tiny = make_checkpoint(Path(tmp), "tiny")
        mid = make_checkpoint(Path(tmp), "mid")
        rows = []
        if not args.no_browser:
            page = page_load(tiny, args.repeat)
            rows += [
                ("page load to first contentful paint (tiny)", f"{page['first_paint_ms']:.0f} ms"),
                ("page load to checkpoint info shown (tiny)", f"{page['info_shown_ms']:.0f} ms"),
            ]
        small = server_side(tiny, 64, args.repeat, args.generate)
        rows.append(
            (
                "inspect 64 tokens, server time incl. JSON (tiny)",
                f"{small['inspect_ms']:.0f} ms ({small['inspect_kib']:.0f} KiB)",
            )
        )
        if args.generate:
            rows.append(
                (f"generate {small['generated']} tokens (tiny)", f"{small['generate_s']:.2f} s")
            )
        big = server_side(mid, 256, args.repeat, 0)
        rows.append(
            (
                "inspect 256 tokens without attention (6x384)",
                f"{big['inspect_ms']:.0f} ms ({big['inspect_kib']:.0f} KiB)",
            )
        )
        rows.append(
            (
                "attention of one layer, 256 tokens (6x384)",
                f"{big['attention_layer_ms']:.0f} ms ({big['attention_layer_kib']:.0f} KiB)",
            )
        )
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print("| measurement (median) | figure |\n|---|---|")
    for name, figure in rows:
        print(f"| {name} | {figure} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
