"""Positional calibration (attnrank.rerank.position): slot correction arithmetic, profile
resampling, the basin permutation, JSON storage, and measuring a profile on a tiny Llama."""

from __future__ import annotations

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.position import (
    SlotProfile,
    load_profile,
    load_stored_profile,
    prompt_slots,
    reorder_for_generation,
    resample_profile,
    slot_correct,
    store_profile,
)
from attnrank.rerank.profile import measure_slot_profile
from attnrank.rerank.reweight import Reweighting
from attnrank.types import Document

DATE = "2026-01-01T00:00:00+00:00"


def profile(means, model_id="org/model", fingerprint="abcdef0123456789", calibrated=True):
    return SlotProfile(
        len(means), tuple(means), (0.1,) * len(means), model_id, fingerprint, 5, DATE, calibrated=calibrated
    )


def test_slot_correct_subtracts_per_slot_bias():
    p = profile([3.0, 1.0, 2.0])  # mean 2: bias +1, -1, 0
    np.testing.assert_allclose(slot_correct(np.array([10.0, 10.0, 10.0]), [0, 1, 2], p), [9.0, 11.0, 10.0])
    np.testing.assert_allclose(slot_correct(np.array([5.0, 6.0, 7.0]), [2, 0, 1], p), [5.0, 5.0, 8.0])
    with pytest.raises(InputError, match="one prompt position in 0..2"):
        slot_correct(np.zeros(3), [0, 1, 3], p)


def test_profile_resampling_is_linear_with_aligned_ends():
    np.testing.assert_allclose(resample_profile([0.0, 2.0, 4.0], 5), [0, 1, 2, 3, 4])
    np.testing.assert_allclose(resample_profile([0.0, 1.0, 2.0, 3.0, 4.0], 3), [0, 2, 4])
    np.testing.assert_allclose(resample_profile([7.0], 3), [7, 7, 7])
    # correction on K=5 with a 3-slot profile: bias = [0,1,2,3,4] - 2
    got = slot_correct(np.zeros(5), [0, 1, 2, 3, 4], profile([0.0, 2.0, 4.0]))
    np.testing.assert_allclose(got, [2, 1, 0, -1, -2])


def test_prompt_slots_rank_span_starts():
    assert prompt_slots([(50, 60), (10, 20), (30, 40)]).tolist() == [2, 0, 1]


def test_reorder_for_generation_puts_best_at_highest_attention_slots():
    p = profile([5.0, 1.0, 3.0, 4.0], calibrated=False)  # slots by attention: 0, 3, 2, 1
    assert reorder_for_generation(["a", "b", "c", "d"], p) == ["a", "d", "c", "b"]
    assert reorder_for_generation([], p) == []
    # K differs from n_slots: a U-shaped basin over 3 slots read at 5
    basin = profile([3.0, 0.0, 2.0], calibrated=False)
    assert reorder_for_generation(list("abcde"), basin) == ["a", "c", "e", "d", "b"]
    with pytest.raises(InputError, match="one str, not a list of passages"):  # (one passage per character)
        reorder_for_generation("Paris is the capital", p)


def test_a_profile_that_is_none_or_malformed_is_one_input_error():
    """reorder_for_generation(docs, None) raised an AttributeError, SlotProfile(n_slots="3") a
    TypeError, and a negative std or count of trials was kept."""
    with pytest.raises(InputError, match="profile is a NoneType, not a SlotProfile"):
        reorder_for_generation(["a", "b"], None)  # type: ignore[arg-type]
    for bad, match in (
        (dict(n_slots="3"), "n_slots='3' must be an integer >= 1"),
        (dict(n_trials=-1), "n_trials=-1 must be an integer >= 1"),
        (dict(std=(-1.0, 0.1, 0.1)), "holds a negative deviation"),
    ):
        fields = dict(n_slots=3, mean_score=(1.0, 0.0, 1.0), std=(0.1,) * 3, model_id="m", fingerprint="f",
                      n_trials=5, date=DATE)  # fmt: skip
        with pytest.raises(InputError, match=match):
            SlotProfile(**{**fields, **bad})


def test_reorder_refuses_a_profile_of_calibrated_scores():
    """AttnRank places passages by the attention each slot receives; a calibrated profile holds
    what the "N/A" pass left of it (SmolLM2's ranked its 5 slots best-first: no basin at all)."""
    with pytest.raises(InputError, match="holds calibrated scores, not the raw attention"):
        reorder_for_generation(["a", "b"], profile([1.0, 0.0]))


