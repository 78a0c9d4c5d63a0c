"""Tests of attnrank.llm.headspec: parsing head lists and head files."""

from __future__ import annotations

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.llm.headspec import parse_heads


def test_head_lists_and_files(tmp_path):
    assert parse_heads("13-18, 2:3,,") == [(2, 3), (13, 18)]
    assert parse_heads([(1, 2), "3-4", [1, 2]]) == [(1, 2), (3, 4)]
    assert parse_heads(" ALL ") is None and parse_heads(None) is None
    path = tmp_path / "heads.json"
    path.write_text('{"heads": ["1-2", [3, 4.0]]}')
    assert parse_heads(path) == parse_heads(str(path)) == [(1, 2), (3, 4)]
    assert parse_heads([(np.int64(5), np.float32(6.0))]) == [(5, 6)]  # numpy numbers that are whole


@pytest.mark.parametrize(
    "bad", [[[13.5, 2]], [(1, 2.7)], ["1.5-2"], [[float("nan"), 1]], [(np.float32(13.5), 2)], [np.array([1.5, 2])]]
)
def test_fractional_indices_are_refused(bad):
    """A fractional index was cut by int(): [13.5, 2] silently became head 13-2."""
    with pytest.raises(InputError, match="is not a \\(layer, head\\) pair"):
        parse_heads(bad)


def test_fractional_indices_in_a_head_file_are_refused(tmp_path):
    path = tmp_path / "heads.json"
    path.write_text("[[13.9, 18]]")
    with pytest.raises(InputError, match="13.9"):
        parse_heads(path)


def test_unreadable_head_files_are_one_line_errors(tmp_path):
    """A folder named *.json or a binary file raised IsADirectoryError / UnicodeDecodeError."""
    folder = tmp_path / "heads.json"
    folder.mkdir()
    with pytest.raises(InputError, match="heads.json' cannot be read"):
        parse_heads(str(folder))
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00[")
    with pytest.raises(InputError, match="bin.json' cannot be read.*UTF-8 JSON"):
        parse_heads(binary)
    with pytest.raises(InputError, match="does not exist"):
        parse_heads(tmp_path / "missing.json")


def test_the_capturer_refuses_head_indices_that_are_not_whole_numbers(llm):
    """AttentionCapturer(model, [(1.7, 2.9)]) read head (1, 2) without a word; parse_heads refused it."""
    from attnrank.llm.attention import AttentionCapturer

    with pytest.raises(InputError, match=r"head \(1.7, 2.9\) is not a \(layer, head\) pair"):
        AttentionCapturer(llm.model, [(1.7, 2.9)])
    assert AttentionCapturer(llm.model, [(1.0, 2), "0-1"]).heads == [(0, 1), (1, 2)]


def test_a_pair_of_booleans_is_no_head():
    """heads=[(True, False)] was read as head 1-0."""
    import numpy as np

    for bad in ([(True, False)], [(np.bool_(True), 0)]):
        with pytest.raises(InputError, match="is not a \\(layer, head\\) pair"):
            parse_heads(bad)
    assert parse_heads([(np.int64(1), 0)]) == [(1, 0)]
