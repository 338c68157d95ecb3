"""``glassllm train`` on several processes: real ``mpiexec -n 2 python -m glassllm train`` runs
of a tiny model (marker ``mpi``; skipped without mpi4py, failing under CI=true), their
equivalence with one process accumulating gradients, resuming with another number of ranks,
bad launches, and every fault ending all ranks with the last checkpoint usable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TEXT
from mpi_jobs import (
    clean_env,
    find_mpiexec,
    mpi_missing,
    run_job,
    seconds_since,
    start_job,
    watchdog,
)

from glassllm.checkpoint import read

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "app" / "train_worker.py"
TINY = [
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--n-embd",
    "16",
    "--block-size",
    "8",
    "--eval-iters",
    "4",
    "--sample-tokens",
    "0",
    "--warmup-iters",
    "2",
    "--lr-decay-iters",
    "40",
    "--batch-size",
    "8",
]


@pytest.fixture(scope="module")
def mpiexec() -> str:
    """The launcher; skips the test without mpi4py and MPI (fails instead under CI=true)."""
    reason = mpi_missing()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the MPI tests cannot run: {reason}")
        pytest.skip(reason)
    return find_mpiexec()


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    return path


def glassllm_train(
    mpi_exe: str | None, ranks: int, *args, worker=None, cwd, launcher_args=(), shell=False
):
    """Run ``glassllm train`` (through tests/app/train_worker.py when ``worker`` = (fault, rank,
    step, record_dir)) on ``ranks`` processes (0: plain python, no launcher) in ``cwd``, killed
    (and the test failed) if it hangs; ``shell``: start each rank through ``sh -c``, as job
    scripts do. Returns the process and, with a worker, the seconds from its fault to the end
    of the job (None without a fault)."""
    if worker is None:
        command = [sys.executable, "-m", "glassllm", "train", *map(str, args)]
    else:
        command = [sys.executable, str(WORKER), *map(str, worker), "--", "train", *map(str, args)]
    if shell:
        command = ["sh", "-c", '"$@"; exit $?', "sh", *command]
    if ranks:
        command = [mpi_exe, *launcher_args, "-n", str(ranks), *command]
    out = run_job(command, cwd)
    if worker is None or worker[0] == "none":
        return out, None
    fault_file = Path(worker[3]) / "fault"
    seconds = seconds_since(fault_file)
    fault_file.unlink()  # the next run in the same directory records its own
    return out, seconds


def tensors(out_dir: Path) -> dict[str, np.ndarray]:
    return read(out_dir / "ckpt.safetensors").tensors


def assert_same_tensors(a: Path, b: Path) -> None:
    first, second = tensors(a), tensors(b)
    assert first.keys() == second.keys()
    for name in first:
        assert np.array_equal(first[name], second[name]), name


def iteration(out_dir: Path) -> int:
    return read(out_dir / "ckpt.safetensors").metadata["iteration"]


def losses(out_dir: Path) -> list[tuple[float, float]]:
    lines = (out_dir / "log.jsonl").read_text().splitlines()
    return [(r["train_loss"], r["val_loss"]) for r in map(json.loads, lines)]


def assert_samples(out_dir: Path, cwd: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "glassllm",
            "sample",
            "--checkpoint",
            out_dir / "ckpt.safetensors",
            "--max-new-tokens",
            "10",
            "--num-samples",
            "1",
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    assert out.returncode == 0 and out.stdout.strip(), out.stderr


# ------------------------------------------------------------------------------ no MPI needed


def test_plain_train_never_imports_mpi4py(text, tmp_path):
    code = (
        "import sys\nfrom glassllm.app import main\n"
        f"rc = main(['train', '--data', {str(text)!r}, '--max-iters', '2', "
        f"'--out-dir', {str(tmp_path / 'o')!r}, *{TINY!r}])\n"
        "print(rc, 'mpi4py' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split()[-2:] == ["0", "False"], out.stderr


@pytest.mark.parametrize("rank", [0, 1])
def test_a_launcher_without_mpi4py_is_one_line_from_rank_0(text, tmp_path, rank):
    code = (
        "import sys; sys.modules['mpi4py'] = None  # as if not installed\n"
        "from glassllm.app import main\n"
        f"sys.exit(main(['train', '--data', {str(text)!r}, *{TINY!r}]))\n"
    )
    env = clean_env(PMI_RANK=str(rank), PMI_SIZE="2")
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    if rank == 0:
        assert out.stderr.count("\n") == 1 and "pip install -e '.[mpi]'" in out.stderr
    else:
        assert out.stderr == ""
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ real mpiexec


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--grad-accum", "0"], "grad_accum must be at least 1, got 0"),
        (
            ["--batch-size", "6", "--grad-accum", "2"],
            "batch_size 6 does not split into 2 ranks x 2 micro-batches (4 parts)",
        ),
        (["--dist-timeout", "0"], "dist-timeout must be > 0"),
    ],
)
def test_bad_launches_are_one_line_from_rank_0_before_any_work(
    mpiexec, text, tmp_path, args, message
):
    out, _ = glassllm_train(mpiexec, 2, "--data", text, *TINY, *args, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("glassllm: error: "), out.stderr
    assert message in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.mpi
def test_ranks_given_different_options_are_refused_at_the_start(mpiexec, text, tmp_path):
    rank = [sys.executable, "-m", "glassllm", "train", "--data", str(text), *TINY]
    command = [mpiexec, "-n", "1", *rank, ":", "-n", "1", *rank, "--lr", "0.01"]
    out = run_job(command, tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert "rank 1 has a different configuration: lr 0.01 (rank 0: 0.001)" in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.mpi
def test_resume_given_to_one_rank_only_is_named(mpiexec, text, tmp_path):
    out, _ = glassllm_train(mpiexec, 0, "--data", text, *TINY, "--max-iters", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    before = (tmp_path / "out" / "ckpt.safetensors").read_bytes()
    train = [sys.executable, "-m", "glassllm", "train", "--max-iters", "4"]
    fresh = [*train, "--data", str(text), *TINY]
    for ranks, message in (
        ([[*train, "--resume"], fresh], "--resume is given to rank 0 but not to rank 1 of 2"),
        ([fresh, [*train, "--resume"]], "--resume is given to rank 1 but not to rank 0 of 2"),
        (
            [[*train, "--resume"], [*train, "--resume", "--max-iters", "5", "--lr", "0.01"]],
            "rank 1 has a different configuration: lr 0.01 (rank 0: not given); "
            "max_iters 5 (rank 0: 4)",
        ),
    ):
        out = run_job([mpiexec, "-n", "1", *ranks[0], ":", "-n", "1", *ranks[1]], tmp_path)
        assert out.returncode == 2
        assert out.stderr == f"glassllm: error: {message}" + (
            ": give it to every rank or to none\n" if "resume" in message else "\n"
        )
    assert (tmp_path / "out" / "ckpt.safetensors").read_bytes() == before


@pytest.mark.mpi
def test_ranks_reading_different_text_are_refused_naming_them(mpiexec, tmp_path):
    """``--data text.txt`` in another working directory (or on another machine) is another
    file: the ranks compare digests of the text before training."""
    # the same characters (the same vocabulary, the same model), another text
    for folder, text in (("a", TEXT), ("b", TEXT.replace("lazy dog", "dog lazy"))):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "text.txt").write_text(text)
    rank = [sys.executable, "-m", "glassllm", "train", "--data", "text.txt", *TINY]
    rank += ["--max-iters", "2", "--out-dir", str(tmp_path / "run")]
    same = [mpiexec, "-n", "1", "-wdir", "a", *rank, ":", "-n", "1", "-wdir", "a", *rank]
    out = run_job(same, tmp_path)
    assert out.returncode == 0, out.stderr
    before = (tmp_path / "run" / "ckpt.safetensors").read_bytes()
    rank.append("--overwrite")
    other = [mpiexec, "-n", "1", "-wdir", "a", *rank, ":", "-n", "1", "-wdir", "b", *rank]
    out = run_job(other, tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(
        "glassllm: error: rank 1 read a different text from --data 'text.txt' than rank 0 "
        "(sha256 rank 0 "
    )
    assert "give every rank the same file" in out.stderr
    assert (tmp_path / "run" / "ckpt.safetensors").read_bytes() == before  # nothing replaced


@pytest.mark.mpi
def test_two_ranks_equal_one_process_accumulating_two_micro_batches(mpiexec, text, tmp_path):
    # 8 evaluation batches: two groups of 4 (one forward each), one group per rank
    common = ["--data", text, *TINY, "--max-iters", "20", "--eval-interval", "10"]
    common += ["--eval-iters", "8"]
    # The README's case: as many BLAS threads in every process (here one, a rank's share of
    # the two cores such a box has, and what it gives each rank by default).
    for ranks, extra, name in (
        (2, ["--blas-threads", "1"], "ranks"),
        (0, ["--grad-accum", "2", "--blas-threads", "1"], "accum"),
        (0, [], "plain"),
    ):
        out, _ = glassllm_train(mpiexec, ranks, *common, *extra, "--out-dir", name, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
    ranks, accum, plain = (tmp_path / name for name in ("ranks", "accum", "plain"))
    assert_same_tensors(ranks, accum)
    assert losses(ranks) == losses(accum)  # evaluations split over ranks: the same mean
    # Against whole batches on one process only the order of the sums differs.
    worst = max(
        float(np.abs(a - b).max())
        for a, b in zip(tensors(ranks).values(), tensors(plain).values(), strict=True)
    )
    assert 0 < worst < 1e-4
    assert np.abs(np.subtract(losses(ranks), losses(plain))).max() < 1e-4


@pytest.mark.mpi
def test_a_llama_run_on_two_ranks_equals_two_micro_batches(mpiexec, text, tmp_path):
    """Data parallelism is generic over parameters: the Llama recipe too."""
    common = ["--data", text, *TINY, "--arch", "llama", "--n-head", "4"]
    common += ["--max-iters", "6", "--eval-interval", "3", "--eval-iters", "2"]
    for ranks, extra, name in ((2, [], "ranks"), (0, ["--grad-accum", "2"], "accum")):
        out, _ = glassllm_train(mpiexec, ranks, *common, *extra, "--out-dir", name, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
    assert_same_tensors(tmp_path / "ranks", tmp_path / "accum")
    assert "blocks.0.mlp.gate.weight" in tensors(tmp_path / "ranks")


@pytest.mark.mpi
def test_resume_one_then_two_then_one_process_continues_the_same_run(mpiexec, text, tmp_path):
    common = ["--data", text, *TINY, "--eval-interval", "5"]
    out, _ = glassllm_train(
        mpiexec,
        0,
        *common,
        "--max-iters",
        "15",
        "--grad-accum",
        "2",
        "--out-dir",
        "whole",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    legs = [
        (0, ["--max-iters", "5", "--grad-accum", "2", *common]),
        (2, ["--resume", "--max-iters", "10", "--grad-accum", "1"]),  # N*K = 2 as before
        (0, ["--resume", "--max-iters", "15", "--grad-accum", "2"]),
    ]
    for ranks, args in legs:
        out, _ = glassllm_train(mpiexec, ranks, *args, "--out-dir", "legs", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
    assert iteration(tmp_path / "legs") == 15
    assert_same_tensors(tmp_path / "legs", tmp_path / "whole")
    assert losses(tmp_path / "legs") == losses(tmp_path / "whole")


@pytest.mark.mpi
def test_dropout_on_two_ranks_resumes_bit_for_bit(mpiexec, text, tmp_path):
    """Rank 1's dropout stream is a function of (seed, rank, step): nothing to save for it."""
    common = ["--data", text, *TINY, "--dropout", "0.2", "--eval-interval", "3"]
    out, _ = glassllm_train(
        mpiexec, 2, *common, "--max-iters", "6", "--out-dir", "whole", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    out, _ = glassllm_train(
        mpiexec, 2, *common, "--max-iters", "3", "--out-dir", "legs", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    out, _ = glassllm_train(
        mpiexec, 2, "--resume", "--max-iters", "6", "--out-dir", "legs", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert_same_tensors(tmp_path / "legs", tmp_path / "whole")
    # Each rank has its own masks: 2 ranks are not 1 process accumulating 2 micro-batches.
    out, _ = glassllm_train(
        mpiexec,
        0,
        *common,
        "--max-iters",
        "6",
        "--grad-accum",
        "2",
        "--out-dir",
        "one",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert not np.array_equal(
        tensors(tmp_path / "one")["wte.weight"], tensors(tmp_path / "whole")["wte.weight"]
    )


# ------------------------------------------------------------------------------ faults


def fault_run(
    mpi_exe, tmp_path, text, fault, *extra, launcher_args=(), shell=False, rank=1, step=3
):
    records = tmp_path / "records"
    records.mkdir(exist_ok=True)
    return glassllm_train(
        mpi_exe,
        2,
        "--data",
        text,
        *TINY,
        "--max-iters",
        "50",
        "--eval-interval",
        "2",
        *extra,
        worker=(fault, rank, step, records),
        cwd=tmp_path,
        launcher_args=launcher_args,
        shell=shell,
    )


@pytest.mark.mpi
def test_an_exception_on_one_rank_ends_every_rank_naming_it(mpiexec, text, tmp_path):
    out, seconds = fault_run(mpiexec, tmp_path, text, "raise", "--dist-timeout", "60")
    assert out.returncode != 0 and seconds < 30  # at once: not after the 60 s timeout
    assert (
        "glassllm: rank 1 of 2: failed: RuntimeError: deliberate failure for the test" in out.stderr
    )
    assert iteration(tmp_path / "out") == 2  # the last evaluation's checkpoint
    assert_samples(tmp_path / "out", tmp_path)


@pytest.mark.mpi
def test_a_desynchronised_rank_is_caught_at_the_next_evaluation(mpiexec, text, tmp_path):
    out, seconds = fault_run(mpiexec, tmp_path, text, "desync", "--dist-timeout", "60")
    assert out.returncode != 0 and seconds < 30  # at the next evaluation, not the timeout
    assert "replicas differ from rank 0: rank 1 (wte.weight)" in out.stderr
    assert iteration(tmp_path / "out") == 2  # the desynchronised state was never saved
    assert_samples(tmp_path / "out", tmp_path)


@pytest.mark.mpi
def test_resume_on_ranks_that_do_not_split_the_batch_is_one_line(mpiexec, text, tmp_path):
    out, _ = glassllm_train(mpiexec, 0, "--data", text, *TINY, "--max-iters", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    before = tensors(tmp_path / "out")
    out, _ = glassllm_train(
        mpiexec, 2, "--resume", "--max-iters", "4", "--grad-accum", "3", cwd=tmp_path
    )
    assert out.returncode == 2
    assert out.stderr == (
        "glassllm: error: batch_size 8 does not split into 2 ranks x 3 "
        "micro-batches (6 parts); with 2 ranks grad_accum 1, 2, 4 would\n"
    )
    after = tensors(tmp_path / "out")
    assert all(np.array_equal(before[name], after[name]) for name in before)


@pytest.mark.mpi
def test_an_error_of_rank_0_alone_ends_every_rank_with_one_line(mpiexec, text, tmp_path):
    """The disk fills up under rank 0's checkpoint: the others, waiting at the next collective,
    are ended with it (not left to the timeout), and the previous checkpoint stays."""
    out, seconds = fault_run(
        mpiexec, tmp_path, text, "disk-full", "--dist-timeout", "60", rank=0, step=4
    )
    assert out.returncode == 2 and seconds < 30, out.stderr  # not after the 60 s timeout
    assert (
        "glassllm: rank 0 of 2: training stopped at step 4: [Errno 28] No space left on "
        "device" in out.stderr
    )
    assert iteration(tmp_path / "out") == 2
    assert_samples(tmp_path / "out", tmp_path)


@pytest.mark.mpi
def test_a_hung_rank_is_named_within_the_timeout(mpiexec, text, tmp_path):
    out, seconds = fault_run(mpiexec, tmp_path, text, "hang", "--dist-timeout", "3")
    assert out.returncode != 0 and seconds < 3 + 10, out.stderr  # the timeout, then the abort
    named = [line for line in out.stderr.splitlines() if "stopped answering" in line]
    assert len(named) == 1 and "rank 1 stopped answering: no word for 3 s" in named[0]
    assert iteration(tmp_path / "out") == 2
    assert_samples(tmp_path / "out", tmp_path)


@pytest.mark.mpi
def test_a_killed_rank_is_named_within_the_timeout(mpiexec, text, tmp_path):
    """Without the launcher's own clean-up (MPICH's -disable-auto-cleanup, and a shell between
    it and the rank, as under launchers that do not clean up), the timeout names the rank; with
    it (the default) the launcher ends the job at once (naming the process id)."""
    version = subprocess.run(
        [mpiexec, "--version"], capture_output=True, text=True, timeout=60
    ).stdout
    if "HYDRA" not in version.upper():
        pytest.skip("-disable-auto-cleanup is an MPICH Hydra option")
    out, seconds = fault_run(
        mpiexec,
        tmp_path,
        text,
        "kill",
        "--dist-timeout",
        "3",
        launcher_args=["-disable-auto-cleanup"],
        shell=True,
    )
    assert out.returncode != 0 and seconds < 3 + 10, out.stderr  # the timeout, then the abort
    named = [line for line in out.stderr.splitlines() if "stopped answering" in line]
    assert len(named) == 1 and "rank 1 stopped answering: no word for 3 s" in named[0]
    assert iteration(tmp_path / "out") == 2
    assert_samples(tmp_path / "out", tmp_path)
    out, seconds = fault_run(  # a new run in the same out_dir: --overwrite
        mpiexec, tmp_path, text, "kill", "--dist-timeout", "60", "--overwrite"
    )
    assert out.returncode != 0 and seconds < 30, out.stderr  # the launcher ended the job
    assert_samples(tmp_path / "out", tmp_path)


@pytest.mark.mpi
def test_ctrl_c_stops_every_rank_at_one_step_and_resume_continues_bit_for_bit(
    mpiexec, text, tmp_path
):
    records = tmp_path / "records"
    records.mkdir()
    common = ["--data", str(text), *TINY, "--eval-interval", "2"]
    command = [
        mpiexec,
        "-n",
        "2",
        sys.executable,
        str(WORKER),
        "none",
        "0",
        "0",
        str(records),
        "--",
        "train",
        *common,
        "--max-iters",
        "100000",
    ]
    with start_job(command, tmp_path) as launcher, watchdog(launcher):
        try:
            for line in launcher.stdout:  # rank 0's evaluations: training is under way
                if line.startswith("step 4:"):
                    break
            launcher.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal does to mpiexec
            rest, err = launcher.communicate(timeout=30)
        finally:
            launcher.kill()
    assert launcher.returncode == 130, err
    stopped = {path.name: int(path.read_text()) for path in records.iterdir()}
    assert stopped.keys() == {"rank0", "rank1"} and stopped["rank0"] == stopped["rank1"]
    assert iteration(tmp_path / "out") == stopped["rank0"]
    assert "Continue with: glassllm train --resume" in rest
    assert_samples(tmp_path / "out", tmp_path)
    end = stopped["rank0"] + 3
    out, _ = glassllm_train(mpiexec, 2, "--resume", "--max-iters", end, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out, _ = glassllm_train(
        mpiexec,
        0,
        *common,
        "--max-iters",
        end,
        "--grad-accum",
        "2",
        "--out-dir",
        "whole",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert_same_tensors(tmp_path / "out", tmp_path / "whole")


def prepared_corpus(directory: Path, seed: int = 0) -> Path:
    """A `glassllm prepare` output of a synthetic corpus, in shards of 101 tokens."""
    from corpus_files import write_corpus

    from glassllm.data.prepare import PrepareOptions, prepare
    from glassllm.data.sources import find_sources

    root = write_corpus(directory.parent / f"corpus-{directory.parent.name}-{seed}", seed=seed)
    prepare(find_sources([str(root)]), directory, PrepareOptions("char", shard_tokens=101))
    return directory


@pytest.mark.mpi
def test_two_ranks_on_a_prepared_corpus_equal_two_micro_batches(mpiexec, tmp_path):
    """Every rank maps the same shards and draws the same batches from them."""
    data = prepared_corpus(tmp_path / "prepared")
    common = ["--data", data, *TINY, "--max-iters", "10", "--eval-interval", "5"]
    common += ["--eval-iters", "8", "--blas-threads", "1"]
    for ranks, extra, name in ((2, [], "ranks"), (0, ["--grad-accum", "2"], "accum")):
        out, _ = glassllm_train(mpiexec, ranks, *common, *extra, "--out-dir", name, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
    assert_same_tensors(tmp_path / "ranks", tmp_path / "accum")
    assert losses(tmp_path / "ranks") == losses(tmp_path / "accum")


@pytest.mark.mpi
def test_ranks_mapping_different_prepared_corpora_are_refused_naming_them(mpiexec, tmp_path):
    for folder, seed in (("a", 0), ("b", 1)):  # the same vocabulary, other documents
        (tmp_path / folder).mkdir()
        prepared_corpus(tmp_path / folder / "prepared", seed)
    rank = [sys.executable, "-m", "glassllm", "train", "--data", "prepared", *TINY]
    rank += ["--max-iters", "2", "--out-dir", str(tmp_path / "run")]
    other = [mpiexec, "-n", "1", "-wdir", "a", *rank, ":", "-n", "1", "-wdir", "b", *rank]
    out = run_job(other, tmp_path)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(
        "glassllm: error: rank 1 read a different prepared corpus (manifest) from --data "
        "'prepared' than rank 0 (sha256 rank 0 "
    )
    assert "give every rank the same directory, prepared once" in out.stderr
    assert not (tmp_path / "run" / "ckpt.safetensors").exists()
