"""A seeded fuzz of the three boundaries of issue 20 (classes 1 to 3), against the library, the
viewer's API functions and the command line: mutated JSON-lines logs, mutated tokenizer files
and hostile prompts. The only outcomes allowed are a good answer or the documented error (a
ValueError / TokenizerError in the library, an ApiError 4xx in the viewer, one line and status 2
on the command line). ``GLASSLLM_FUZZ_SCALE=10`` runs ten times as many cases."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import optional

from glassllm.app.run_log import kept_log, read_log
from glassllm.app.stats import kept_lines, read_stats
from glassllm.app.view import api
from glassllm.app.view.fields import ApiError
from glassllm.app.view.run import Run
from glassllm.app.view.server import encode_json

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "hf_gpt2_tiny"
SCALE = int(os.environ.get("GLASSLLM_FUZZ_SCALE", "1"))
SEED = 20261202
REGEXES = ["(a+)+$", "(a|aa)+$", "(a*)*b", "(?:x+x+)+y", "", "(", "\\p{L}+", "[^\\s]+",
           "(?<=a)b", "(a{1,1000}){1,1000}$", "\\", "(?i)ǅ+", ".*.*.*.*=.*"]  # fmt: skip
PROMPTS = ["a" * 5000 + "b", "\ud800", "x\udcff", "", "\0", "<|endoftext|>" * 50, "é" * 3000,
           "🙂" * 500, "\r\n\t", "aaaa" * 1000 + "!", "x" * 29 + "y" * 100]  # fmt: skip


def mutated_line(good: bytes, rng) -> bytes:
    """``good`` unchanged, or one of the ways a line goes bad: cut, a flipped bit, nested deep,
    NaN or a huge number put in, bytes that are not UTF-8, a huge line, random bytes."""
    kind = int(rng.integers(0, 10))
    if kind == 0:
        return good
    if kind == 1:
        return good[: int(rng.integers(0, len(good)))]
    if kind == 2:
        flipped = bytearray(good)
        flipped[int(rng.integers(0, len(good)))] ^= 1 << int(rng.integers(0, 8))
        return bytes(flipped).replace(b"\n", b" ")
    if kind == 3:
        depth = int(rng.choice([65, 1000, 200_000]))
        return b"[" * depth + b"]" * depth
    if kind == 4:
        value = rng.choice([b"NaN", b"-Infinity", b"1e999", b"9" * 5000, b"true", b'"3"'])
        return good.replace(b"1.5", bytes(value), 1).replace(b"3", bytes(value), 1)
    if kind == 5:
        return good[:-1] + b', "x": "\xff\xc3"}'
    if kind == 6:
        return b'{"iter": 1, "pad": "' + b"x" * int(rng.choice([1000, 5 << 20])) + b'"}'
    if kind == 7:
        noise = rng.integers(0, 256, int(rng.integers(1, 200))).astype(np.uint8).tolist()
        return bytes(noise).replace(b"\n", b" ")
    if kind == 8:
        return good.replace(b'"iter"', b'"iter": 2, "iter"', 1)  # a key twice
    return b"{" * 3 + good + b"}" * 3


def test_fuzz_jsonl_logs_through_every_reader(tmp_path):
    rng = np.random.default_rng(SEED)
    good_log = json.dumps({"iter": 3, "train_loss": 1.5, "val_loss": 1.6, "lr": 0.001})
    good_stats = json.dumps({"iter": 3, "loss": 1.5, "lr": 0.001, "grad_norm": 0.5,
                             "clipped": False, "params": {"w": [0.1, 0.01, -3.0]}})  # fmt: skip
    for case in range(60 * SCALE):
        out = tmp_path / f"run{case}"
        out.mkdir()
        for name, good in (("log.jsonl", good_log), ("stats.jsonl", good_stats)):
            lines = [mutated_line(good.encode(), rng) for _ in range(int(rng.integers(1, 12)))]
            ending = b"\n" if rng.random() < 0.7 else b""
            (out / name).write_bytes(b"\n".join(lines) + ending)
        warnings = []
        for text in (kept_log(out / "log.jsonl", 5, None, warnings.append),
                     kept_lines(out / "stats.jsonl", 5, warnings.append)):  # fmt: skip
            for line in text.split("\n")[:-1]:  # not splitlines: U+2028 is no line end
                assert isinstance(json.loads(line)["iter"], int), (case, line[:200])
        assert all("\n" not in w for w in warnings)
        for read in (read_log, read_stats):
            for live in (False, True):
                lines = read(out / "log.jsonl", live=live)
                assert lines.skipped + len(lines.records) <= 12
        answer = api.log(Run(out), {"since": str(int(rng.integers(-2, 5)))})
        assert json.loads(encode_json(answer)) == json.loads(json.dumps(answer, allow_nan=False))


def _mutated_tokenizer(spec: dict, rng) -> str:
    spec = json.loads(json.dumps(spec))
    kind = int(rng.integers(0, 6))
    regex = str(rng.choice(REGEXES))
    if kind == 0:
        invert = bool(rng.random() < 0.5)
        spec["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": regex},
                                 "behavior": "Isolated", "invert": invert}  # fmt: skip
    elif kind == 1:
        spec["normalizer"] = {"type": "Replace", "pattern": {"Regex": regex}, "content": "a"}
    elif kind == 2:
        spec["decoder"] = {"type": "Replace", "pattern": {"Regex": regex}, "content": "aa"}
    elif kind == 3:
        text = json.dumps(spec)
        return text[: int(rng.integers(0, len(text)))]
    elif kind == 4:
        data = bytearray(json.dumps(spec).encode())
        at = int(rng.integers(0, len(data)))
        data[at] ^= 1 << int(rng.integers(0, 8))
        return data.decode("utf-8", errors="surrogateescape")
    else:
        spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Removed",
             "invert": False}, spec["pre_tokenizer"]]}  # fmt: skip
    return json.dumps(spec)


def test_fuzz_tokenizer_files_and_prompts_in_the_library():
    optional("tokenizers")
    from glassllm.data.bpe import BPETokenizer

    rng = np.random.default_rng(SEED + 1)
    spec = json.loads((FIXTURE / "tokenizer.json").read_text())
    built = 0
    for case in range(60 * SCALE):
        text = _mutated_tokenizer(spec, rng)
        try:
            tokenizer = BPETokenizer.from_json(text)
        except ValueError:
            continue
        built += 1
        for prompt in rng.choice(PROMPTS, 3):
            try:
                ids = tokenizer.encode(str(prompt))
                tokenizer.decode(ids)
            except ValueError as err:
                assert "\n" not in str(err), (case, str(err)[:300])
        for token_id in (0, tokenizer.vocab_size - 1, tokenizer.vocab_size + 5):
            try:
                tokenizer.decode([token_id])
                tokenizer.token_repr(token_id)
            except ValueError:
                pass
    assert built > 10 * SCALE  # the fuzz reached encode and decode, not only the parser


def test_fuzz_prompts_through_the_viewer_and_the_command_line(tmp_path):
    optional("tokenizers")
    rng = np.random.default_rng(SEED + 2)
    spec = json.loads((FIXTURE / "tokenizer.json").read_text())
    model = tmp_path / "gpt2"
    shutil.copytree(FIXTURE, model)
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False},
        spec["pre_tokenizer"]]}  # fmt: skip
    (model / "tokenizer.json").write_text(json.dumps(spec))
    run = Run(model, checkpoint=model)
    alphabet = ["a", "b", " ", "\ud800", "\udcff", "é", "\0", "\n", "🙂", "<|endoftext|>"]
    for _ in range(40 * SCALE):
        prompt = "".join(rng.choice(alphabet, int(rng.integers(1, 60))))
        if rng.random() < 0.3:
            prompt = "a" * int(rng.integers(100, 6000)) + prompt
        for endpoint in (api.generate, api.distribution):
            try:
                endpoint(run, {"prompt": prompt, "max_new_tokens": 1})
            except ApiError as err:
                assert 400 <= err.status < 500 and "\n" not in err.message, err.message
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(3 * SCALE):
        raw = bytes(rng.integers(0, 256, int(rng.integers(1, 20))).astype(np.uint8).tolist())
        raw = raw.replace(b"\0", b"a")  # argv cannot hold NUL
        prompt = raw if rng.random() < 0.5 else b"a" * 5000 + raw
        done = subprocess.run(
            [sys.executable, "-m", "glassllm", "sample", "--checkpoint", str(model), "--prompt",
             prompt, "--max-new-tokens", "2"],
            capture_output=True, timeout=120, env=env,
        )  # fmt: skip
        err = done.stderr.decode(errors="replace")
        assert done.returncode in (0, 2), err[-2000:]
        assert "Traceback" not in err and "panicked" not in err, err[-2000:]
        if done.returncode == 2:
            assert len(err.strip().splitlines()) == 1, err
