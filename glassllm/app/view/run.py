"""The run a viewer looks at: its checkpoint (reloaded when the file changes) and its logs.

Only the paths fixed at startup are ever read; no request names a file. A checkpoint is read
once per version through `SavedRun.read`, which verifies the file's digest before any of its
metadata is decoded: nothing from a damaged or half-written file reaches the model. A training
run replaces its checkpoint by an atomic rename, so a read sees either the old file or the new
one; a file that changes while it is read is read again, and a reload that fails keeps the model
already loaded. A Hugging Face GPT-2 directory (``--checkpoint path/to/gpt2``) is read once, with
its tokenizer, and not followed.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import Any

import numpy as np

from glassllm._foreign import stderr_silenced
from glassllm.app.config import CHECKPOINT_NAME, LOG_NAME, STATS_NAME
from glassllm.app.run_log import read_log
from glassllm.app.run_state import SavedRun
from glassllm.app.sample import open_checkpoint, opened_run
from glassllm.app.stats import read_stats
from glassllm.data import Tokenizer
from glassllm.data.tokenizers import token_text
from glassllm.models import GPT
from glassllm.models.inspect import Inspection, inspect
from glassllm.models.source import ModelSource

# Bytes of inspections kept for follow-up requests (attention of one layer, one neuron) on the
# same text; the latest is kept whatever its size (GPT-2 at context 1024: about 1 GB, mostly its
# attention).
INSPECTION_CACHE_BYTES = 256 << 20
# Reads of a checkpoint that changed while it was read, before the last one is taken as it is.
READ_ATTEMPTS = 3


class Run:
    """``out_dir``'s checkpoint (or ``checkpoint``) and logs, for one viewer process.

    ``lock`` serialises every model computation: ``no_grad`` is process-global, and the model is
    reloaded in place of the old one. Construction raises ValueError, with a message for the
    command line, when there is nothing to show or the checkpoint is not a glassllm GPT.
    """

    def __init__(self, out_dir: str | Path, checkpoint: str | Path | None = None) -> None:
        self._start(out_dir, checkpoint)
        if checkpoint is not None and _is_pretrained(self.checkpoint_path):
            self._load_pretrained()
        elif checkpoint is not None or self.checkpoint_path.exists():
            self._load()  # ValueError: damaged, or not a glassllm GPT checkpoint
        elif not self.log_path.is_file():
            raise ValueError(
                f"no checkpoint or log in {str(self.out_dir)!r} (train first: glassllm train)"
            )

    @classmethod
    def of_model(cls, model: GPT, tokenizer: Tokenizer, out_dir: str | Path = ".") -> Run:
        """A viewer onto a model already in memory (a notebook's), not followed; the logs of
        ``out_dir`` are shown if it has any."""
        run = cls.__new__(cls)
        run._start(out_dir, None)
        run._use(model, tokenizer, ModelSource("in memory", None, model.config, tokenizer.kind))
        run.follows = False
        return run

    def _start(self, out_dir: str | Path, checkpoint: str | Path | None) -> None:
        self.out_dir = Path(out_dir)
        self.checkpoint_path = Path(checkpoint) if checkpoint else self.out_dir / CHECKPOINT_NAME
        self.log_path = self.out_dir / LOG_NAME
        self.stats_path = self.out_dir / STATS_NAME
        self.lock = threading.Lock()
        self.model: GPT | None = None
        self.tokenizer: Tokenizer | None = None
        self.source: ModelSource | None = None
        self.reload_error: str | None = None
        self._stamp: tuple[int, int, int] | None = None
        self.follows = True  # False for a Hugging Face directory: read once
        self._inspections: collections.OrderedDict[tuple, Inspection] = collections.OrderedDict()
        self._tokens: list[dict[str, Any]] | None = None
        self._opened: Any = None  # the Opened of a model read once (chat_setup reads it)
        self._chat: tuple[Any, frozenset[int]] | None = None

    # ---- the checkpoint

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            stat = self.checkpoint_path.stat()
        except OSError:
            return None
        return stat.st_ino, stat.st_mtime_ns, stat.st_size

    def _read(self) -> tuple[SavedRun, tuple[int, int, int] | None]:
        """The checkpoint read and verified, and the file's stamp taken before the read (so a
        file replaced during the read is seen as changed at the next `refresh`). A read that
        fails while the file changes under it is tried again."""
        for attempt in range(READ_ATTEMPTS):
            stamp = self._file_stamp()
            try:
                saved = SavedRun.read(self.checkpoint_path)
            except (ValueError, OSError):
                if attempt + 1 < READ_ATTEMPTS and self._file_stamp() != stamp:
                    continue  # replaced mid-read: read the new file
                raise
            if self._file_stamp() == stamp or attempt + 1 == READ_ATTEMPTS:
                return saved, stamp
        raise AssertionError("unreachable")

    def _load(self) -> None:
        saved, stamp = self._read()
        opened = opened_run(saved, self.checkpoint_path)  # built from verified metadata
        self._use(opened.model, opened.tokenizer, opened.source)
        self._opened, self._chat = opened, None  # a run finetuned from an instruct model chats
        self._stamp = stamp
        self.reload_error = None

    def _load_pretrained(self) -> None:
        opened = open_checkpoint(self.checkpoint_path)
        self._use(opened.model, opened.tokenizer, opened.source)
        self._opened = opened
        self.follows = False

    def chat_setup(self) -> tuple[Any, frozenset[int]]:
        """``(chat template or None, end tokens)`` of the model on show (`glassllm.app.chat`):
        a GGUF file's or a Hugging Face directory's; a glassllm run's only when it was
        finetuned ``--init-from`` an instruct model (its checkpoint keeps the template)."""
        if self._chat is None:
            from glassllm.app.chat import chat_setup

            self._chat = (None, frozenset()) if self._opened is None else chat_setup(self._opened)
        return self._chat

    @property
    def metadata(self) -> dict[str, Any]:
        """The glassllm checkpoint's metadata; empty for a model that has none."""
        return {} if self.source is None or self.source.metadata is None else self.source.metadata

    def _use(self, model: GPT, tokenizer: Tokenizer, source: ModelSource) -> None:
        self.model, self.tokenizer, self.source = model, tokenizer, source
        self._inspections.clear()
        self._tokens = None

    # ---- the vocabulary, built once per model

    def tokens(self) -> list[dict[str, Any]]:
        """Every token id of the model as the page shows it: ``{"id", "text", "repr"}``."""
        if self._tokens is None:
            assert self.model is not None and self.tokenizer is not None
            with stderr_silenced():  # one silenced block, not one per token (glassllm._foreign)
                self._tokens = [
                    _token_entry(self.tokenizer, i) for i in range(self.model.config.vocab_size)
                ]
        return self._tokens

    def token(self, token_id: int) -> dict[str, Any]:
        return self.tokens()[int(token_id)]

    def refresh(self) -> None:
        """Reload the checkpoint if its file changed (saves are atomic renames). A failed reload
        keeps the previous model and records the message in ``reload_error``. Call under lock."""
        if not self.follows:
            return
        stamp = self._file_stamp()
        if stamp is None or stamp == self._stamp:
            return
        try:
            self._load()
        except (ValueError, OSError) as err:
            self._stamp = stamp  # do not retry the same file at every request
            self.reload_error = str(err)

    def inspection(self, ids: list[int]) -> Inspection:
        """`inspect` of ``ids`` (at most block_size), cached for the current checkpoint."""
        key = tuple(ids)
        cached = self._inspections.get(key)
        if cached is not None:
            self._inspections.move_to_end(key)
            return cached
        result = inspect(self.model, np.asarray(ids, dtype=np.int64))
        self._inspections[key] = result
        held = sum(seen.nbytes for seen in self._inspections.values())
        while len(self._inspections) > 1 and held > INSPECTION_CACHE_BYTES:
            held -= self._inspections.popitem(last=False)[1].nbytes
        return result

    # ---- the logs

    def read_log(self, since: int) -> dict[str, Any]:
        """Records of ``log.jsonl`` and ``stats.jsonl`` with ``iter > since``, read by the same
        readers as training and resume (`glassllm.app.run_log.read_log`,
        `glassllm.app.stats.read_stats`): a bad line is skipped and counted, the last line
        left out while a run is still writing it. ``skipped``, there only when a line was
        skipped or a file cannot be read, says per file how many lines and why (``{"count",
        "reasons"}``), or why the file cannot be read at all (``{"count": 0, "error": ...}``,
        e.g. a FIFO, which is never waited on)."""
        answer: dict[str, Any] = {}
        skipped: dict[str, Any] = {}
        for key, name, path, read in (
            ("evals", "log", self.log_path, read_log),
            ("stats", "stats", self.stats_path, read_stats),
        ):
            try:
                lines = read(path, live=True)
            except (ValueError, OSError) as err:  # FileProblem: not a regular file, unreadable
                answer[key] = []
                skipped[name] = {"count": 0, "error": str(err)}
                continue
            answer[key] = [line.value for line in lines.records if line.value["iter"] > since]
            if lines.skipped:
                skipped[name] = {"count": lines.skipped, "reasons": lines.reasons}
        if skipped:
            answer["skipped"] = skipped
        return answer


def _token_entry(tokenizer: Tokenizer, token_id: int) -> dict[str, Any]:
    """One token for the page; an id of the model beyond its tokenizer's (a padded vocabulary)
    is shown as such."""
    try:
        return {
            "id": token_id,
            "text": token_text(tokenizer, token_id),
            "repr": tokenizer.token_repr(token_id),
        }
    except (ValueError, IndexError, KeyError):
        return {"id": token_id, "text": "", "repr": f"<id {token_id} not in the tokenizer>"}


def _is_pretrained(path: Path) -> bool:
    """A model read once (a Hugging Face directory, a GGUF file), not a run's checkpoint."""
    from glassllm.gguf import is_gguf_path
    from glassllm.hf import is_pretrained_path

    return is_gguf_path(path) or is_pretrained_path(path)
