"""What ranks that were given different settings are told (World.check_same and the program's
checks of glassllm.app.parallel), on a world whose gather returns given values: the messages
name exactly what differs, with each rank's value (real mpiexec: tests/app/test_train_mpi.py)."""

from __future__ import annotations

import pytest

from glassllm.app.parallel import check_same_data, check_same_resume
from glassllm.data.tokenizers import CharTokenizer
from glassllm.distributed import World


class Gathered(World):
    """A world of len(values) ranks, this one rank 0, whose allgather returns ``values`` (one
    per rank) whatever is sent: what each rank would have sent."""

    def __init__(self, values):
        super().__init__()
        self.size, self._values = len(values), values

    def allgather_object(self, obj):
        return list(self._values)


def test_the_differing_keys_only_with_both_values():
    world = Gathered([{"lr": 1e-3, "seed": 1, "n_layer": 2}, {"lr": 0.01, "seed": 1, "n_layer": 2}])
    with pytest.raises(ValueError) as err:
        world.check_same({})
    assert str(err.value) == "rank 1 has a different configuration: lr 0.01 (rank 0: 0.001)"


def test_a_key_one_rank_lacks_is_not_given_there_never_none():
    world = Gathered([{"max_iters": 4}, {"max_iters": 4, "lr": None}, {"seed": 2, "max_iters": 4}])
    with pytest.raises(ValueError) as err:
        world.check_same({}, label=lambda k: "--" + k.replace("_", "-"))
    assert str(err.value) == (
        "rank 1 has a different configuration: --lr None (rank 0: not given); rank 2 differs too"
    )


def test_equal_settings_pass():
    Gathered([{"a": 1}, {"a": 1}]).check_same({})


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([True, False], "--resume is given to rank 0 but not to rank 1 of 2"),
        ([False, True, True], "--resume is given to ranks 1, 2 but not to rank 0 of 3"),
    ],
)
def test_resume_on_some_ranks_only_is_named(flags, message):
    with pytest.raises(ValueError, match=message):
        check_same_resume(Gathered(flags), True)
    check_same_resume(Gathered([True, True]), True)


def test_different_text_or_tokenizer_names_the_ranks():
    char = CharTokenizer.from_text("abc")
    world = Gathered([("a" * 64, "t"), ("a" * 64, "t"), ("b" * 64, "t")])
    with pytest.raises(ValueError) as err:
        check_same_data(world, "text.txt", "a" * 64, char)
    assert str(err.value).startswith(
        "rank 2 read a different text from --data 'text.txt' than rank 0 (sha256 rank 0 "
        "aaaaaaaaaaaa, rank 1 aaaaaaaaaaaa, rank 2 bbbbbbbbbbbb)"
    )
    world = Gathered([("a" * 64, "t"), ("a" * 64, "u")])
    with pytest.raises(ValueError, match="rank 1 read a different tokenizer"):
        check_same_data(world, "text.txt", "a" * 64, char)
    # one rank alone checks nothing
    check_same_data(World(), "text.txt", "a" * 64, char)
