"""Data-parallel training on MPI: N processes, one model, gradients averaged every step.

Launch a script (or ``glassllm train``) with ``mpiexec -n N``; each process (a *rank*) holds a
full replica of the model and works on its own rows of every batch::

    world = distributed.init(timeout_s=300)          # size 1 without a launcher: no MPI at all
    ddp = distributed.DataParallel(model, world, grad_accum=K)  # rank 0's weights everywhere
    for step in range(steps):
        x, y = get_batch(data, block_size, batch_size, batch_rng)  # same rows on every rank
        for k in range(K):
            rows = distributed.micro_batch(batch_size, world, K, k)  # this rank's k-th slice
            loss = model(x[rows], y[rows])[1]
            loss.backward()                          # .grad accumulates the K micro-batches
        ddp.sync_gradients()                         # sum over ranks, divided once by N*K
        clip_grad_norm_(model.parameters(), 1.0)     # sees the averaged gradient
        optimizer.step(); optimizer.zero_grad()

The contract:

* **Launch detection reads the environment only** (`detect_launch`): MPICH/Hydra and Intel MPI
  (``PMI_RANK``/``PMI_SIZE``), Open MPI (``OMPI_COMM_WORLD_RANK``/``_SIZE``), Slurm's ``srun``
  (``SLURM_PROCID``/``SLURM_STEP_NUM_TASKS``). Without one, or with a world of 1, `init` returns a
  size-1 `World` whose collectives do nothing, and mpi4py is never imported. mpi4py is imported
  by this module only, inside `init`.
* **The mean is taken once.** Each micro-batch loss is its own mean; `DataParallel.sync_gradients`
  adds the K accumulated micro-batch gradients of every rank (one in-place ``Allreduce`` SUM of
  a flat buffer) and divides the sum once by ``N*K``. N ranks therefore compute exactly what one
  process computes with ``grad_accum=N`` whenever the MPI sum adds in rank order (always for
  N = 2, where ``a + b == b + a`` bit for bit; MPICH for N = 3); other layouts agree to float32
  rounding.
* **Rows:** micro-batch k of rank r is slice ``k*N + r`` of the step's batch, slices of
  ``batch/(N*K)`` rows (`micro_batch`), so the data a step sees does not depend on N or K.
* **Nothing hangs.** With more than one rank, an uncaught exception on any rank prints
  ``rank r of N failed: <error>`` and ends every rank (``MPI_Abort``). Every collective of a
  `World` first checks that all ranks arrived at the *same* collective: each rank sends a small
  token to every other and waits at most ``timeout_s`` seconds; a rank that died, hangs or called
  another collective is named in one line and the job is aborted (exit status 2).
* **BLAS threads:** with more than one rank on a machine, each rank's BLAS pool is limited to
  its share of the cores (its cores divided by the ranks that may run on them) unless
  ``blas_threads`` or a standard variable (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
  ``MKL_NUM_THREADS``) says otherwise.
"""

from glassllm.distributed.blas_threads import available_cores, limit_blas_threads
from glassllm.distributed.data_parallel import DataParallel, check_batch_split, micro_batch
from glassllm.distributed.world import INSTALL_HINT, Launch, World, detect_launch, init

__all__ = [
    "DataParallel",
    "INSTALL_HINT",
    "Launch",
    "World",
    "available_cores",
    "check_batch_split",
    "detect_launch",
    "init",
    "limit_blas_threads",
    "micro_batch",
]