def test_json_round_trip_and_storage(tmp_path, monkeypatch):
    p = profile([0.5, -0.25, 0.125])
    assert SlotProfile.from_json(p.to_json()) == p
    assert SlotProfile.load(p.save(tmp_path / "p.json")) == p
    assert SlotProfile.load(profile([1.0, 0.0]).save(tmp_path / "p.json")) == profile([1.0, 0.0])  # replaced
    (tmp_path / "notes.json").write_text('{"mine": 1}', encoding="utf-8")
    with pytest.raises(InputError, match="notes.json exists and is not a slot profile attnrank wrote"):
        p.save(tmp_path / "notes.json")  # before: overwritten
    assert (tmp_path / "notes.json").read_text(encoding="utf-8") == '{"mine": 1}'
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    with pytest.raises(InputError, match="no calibrated-score slot profile is registered"):
        load_stored_profile("org/model", p.fingerprint)
    path = store_profile(p)
    assert path.parent == tmp_path / "home" / "heads"
    p5 = SlotProfile(5, (1.0, 0.0, 0.0, 0.0, 1.0), (0.0,) * 5, p.model_id, p.fingerprint, 4, DATE)
    assert store_profile(p5) == path  # one registry file per model, one entry per n_slots
    assert load_stored_profile("org/model", p.fingerprint, n_slots=3) == p
    assert load_stored_profile("org/model", p.fingerprint, n_slots=20) == p5
    assert load_stored_profile("org/model", p.fingerprint) == p5  # the largest
    assert load_profile("auto", "org/model", p.fingerprint, n_slots=2) == p
    # root= reads and writes another registry folder instead of the user one
    other = SlotProfile(3, (9.0, 9.0, 9.0), (0.0,) * 3, p.model_id, p.fingerprint, 1, DATE)
    store_profile(other, root=tmp_path / "ship")
    assert load_stored_profile("org/model", p.fingerprint, n_slots=3, root=tmp_path / "ship") == other
    assert load_stored_profile("org/model", p.fingerprint, n_slots=3) == p
    with pytest.raises(InputError, match="no calibrated-score slot profile is registered"):
        load_stored_profile("other", "x")
    # raw-attention profiles are registered beside the calibrated ones, and read apart from them
    with pytest.raises(InputError, match="no raw-attention slot profile is registered.*calibrate=False"):
        load_stored_profile("org/model", p.fingerprint, calibrated=False)
    raw = profile([0.2, 0.1, 0.3], calibrated=False)
    store_profile(raw)
    assert load_stored_profile("org/model", p.fingerprint, n_slots=3, calibrated=False) == raw
    assert load_stored_profile("org/model", p.fingerprint, n_slots=3) == p  # kept, not replaced
    assert load_profile("auto", "org/model", p.fingerprint, n_slots=9, calibrated=False) == raw
    with pytest.raises(InputError, match="not valid JSON"):
        SlotProfile.from_json("{")
    with pytest.raises(InputError, match="n_slots=2 but 3 means"):
        SlotProfile(2, (1.0, 2.0, 3.0), (0.0, 0.0), "m", "f", 1, DATE)


# -- measuring on the tiny model ------------------------------------------------------------------

POOL = [
    Document("paris", "Paris is the capital of France.", "Paris"),
    Document("berlin", "Berlin is the capital of Germany.", "Berlin"),
    Document("banana", "Bananas are yellow.", "Fruit"),
    Document("rome", "Rome is in Italy.", ""),
    Document("tea", "Tea is a drink.", "Tea"),
]


def test_measure_slot_profile_end_to_end(llm, tmp_path):
    rr = AttentionReranker(llm, signals=None)
    prof = measure_slot_profile(rr, POOL, n_slots=3, n_trials=2, seed=0)
    assert prof.n_slots == 3 and prof.n_trials == 2 and prof.model_id == "tiny-llama"
    assert np.isfinite(prof.mean_score).all() and np.isfinite(prof.std).all()
    assert SlotProfile.from_json(prof.to_json()) == prof
    assert measure_slot_profile(rr, POOL, n_slots=3, n_trials=2, seed=0).mean_score == prof.mean_score
    assert prof.calibrated  # as the reranker scores; uncalibrated, the raw attention basin
    raw_rr = AttentionReranker(llm, signals=None, calibrate=False, token_filter=False)
    raw = measure_slot_profile(raw_rr, POOL, n_slots=3, n_trials=2, seed=0)
    assert not raw.calibrated and raw.mean_score != prof.mean_score and min(raw.mean_score) > 0  # attention mass
    # a reranker's calibrate given as 1 (accepted there) is recorded as True, not refused after every trial
    one = AttentionReranker(llm, signals=None, calibrate=1)
    assert measure_slot_profile(one, POOL, n_slots=2, n_trials=1).calibrated is True
    for bad in ({"n_slots": 2.5}, {"n_trials": 2.5}, {"n_trials": 0}):  # (2.5 failed after the checks: a TypeError)
        with pytest.raises(InputError, match=f"{next(iter(bad))}={next(iter(bad.values()))!r} must be a whole number"):
            measure_slot_profile(rr, POOL, **{"n_slots": 2, "n_trials": 1, **bad})

    # the reranker applies it (given as a path): plain scores minus the bias of each doc's slot
    query, docs = "capital of France?", POOL[:4]
    corrected = AttentionReranker(
        llm, reweight=Reweighting(slot_correction=True), slot_profile=str(prof.save(tmp_path / "p.json")), signals=None
    ).score(query, docs)
    plain = rr.score(query, docs)
    slots = [3, 2, 1, 0]  # order="reverse": input 0 (first-stage rank 1) is the last block
    curve = prof.curve(4)
    np.testing.assert_allclose(corrected, plain - (curve - curve.mean())[slots], atol=1e-12)


