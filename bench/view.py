"""How fast ``glassllm view``'s API answers on untrained models: each figure the median of
``--repeat`` tries after one untimed (cache-warming) try.

    python bench/view.py                 # 5 repetitions of each
    python bench/view.py --repeat 1 --sizes tiny

Per ``--sizes`` model, ``/api/inspect`` of a full context (inspection cache emptied, JSON
included; attention left out over the inline limit, then one layer's ``/api/attention``, the
page's request per layer); on the first, ``api.generate``. (The page-load side, Playwright's
first contentful paint, was removed in issue 19; its figures stand in LOG.md.)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import common as C

SIDES = DEFAULT_SIDES = ("api",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(rounds=1)
    parser.add_argument("--repeat", type=int, default=5, help="timed tries per figure")
    parser.add_argument("--generate", type=int, default=300, help="tokens of api.generate")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "mid"], choices=list(C.SIZES))


def api_rows(workdir: Path, repeat: int, generate: int, size: str) -> dict[str, str]:
    """{measurement: figure} of the API's answers on a full context, timed in this process, of
    a run under ``workdir``: an untrained checkpoint of ``size`` and a one-line log."""
    from glassllm.app.view import api
    from glassllm.app.view.run import Run
    from glassllm.app.view.server import encode_json

    trainer = C.glassllm_trainer(workdir / size, size, max_iters=0)
    trainer.save_checkpoint()
    log = '{"iter": 0, "train_loss": 4.2, "val_loss": 4.2, "lr": 0.001}\n'
    (trainer.out_dir / "log.jsonl").write_text(log)
    run, config = Run(trainer.out_dir), C.SIZES[size]
    tokens = config["block_size"]
    ids = [i % C.VOCAB_SIZE for i in range(tokens)]
    big = config["n_layer"] * config["n_head"] * tokens * tokens > api.ATTENTION_INLINE

    def inspect() -> bytes:
        run._inspections.clear()  # a new text each time: no cached trace
        return encode_json(api.inspect(run, {"ids": ids}))

    attention = lambda: encode_json(api.attention(run, {"ids": ids, "layer": 0}))
    rows = {}
    without = " without attention" if big else ""
    for name, fn in [("inspect", inspect), ("attention of one layer", attention)][: 1 + big]:
        seconds, body = C.median(C.time_calls(fn, repeat, warmup=1)), fn()
        figure = f"{1e3 * seconds:.0f} ms ({len(body) / 1024:.0f} KiB)"
        what = f"{tokens} tokens{without if fn is inspect else ''}, server time incl. JSON"
        rows[f"{name}, {what} ({size})"] = figure
    if generate:
        request = {"prompt": "0", "max_new_tokens": generate, "seed": 1}
        generated = lambda: api.generate(run, request)
        seconds, body = C.median(C.time_calls(generated, repeat, warmup=1)), generated()
        rows[f"generate {len(body['tokens'])} tokens ({size})"] = f"{seconds:.2f} s"
    return rows


def worker(args: argparse.Namespace) -> dict[str, Any]:
    rows = {}
    C.prepare_worker(args)
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            generate = args.generate if size == args.sizes[0] else 0  # on the first only
            rows |= api_rows(Path(tmp), args.repeat, generate, size)
        return {measurement: {"median": figure} for measurement, figure in rows.items()}


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    groups = C.summarise_groups(C.alternate(args, args.threads[0]))
    return {"view": dict(config={"repeat": args.repeat}, group="measurement", groups=groups)}


C.run_as_script(__name__)
