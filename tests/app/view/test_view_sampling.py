"""/api/generate's top_p and min_p: checked like the other fields, the same tokens as glassllm
sample --explain with the same options, and in the terminal command it prints."""

from __future__ import annotations

import io
import re

import pytest
from view_helpers import make_run

from glassllm.app.config import SampleConfig
from glassllm.app.sample import SampleJob
from glassllm.app.view import api
from glassllm.app.view.fields import ApiError
from glassllm.app.view.run import Run


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("view") / "out")


@pytest.fixture(scope="module")
def run(out_dir):
    return Run(out_dir)


def test_generate_with_top_p_and_min_p_is_glassllm_sample(run, out_dir):
    options = dict(max_new_tokens=20, temperature=1.4, top_k=None, top_p=0.7, min_p=0.05, seed=5)
    answer = api.generate(run, {"prompt": "def ", **options})
    assert answer["options"] == options
    assert "--top-p 0.7 --min-p 0.05 --explain" in answer["command"]
    for token in answer["tokens"]:
        assert abs(sum(a["p"] for a in token["top"]) - 1.0) < 1e-5 or len(token["top"]) == 5
    config = SampleConfig(
        checkpoint=str(out_dir / "ckpt.safetensors"), prompt="def ", num_samples=1, **options
    )
    text = SampleJob.prepare(config).run(io.StringIO())[0]
    assert "".join(t["text"] for t in answer["prompt"] + answer["tokens"]) == text
    unfiltered = api.generate(run, {"prompt": "def ", **options, "top_p": None, "min_p": None})
    assert sum(len(t["top"]) for t in answer["tokens"]) < sum(
        len(t["top"]) for t in unfiltered["tokens"]
    )


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("top_p", 0, "top_p must be a number in (0, 1]"),
        ("top_p", 2, "top_p must be between 0 and 1"),
        ("top_p", "x", "top_p must be a number"),
        ("min_p", 1, "min_p must be a number in [0, 1)"),
        ("min_p", -1, "min_p must be between 0 and 1"),
        ("min_p", True, "min_p must be a number"),
    ],
)
def test_bad_filter_fields(run, field, value, words):
    with pytest.raises(ApiError) as caught:
        api.generate(run, {"prompt": "def ", field: value})
    assert caught.value.status == 400 and words in caught.value.message
    assert re.fullmatch(r"[^\n]+", caught.value.message)