def test_a_slot_profile_over_other_heads_is_warned_of(llm, tmp_path, caplog):
    """A profile measured over every head (the shipped ones: all 270 of SmolLM2's) corrected the
    scores of 16 registered heads, a sum on a scale ~17x smaller, without a word."""
    every = measure_slot_profile(AttentionReranker(llm, signals=None, heads="all"), POOL, n_slots=3, n_trials=1)
    some = measure_slot_profile(AttentionReranker(llm, signals=None, heads="0-1,1-0"), POOL, n_slots=3, n_trials=1)
    assert (every.heads, some.heads) == ("all", "0-1,1-0")
    assert SlotProfile.from_json(some.to_json()).heads == "0-1,1-0"
    path = str(every.save(tmp_path / "every.json"))
    with caplog.at_level("WARNING", logger="attnrank.rerank.reweight"):
        AttentionReranker(llm, signals=None, heads="all", reweight=Reweighting(slot_correction=True), slot_profile=path)
        assert "slot profile measured on the scores of" not in caplog.text
        AttentionReranker(
            llm, signals=None, heads="0-1,1-0", reweight=Reweighting(slot_correction=True), slot_profile=path
        )
    assert "slot profile measured on the scores of all heads used to correct the scores of 2 heads" in caplog.text


def test_measure_slot_profile_bad_input(llm):
    rr = AttentionReranker(llm, signals=None)
    with pytest.raises(InputError, match="n_slots=9 must be a whole number in 1..5"):
        measure_slot_profile(rr, POOL, n_slots=9, n_trials=1)
    with pytest.raises(InputError, match="not the calibration query 'N/A'"):
        measure_slot_profile(rr, POOL, n_slots=2, n_trials=1, queries="N/A")
    with pytest.raises(InputError, match="n_trials=0"):
        measure_slot_profile(rr, POOL, n_slots=2, n_trials=0)


def test_auto_corrects_each_window_by_the_registered_profile_closest_to_its_size(llm, tmp_path, monkeypatch):
    """ "auto" took the profile with the most slots, squeezed to the window: a 4-document window
    was corrected by the 6-slot curve resampled, though a 4-slot profile was registered."""
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    fp = llm.fingerprint
    four = SlotProfile(4, (0.0, 0.4, -0.2, 0.9), (0.0,) * 4, llm.model_id, fp, 4, DATE)
    three = SlotProfile(3, (0.5, -0.5, 0.25), (0.0,) * 3, llm.model_id, fp, 4, DATE)
    for p in (four, three, SlotProfile(6, (1.0, 0.0, 0.0, 0.0, 0.0, -1.0), (0.0,) * 6, llm.model_id, fp, 4, DATE)):
        store_profile(p)
    rr = AttentionReranker(llm, reweight=Reweighting(slot_correction=True), slot_profile="auto", signals=None)
    plain = AttentionReranker(llm, signals=None)
    query = "capital of France?"
    for docs, prof in ((POOL[:4], four), (POOL[:3], three)):
        slots = list(range(len(docs)))[::-1]  # order="reverse": input 0 is the last block
        curve = prof.curve(len(docs))
        np.testing.assert_allclose(
            rr.score(query, docs), plain.score(query, docs) - (curve - curve.mean())[slots], atol=1e-12
        )
    assert rr.profile_for(4) == four and rr.profile_for(5).n_slots == 6  # a tie goes to the larger profile


def test_a_profile_with_a_value_that_is_no_number_is_one_line(tmp_path):
    """["x"] as a mean score was a raw ValueError from load, and from save over such a file."""
    import json

    from attnrank.errors import InputError
    from attnrank.rerank.position import FORMAT_VERSION, SlotProfile

    bad = tmp_path / "p.json"
    fields = {"n_slots": 1, "mean_score": ["x"], "std": [0.1], "model_id": "m", "fingerprint": "f", "n_trials": 1}
    bad.write_text(json.dumps({"format": FORMAT_VERSION, **fields, "date": "2026-12-05"}))
    with pytest.raises(InputError, match="slot profile fields are wrong"):
        SlotProfile.load(bad)


