"""glassllm._foreign: a Rust panic of a real library (no mock) becomes the caller's one error,
and nothing else is written to stderr; KeyboardInterrupt and SystemExit pass untouched."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from glassllm._foreign import foreign_call, is_panic

ROOT = Path(__file__).resolve().parents[1]


def panicking_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    tokenizer = tokenizers.Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("(a+)+$"), "isolated")
    return tokenizer


def test_a_real_panic_is_recognised_and_becomes_the_callers_error():
    tokenizer = panicking_tokenizer()
    with pytest.raises(BaseException) as raw:  # noqa: PT011 - the library's own, raw
        tokenizer.encode("a" * 5000 + "b")
    assert is_panic(raw.value) and not isinstance(raw.value, Exception)
    with pytest.raises(ValueError, match=r"^failed \(panic: .*retry-limit"):
        with foreign_call(lambda why: ValueError(f"failed ({why})")):
            tokenizer.encode("a" * 5000 + "b")
    assert not is_panic(ValueError("x")) and not is_panic(KeyboardInterrupt())


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
def test_interrupts_and_exits_pass_through_untouched(kind):
    with pytest.raises(kind):
        with foreign_call(ValueError):
            raise kind()


def test_the_panic_leaves_nothing_on_stderr_and_stderr_works_after():
    code = (
        "import sys, tokenizers\n"
        "from tokenizers import models, pre_tokenizers\n"
        "from glassllm._foreign import foreign_call\n"
        "t = tokenizers.Tokenizer(models.BPE(vocab={'a': 0}, merges=[]))\n"
        "t.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex('(a+)+$'), 'isolated')\n"
        "try:\n"
        "    with foreign_call(ValueError):\n"
        "        t.encode('a' * 5000 + 'b')\n"
        "except ValueError as err:\n"
        "    print('caught', err)\n"
        "print('stderr still works', file=sys.stderr)\n"
    )
    pytest.importorskip("tokenizers")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUST_BACKTRACE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("caught panic: "), done.stdout
    assert done.stderr == "stderr still works\n", done.stderr
