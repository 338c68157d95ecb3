"""tokenize_corpus with a BPE: merges learned on the training text only, each split alone."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional

from glassllm.data import tokenize_corpus, train_bpe

TEXT = "".join(f"row {i}: naïve café, the quick brown fox.\n" for i in range(80)) + "zebra " * 40


def test_bpe_is_learned_on_the_training_text_only(tmp_path):
    optional("tokenizers")
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    splits = tokenize_corpus(str(path), "bpe", 8, vocab_size=300)
    cut = int(len(TEXT) * 0.9)
    assert splits.tokenizer.to_json() == train_bpe(TEXT[:cut], 300).to_json()
    assert np.array_equal(splits.train, splits.tokenizer.encode(TEXT[:cut]))
    assert np.array_equal(splits.val, splits.tokenizer.encode(TEXT[cut:]))
    # "zebra" is only in the validation text: no merge was learned for it.
    assert "zebra" not in splits.tokenizer.tokenizer.get_vocab()
    assert "Ġzebra" not in splits.tokenizer.tokenizer.get_vocab()
    again = tokenize_corpus(str(path), "bpe", 8, tokenizer=splits.tokenizer)
    assert np.array_equal(again.train, splits.train) and np.array_equal(again.val, splits.val)


def test_a_vocabulary_size_is_for_bpe_only(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    with pytest.raises(ValueError, match="'bpe' tokenizer only"):
        tokenize_corpus(str(path), "char", 8, vocab_size=300)
