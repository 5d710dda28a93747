"""The leaf helpers experiments and the claims ledger share: replicate keys and linear slopes."""

from __future__ import annotations

import pytest

from hopfield.stats import linear_slope, replicate_key, split_replicate_key


@pytest.mark.parametrize("name", ["hyperset", "hyperset+fixed-0.1", "a.seed", "x.seedy"])
@pytest.mark.parametrize("replicate", [0, 1, 2, 11])
def test_replicate_key_round_trips(name: str, replicate: int) -> None:
    assert split_replicate_key(replicate_key(name, replicate)) == (name, replicate)


def test_first_replicate_keeps_the_plain_name() -> None:
    assert replicate_key("transformer", 0) == "transformer"
    assert replicate_key("transformer", 2) == "transformer.seed2"


@pytest.mark.parametrize("key", ["transformer.seed", "transformer.seed0", "transformer.seedx"])
def test_malformed_marks_are_plain_names(key: str) -> None:
    assert split_replicate_key(key) == (key, 0)


def test_negative_replicate_is_rejected() -> None:
    with pytest.raises(ValueError, match="replicate"):
        replicate_key("transformer", -1)


def test_linear_slope() -> None:
    assert linear_slope([1.0, 3.0, 5.0]) == pytest.approx(2.0)
    assert linear_slope([4.0, 1.0, 0.0, -1.0]) == pytest.approx(-1.6)
    assert linear_slope([7.0]) == 0.0
