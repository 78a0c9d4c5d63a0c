from __future__ import annotations

import pytest

from attnrank.errors import InputError
from attnrank.eval.qa import (
    answer_metrics,
    contains,
    exact_match,
    f1_score,
    normalize_answer,
)


def test_normalisation_follows_squad():
    assert normalize_answer("The  Eiffel-Tower, in PARIS!") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_exact_match_and_f1():
    assert exact_match("The Chief of Protocol.", "chief of protocol") == 1.0
    assert exact_match("Chief of Staff", "chief of protocol") == 0.0
    # tokens: pred {chief, of, staff}, gold {chief, of, protocol}: P = R = 2/3
    assert f1_score("Chief of Staff", "Chief of Protocol") == pytest.approx(2 / 3)
    assert f1_score("Paris", "London") == 0.0
    assert f1_score("paris paris", "paris") == pytest.approx(2 * 0.5 * 1 / 1.5)  # bag of words


def test_yes_no_score_only_on_exact_match():
    assert f1_score("yes it is", "yes") == 0.0
    assert f1_score("Yes.", "yes") == 1.0
    assert f1_score("no", "no way") == 0.0


def test_plain_squad_f1_without_hotpotqas_yes_no_rule():
    """bench_locomo scored LoCoMo with HotpotQA's yes/no rule: "Yes, she would." against "Yes"
    scored F1 0, where SQuAD's F1 (and LoCoMo's own scorer) gives 0.5."""
    assert f1_score("Yes, she would.", "Yes", yes_no=False) == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    assert answer_metrics("Yes, she would.", ["Yes"], yes_no=False)["f1"] == 0.5
    assert answer_metrics("Yes, she would.", ["Yes"])["f1"] == 0.0  # HotpotQA's, the default


def test_contains_and_max_over_golds():
    assert contains("I think it was Shirley Temple in 1945", "Shirley Temple") == 1.0
    assert contains("Templeton", "Temple") == 0.0  # whole words only
    assert contains("anything", "the") == 0.0  # a gold that normalises to nothing never matches
    m = answer_metrics("Temple", ["Shirley Temple", "temple"])
    assert m == {"em": 1.0, "f1": 1.0, "contains": 1.0}
    m = answer_metrics("Shirley", ["Shirley Temple", "Black"])
    assert m["em"] == 0.0 and m["f1"] == pytest.approx(2 * 1 * 0.5 / 1.5) and m["contains"] == 0.0
    with pytest.raises(InputError, match="gold"):
        answer_metrics("x", [])
    with pytest.raises(InputError, match="golds 'Paris' is one string; pass a list"):
        answer_metrics("Paris", "Paris")  # before: one gold per character, all three metrics 0
