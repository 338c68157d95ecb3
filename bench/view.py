"""How fast ``glassllm view`` answers on untrained models: each figure the median of ``--repeat``
tries after one untimed (cache-warming) try, one process per side.

    python bench/view.py                 # 5 repetitions of each
    python bench/view.py --repeat 1 --sides api

* side ``page``, the page load (Playwright's chromium): navigation start to first contentful
  paint, and to the header showing the checkpoint (the first API answer drawn);
* side ``api``: per ``--sizes`` model, ``/api/inspect`` of a full context (inspection cache
  emptied, JSON included; attention left out over the inline limit, then one layer's
  ``/api/attention``, the page's request per layer); on the first, ``api.generate``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common as C

SIDES = DEFAULT_SIDES = ("page", "api")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(rounds=1)
    parser.add_argument("--repeat", type=int, default=5, help="timed tries per figure")
    parser.add_argument("--generate", type=int, default=300, help="tokens of api.generate")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "mid"], choices=list(C.SIZES))


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


def server_side(out_dir: Path, tokens: int, repeat: int, generate: int, label: str) -> list:
    """Rows (measurement, figure) of the API's answers, timed in this process."""
    from glassllm.app.view import api
    from glassllm.app.view.run import Run
    from glassllm.app.view.server import encode_json

    run = Run(out_dir)
    ids = [int(i) for i in (list(range(run.model.config.vocab_size)) * 10)[:tokens]]
    config = run.model.config
    big = config.n_layer * config.n_head * tokens * tokens > api.ATTENTION_INLINE

    def inspect():
        run._inspections.clear()  # a new text each time: no cached trace
        return encode_json(api.inspect(run, {"ids": ids}))

    def attention():
        return encode_json(api.attention(run, {"ids": ids, "layer": 0}))

    rows = []
    for name, fn in [("inspect", inspect), ("attention of one layer", attention)][: 1 + big]:
        seconds, body = timed(fn, repeat)
        without = " without attention" if big and fn is inspect else ""
        figure = f"{1e3 * seconds:.0f} ms ({len(body) / 1024:.0f} KiB)"
        rows.append((f"{name}, {tokens} tokens{without}, server time incl. JSON ({label})", figure))
    if generate:
        request = {"prompt": "0", "max_new_tokens": generate, "seed": 1}
        seconds, body = timed(lambda: api.generate(run, request), repeat)
        rows.append((f"generate {len(body['tokens'])} tokens ({label})", f"{seconds:.2f} s"))
    return rows


def page_load(out_dir: Path, repeat: int) -> list:
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
    return [
        ("page load to first contentful paint", f"{C.median(paints):.0f} ms"),
        ("page load to checkpoint info shown", f"{C.median(ready):.0f} ms"),
    ]


def worker(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        if args.worker == "page":
            return {"rows": page_load(make_checkpoint(Path(tmp), args.sizes[0]), args.repeat)}
        rows = []
        for i, size in enumerate(args.sizes):
            tokens = C.SIZES[size]["block_size"]
            generate = 0 if i else args.generate  # on the first model only
            rows += server_side(
                make_checkpoint(Path(tmp), size), tokens, args.repeat, generate, size
            )
        return {"rows": rows}


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    results = C.alternate(args, args.threads[0])
    return {
        side: {"rows": [row for run in runs for row in run["rows"]]}
        for side, runs in results.items()
    }


def render(runs: dict[str, Any]) -> str:
    rows = [row for run in runs.values() for row in run["rows"]]
    machine = C.machine_line(next(iter(runs.values()))["machine"])
    return f"{machine}\n\n{C.table(['measurement (median)', 'figure'], rows)}"


if __name__ == "__main__":
    sys.exit(C.main(sys.modules[__name__]))