def test_a_user_registry_of_calibrated_profiles_does_not_hide_the_shipped_raw_ones(tmp_path, monkeypatch):
    """A user who stored a profile before the raw-attention ones shipped held only calibrated
    ones, and the user's entry hid the shipped one whole: ask --reorder found no profile."""
    import json

    from attnrank.registry import SHIPPED_DIR

    shipped = json.loads(next(SHIPPED_DIR.glob("smollm2-135m-*.json")).read_text())
    model_id, fingerprint = shipped["model_id"], shipped["fingerprint"]
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    mine = profile([0.3, 0.2, 0.1, 0.0, -0.1], model_id=model_id, fingerprint=fingerprint)
    path = store_profile(mine)  # a user's entry of calibrated profiles only
    assert not any(
        k.endswith("-raw") for k in json.loads(path.read_text())["artifacts"]["slot-profiles"]["payload"]["profiles"]
    )
    assert load_stored_profile(model_id, fingerprint, n_slots=5) == mine  # the user's, before the shipped one
    raw = load_stored_profile(model_id, fingerprint, n_slots=5, calibrated=False)
    assert not raw.calibrated and raw.n_slots == 5 and raw.mean_score[0] > raw.mean_score[2]  # the basin


def test_a_profiles_calibration_is_a_bool():
    with pytest.raises(InputError, match="calibrated='false' is not true or false"):
        SlotProfile(2, (1.0, 0.0), (0.0, 0.0), "m", "f", 1, DATE, calibrated="false")  # type: ignore[arg-type]


def test_storing_a_profile_writes_the_users_own_not_a_copy_of_the_shipped_ones(tmp_path, monkeypatch):
    """The first profile a user stored for the default model copied every shipped profile into the
    user's file, where the frozen copies ranked above what a later release would ship."""
    import json

    from attnrank.registry import SHIPPED_DIR

    shipped = json.loads(next(SHIPPED_DIR.glob("smollm2-135m-*.json")).read_text())
    assert shipped["artifacts"]["slot-profiles"]["payload"]["profiles"]  # (else nothing could be copied)
    model_id, fingerprint = shipped["model_id"], shipped["fingerprint"]
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    path = store_profile(profile([0.3, 0.2, 0.1, 0.0, -0.1, 0.2, 0.4], model_id=model_id, fingerprint=fingerprint))
    assert list(json.loads(path.read_text())["artifacts"]["slot-profiles"]["payload"]["profiles"]) == ["7"]
    path = store_profile(profile([0.3, 0.2, 0.1], model_id=model_id, fingerprint=fingerprint))
    assert sorted(json.loads(path.read_text())["artifacts"]["slot-profiles"]["payload"]["profiles"]) == ["3", "7"]


def test_registering_a_profile_of_other_heads_over_one_warns(tmp_path, monkeypatch, caplog):
    """The registry keeps one profile per slot count and calibration: a profile of other heads
    replaced the stored one without a word, and rerankers of the old heads then refused it."""
    from dataclasses import replace

    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    p = profile([0.3, 0.2, 0.1])
    store_profile(p)
    with caplog.at_level("WARNING", logger="attnrank.rerank.position"):
        store_profile(replace(p, mean_score=(0.1, 0.2, 0.3)))  # the same heads: replaced quietly
        assert caplog.text == ""
        store_profile(replace(p, heads="3-1,4-0"))
    assert "measured on heads all by this one of heads 3-1,4-0" in caplog.text
    assert load_stored_profile("org/model", p.fingerprint, n_slots=3).heads == "3-1,4-0"


def test_profiles_stored_under_two_ids_of_the_same_weights_are_read_together(tmp_path, monkeypatch):
    """One set of weights saved under two ids (a relative and an absolute path): the newest file
    alone was read, and a 5-slot profile stored under the second id hid the 20-slot one under the
    first (asked for 20 slots, the 5-slot curve came back)."""
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    fp = "e" * 64
    twenty = profile([0.1 * i for i in range(20)], model_id="models/m", fingerprint=fp)
    five = profile([0.5, 0.4, 0.3, 0.2, 0.1], model_id="/work/models/m", fingerprint=fp)
    store_profile(twenty)
    store_profile(five)
    assert load_stored_profile("models/m", fp, n_slots=20) == twenty
    assert load_stored_profile("/work/models/m", fp, n_slots=5) == five
    newer = profile([0.2 * i for i in range(20)], model_id="/work/models/m", fingerprint=fp)
    store_profile(newer)  # the same slot count under the other id: the newer one is read
    assert load_stored_profile("models/m", fp, n_slots=20) == newer
