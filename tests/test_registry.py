"""The per-model head registry: round trip, precedence (user over shipped, exact fingerprint over
"*", method order, date), "auto" resolution and its error, artifacts, and the `heads` CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from _cli import cli_text
from _tiny import save_tiny, tiny_model, tiny_tokenizer
from typer.testing import CliRunner

from attnrank import registry, registry_save
from attnrank.cli import app
from attnrank.errors import InputError, MissingExtraError
from attnrank.llm.fingerprint import model_fingerprint
from attnrank.llm.models import LLM
from attnrank.registry import load_artifact, load_head_sets, resolve_heads
from attnrank.registry_save import save_artifact, save_head_set
from attnrank.rerank.attention import AttentionReranker

FP = "a" * 64


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """An empty user registry (ATTNRANK_HOME) and an empty shipped folder."""
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(registry, "SHIPPED_DIR", shipped)
    return tmp_path


def _ship(roots, model_id, fingerprint, sets, artifacts=None, name="x.json"):
    doc = {
        "format": registry.FORMAT,
        "model_id": model_id,
        "fingerprint": fingerprint,
        "sets": sets,
        "artifacts": artifacts or {},
    }
    (roots / "shipped" / name).write_text(json.dumps({"models": [doc]}))


def test_round_trip(roots):
    scores = np.arange(6, dtype=float).reshape(2, 3)
    scores[0, 0] = np.nan
    path = save_head_set("org/m", FP, "qr-score", "1-2,0-1", scores=scores, data="3 queries", params={"top": 2})
    assert path.parent == roots / "home" / "heads"
    (hs,) = load_head_sets("org/m", FP)
    assert hs.pairs == [(0, 1), (1, 2)] and hs.method == "qr-score" and hs.name == "qr-score"
    assert hs.scores == [[None, 1.0, 2.0], [3.0, 4.0, 5.0]] and (hs.n_layers, hs.n_heads) == (2, 3)
    assert hs.data == "3 queries" and hs.params == {"top": 2} and hs.source == "user" and hs.date
    save_head_set("org/m", FP, "qr-score", ["0-0"])  # same name: replaced
    save_head_set("org/m", FP, "copy", ["1-1"])
    assert [s.heads for s in load_head_sets("org/m", FP)] == [["0-0"], ["1-1"]]
    assert load_head_sets("org/m", "b" * 64) == []  # other weights
    with pytest.raises(InputError, match="empty fingerprint"):
        save_head_set("org/m", "", "copy", ["1-1"])


def test_entries_kept_under_another_fingerprint_of_the_model_are_warned_of_once(roots, caplog, monkeypatch):
    """A folder's fingerprint that changed (its config edited, or keyed by an earlier rule) found
    nothing: the reranker fell back to equal weights or all heads without a word about the user's
    own trained ones."""
    monkeypatch.setattr(registry, "_WARNED", set())
    save_artifact("likelihood-weights", "/models/mine", FP, {"w": 1})
    with caplog.at_level("WARNING", logger="attnrank.registry"):
        assert load_artifact("likelihood-weights", "/models/mine", "b" * 64) is None
        assert load_head_sets("/models/mine", "b" * 64) == []
        assert load_artifact("likelihood-weights", "/models/other", "b" * 64) is None  # another model: silent
    assert caplog.text.count("holds entries for '/models/mine' under another fingerprint (aaaaaaaaaaaa") == 1
    assert "this model's is bbbbbbbbbbbb" in caplog.text and "other" not in caplog.text.split("mine")[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank.registry"):
        assert load_artifact("likelihood-weights", "/models/mine", FP) == {"w": 1}  # its own: found, silent
    assert "another fingerprint" not in caplog.text


def test_weights_left_under_an_old_fingerprint_are_warned_of_beside_other_entries_under_the_new(
    roots, caplog, monkeypatch
):
    """The warning went silent once anything was saved under the new fingerprint (a head set from
    heads detect): the user's likelihood weights, left under the old one, fell back to equal weights
    without a word. What a lookup reads is looked for under the other fingerprints, kind by kind."""
    monkeypatch.setattr(registry, "_WARNED", set())
    save_artifact("likelihood-weights", "/models/m", FP, {"w": 1})
    save_head_set("/models/m", "b" * 64, "copy", ["0-1"])
    with caplog.at_level("WARNING", logger="attnrank.registry"):
        assert load_head_sets("/models/m", "b" * 64)[0].heads == ["0-1"]  # found: nothing to warn of
        assert "another fingerprint" not in caplog.text
        assert load_artifact("likelihood-weights", "/models/m", "b" * 64) is None
    assert caplog.text.count("holds entries for '/models/m' under another fingerprint (aaaaaaaaaaaa") == 1


def test_a_user_file_of_head_sets_alone_is_read_by_artifact_lookups(roots, monkeypatch):
    """A file may hold only head sets (no "artifacts" key, as older files do): the lookup of an
    artifact kind read d["artifacts"] and failed every reranker of the model with a KeyError."""
    monkeypatch.setattr(registry, "_WARNED", set())
    home = registry.user_dir()
    home.mkdir(parents=True, exist_ok=True)
    for fp, name in ((FP, "same.json"), ("c" * 64, "other.json")):
        doc = {
            "format": registry.FORMAT,
            "model_id": "org/m",
            "fingerprint": fp,
            "sets": [{"method": "copy", "heads": ["0-1"]}],
        }
        (home / name).write_text(json.dumps({"models": [doc]}))
    assert load_artifact("head-weights", "org/m", FP) is None
    assert load_artifact("head-weights", "org/m", "b" * 64) is None
    assert registry.load_user_artifacts("slot-profiles", "org/m", FP) == []


def test_the_shipped_folder_read_for_its_entries_alone_is_not_warned_of_as_the_users(roots, caplog, monkeypatch):
    """Slot profiles read the shipped folder as a user root (its entries alone, under the user's):
    under another fingerprint of the packaged model that warned of the package's own file, "retrain
    them", and, warned once, hid the warning about the user's own entries."""
    from attnrank.rerank.position import load_stored_profile

    monkeypatch.setattr(registry, "_WARNED", set())
    _ship(roots, "smollm2-135m", FP, [], {"slot-profiles": {"payload": {"profiles": {}}}}, name="packaged.json")
    save_artifact("slot-profiles", "smollm2-135m", "c" * 64, {"profiles": {}})  # the user's, under other weights
    with caplog.at_level("WARNING", logger="attnrank.registry"), pytest.raises(InputError, match="no raw-attention"):
        load_stored_profile("smollm2-135m", "b" * 64, calibrated=False)
    assert "packaged.json" not in caplog.text
    assert caplog.text.count("under another fingerprint (cccccccccccc") == 1


def test_precedence(roots):
    llm = SimpleNamespace(model_id="Org/Model-7B", fingerprint=FP)
    set_ = {"method": "copy", "heads": ["3-3"], "date": "2025-01-01"}
    _ship(roots, "other/model-7b", "*", [set_, {"method": "qr-ndcg", "heads": ["1-1"], "date": "2024-01-01"}])
    # "*" matches by the model name: qr-ndcg before copy
    assert resolve_heads("auto", llm) == [(1, 1)]
    assert resolve_heads("auto:copy", llm) == [(3, 3)]
    _ship(roots, "Org/Model-7B", FP, [{"method": "contrastive", "heads": ["2-2"], "date": "2024-01-01"}], name="y.json")
    assert resolve_heads("auto", llm) == [(2, 2)]  # exact fingerprint beats "*"
    save_head_set("Org/Model-7B", FP, "copy", ["0-5"], date="2023-01-01")
    assert resolve_heads("auto", llm) == [(0, 5)]  # the user registry overrides shipped sets
    save_head_set("Org/Model-7B", FP, "copy", ["0-6"], name="newer", date="2026-01-01")
    assert resolve_heads("auto", llm) == [(0, 6)]  # same source and method: newest first
    sources = [s.source for s in load_head_sets("Org/Model-7B", FP)]
    assert sources == ["user", "user", "shipped", "shipped", "shipped"]


def test_auto_error_says_how_to_detect(roots):
    llm = SimpleNamespace(model_id="tiny-llama", fingerprint=FP)
    with pytest.raises(InputError) as err:
        resolve_heads("auto", llm)
    msg = str(err.value)
    assert "no head set is registered for model 'tiny-llama'" in msg and "attnrank heads detect" in msg
    save_head_set("tiny-llama", FP, "copy", ["0-1"])
    save_head_set("tiny-llama", FP, "qr-ndcg", ["0-2"])
    # a method in any case, as "auto"; one not registered names those that are (it said to run the
    # detection that registered them: `--method qr` registers qr-score, qr-ndcg, contrastive)
    assert resolve_heads("AUTO:QR-NDCG", llm) == [(0, 2)]
    with pytest.raises(InputError, match=r"no 'qr' head set.*registered: auto:copy, auto:qr-ndcg$"):
        resolve_heads("auto:qr", llm)
    with pytest.raises(InputError, match="not 'auto'"):
        resolve_heads("13-1", llm)


def test_shipped_qrhead_sets():
    sets = load_head_sets("meta-llama/Llama-3.1-8B-Instruct", "0123456789abcdef", root=registry.SHIPPED_DIR / "none")
    assert [(s.method, s.source) for s in sets] == [("qr-ndcg", "shipped"), ("qr-score", "shipped")]
    assert (14, 22) in sets[0].pairs and len(sets[0].pairs) == 16
    local = load_head_sets("/models/llama-3.1-8b-instruct", "f" * 64, root=registry.SHIPPED_DIR / "none")
    assert len(local) == 2
    # the id ICR's scripts load (Meta's own prefix): the same shipped sets, not plain ICR with a warning
    meta = load_head_sets("meta-llama/Meta-Llama-3.1-8B-Instruct", "f" * 64, root=registry.SHIPPED_DIR / "none")
    assert [s.pairs for s in meta] == [s.pairs for s in sets]
    assert load_head_sets("Qwen/Qwen2.5-7B-Instruct", "c" * 40)[0].n_layers == 28


def test_artifacts(roots):
    assert load_artifact("slot-profile", "org/m", FP) is None
    _ship(roots, "org/m", "*", [], {"slot-profile": {"date": "x", "payload": {"v": 1}}})
    assert load_artifact("slot-profile", "org/m", FP) == {"v": 1}
    save_artifact("slot-profile", "org/m", FP, {"v": 2})
    save_head_set("org/m", FP, "copy", ["0-1"])  # sets and artifacts share the file
    assert load_artifact("slot-profile", "org/m", FP) == {"v": 2}
    assert len(load_head_sets("org/m", FP)) == 1


def test_user_only_artifacts_skip_the_shipped_ones(roots, caplog):
    """signals_only reads a user's registered fused weights, never the shipped ones (which the
    preset fused reads); registered weights without a model without attention fall back too."""
    from attnrank.rerank.fused import FusedWeights
    from attnrank.rerank.fused_resolve import resolve_fused, signals_only

    shipped = FusedWeights(["attention", "bm25", "dense"], [1.0, 0.5, 0.25], base_weights=[0.5, 0.25])
    _ship(roots, "org/m", FP, [], {FusedWeights.KIND: {"date": "x", "payload": shipped.to_json()}})
    assert load_artifact(FusedWeights.KIND, "org/m", FP) is not None
    assert load_artifact(FusedWeights.KIND, "org/m", FP, user_only=True) is None
    assert signals_only("org/m", FP).weights == [1.0, 1.0]  # equal weights, not the shipped base model
    assert resolve_fused("only", "org/m", FP).weights == [1.0, 1.0]  # type: ignore[union-attr]
    assert resolve_fused("auto", "org/m", FP).weights == shipped.weights  # type: ignore[union-attr]
    FusedWeights(["attention", "dense"], [1.0, 2.0]).save("org/m", FP)  # no base_weights
    assert signals_only("org/m", FP).features == ["bm25", "dense"] and "no model without attention" in caplog.text
    FusedWeights(["bm25", "dense"], [0.3, 0.7]).save("org/m", FP)
    assert signals_only("org/m", FP).weights == [0.3, 0.7]


def test_preset_signals_reads_a_fused_base_model_only_if_it_held_out_at_equal_weights(roots, caplog):
    """train --preset signals never registers below equal weights held out; the model without
    attention that --preset fused registers beside its own weights is read by the same rule."""
    from attnrank.rerank.fused import EQUAL_SIGNALS, NO_ATTENTION, FusedWeights
    from attnrank.rerank.fused_resolve import signals_only

    def fused(base: float, equal: float) -> FusedWeights:
        w = FusedWeights(["attention", "bm25", "dense"], [1.0, 0.5, 0.25], base_weights=[0.9, 0.1])
        w.metrics = {"heldout": {NO_ATTENTION: {"nDCG@10": base}, EQUAL_SIGNALS: {"nDCG@10": equal}}}
        return w

    fused(0.60, 0.61).save("org/m", FP)
    with caplog.at_level("INFO", logger="attnrank"):  # (a CLI test may have set attnrank's logger to WARNING)
        assert signals_only("org/m", FP).weights == [1.0, 1.0]
    assert "scored below them" in caplog.text
    fused(0.61, 0.61).save("org/m", FP)  # a tie, as train's rule, reads them
    assert signals_only("org/m", FP).weights == [0.9, 0.1]
    FusedWeights(["attention", "bm25", "dense"], [1.0, 0.5, 0.25], base_weights=[0.9, 0.1]).save("org/m", FP)
    assert signals_only("org/m", FP).weights == [0.9, 0.1]  # weights saved from Python record no report


def test_likelihood_weights_are_a_users_own_never_shipped_ones(roots, caplog):
    """The default preset reads LikelihoodWeights a user registered, logged, else equal weights:
    not shipped ones, and not the fused weights (another kind)."""
    from attnrank.rerank.fused import FusedWeights, LikelihoodWeights
    from attnrank.rerank.fused_resolve import current_label, likelihood_weights, resolve_fused

    shipped = LikelihoodWeights(["bm25", "likelihood"], [1.0, 5.0])
    _ship(roots, "org/m", FP, [], {LikelihoodWeights.KIND: {"date": "x", "payload": shipped.to_json()}})
    FusedWeights(["attention", "bm25", "dense"], [1.0, 0.5, 0.25], base_weights=[0.5, 0.25]).save("org/m", FP)
    equal = likelihood_weights("org/m", FP)
    assert equal.features == ["bm25", "dense", "likelihood"] and equal.weights == [1.0, 1.0, 1.0]
    assert current_label(likelihood_weights, "org/m", FP) == "equal weights"
    mine = LikelihoodWeights(["dense", "likelihood"], [0.5, 2.0], trained_on="my queries")
    mine.save("org/m", FP)
    with caplog.at_level("INFO", logger="attnrank"):
        assert resolve_fused("likelihood", "org/m", FP) == mine
    assert "preset likelihood scores by the weights registered for org/m (trained on my queries)" in caplog.text
    assert current_label(likelihood_weights, "org/m", FP) == "registered weights (trained on my queries)"


def test_weights_fitted_to_other_signals_are_named_stale(roots, caplog):
    """Fused weights record the signals' version they were fitted to; registered or shipped
    weights of another version, or of none recorded, still load, with a warning naming the fix."""
    from attnrank.rerank.fused import FusedWeights, equal_weights
    from attnrank.rerank.fused_resolve import resolve_fused, signals_only
    from attnrank.rerank.signals import SIGNALS_VERSION

    assert equal_weights().signals_version == SIGNALS_VERSION
    current = FusedWeights(["attention", "bm25", "dense"], [1.0, 0.5, 0.25], base_weights=[0.5, 0.25])
    current.signals_version = SIGNALS_VERSION
    current.save("org/m", FP)
    assert (
        resolve_fused("auto", "org/m", FP) == current and signals_only("org/m", FP).signals_version == SIGNALS_VERSION
    )
    assert "retrain them" not in caplog.text
    stale = (
        (SIGNALS_VERSION - 1, f"fitted to version {SIGNALS_VERSION - 1} of the signals"),
        (None, "fitted to signals computed before their versions were recorded"),
    )
    for old, said in stale:
        caplog.clear()
        current.signals_version = old
        current.save("org/m", FP)
        assert resolve_fused("auto", "org/m", FP).weights == current.weights  # type: ignore[union-attr]
        assert signals_only("org/m", FP).weights == current.base_weights
        assert caplog.text.count("retrain them with `attnrank train --preset fused`") == 2
        assert said in caplog.text


def test_reranker_auto_heads(roots):
    llm = LLM(tiny_model("llama", layers=3, max_positions=2048), tiny_tokenizer(), "tiny-llama", FP)
    with pytest.raises(InputError, match="attnrank heads detect"):
        AttentionReranker(llm, "auto", signals=None)
    save_head_set("tiny-llama", FP, "qr-score", ["1-2", "0-3"])
    rr = AttentionReranker(llm, "auto", signals=None)
    assert rr.heads == [(0, 3), (1, 2)] and rr.capturer.deepest_layer == 1


# --------------------------------------------------------------------------- CLI
runner = CliRunner()


def _detect_qr(tiny_dir, scifact_mini, top: int) -> list[str]:
    """``heads detect --method qr`` of the tiny model on 2 SciFact queries, 6 candidates each."""
    args = [
        "heads",
        "detect",
        "--method",
        "qr",
        "--model",
        str(tiny_dir),
        "--queries",
        str(scifact_mini / "queries.jsonl"),
    ]
    args += ["--qrels", str(scifact_mini / "qrels" / "train.tsv"), "--corpus", str(scifact_mini / "corpus.jsonl")]
    return [*args, "--max-queries", "2", "--depth", "6", "--top", str(top), "-q"]


def test_cli_detect_qr_and_show(roots, tiny_dir, scifact_mini):
    args = _detect_qr(tiny_dir, scifact_mini, 3)
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "qr-ndcg:" in r.output and r.output.count("saved top 3") == 3
    model_id, fp = model_fingerprint(str(tiny_dir))
    sets = load_head_sets(model_id, fp)
    assert [s.method for s in sets] == ["qr-ndcg", "qr-score", "contrastive"]
    assert all(len(s.heads) == 3 and len(s.scores) == 3 for s in sets)  # scores: one row per layer
    # which set --heads auto reads from now on is said (a user's set outranks the shipped ones)
    assert f"--heads auto now reads the user set {sets[0].name!r} (qr-ndcg, 3 heads)" in r.output
    shown = runner.invoke(app, ["heads", "show", "--model", str(tiny_dir)])
    assert shown.exit_code == 0 and "3 head set(s)" in shown.output and "qr-ndcg [qr-ndcg, user]" in shown.output
    png = roots / "heat.png"
    plotted = runner.invoke(app, ["heads", "show", "--model", str(tiny_dir), "--png", str(png)])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert isinstance(plotted.exception, MissingExtraError) and "attnrank[plot]" in str(plotted.exception)
    else:
        assert plotted.exit_code == 0 and png.stat().st_size > 0
    # a second detection replaced the first by name, with no way to keep both from the CLI: --name
    named = runner.invoke(app, [*args, "--name", "mine"])
    assert named.exit_code == 0 and "replaces" not in named.output, named.output
    names = sorted(s.name for s in load_head_sets(model_id, fp))
    assert names == sorted([*(s.name for s in sets), "mine-qr-ndcg", "mine-qr-score", "mine-contrastive"])
    again = runner.invoke(app, args)  # and a replacement is said before the detection runs, not after
    said = again.output.index("warning: this detection replaces the registered set 'qr-ndcg'")
    assert again.exit_code == 0 and said < again.output.index("qr-ndcg:")
    assert "); give --name to keep it" in again.output
    named = runner.invoke(app, [*args, "--name", "mine"])
    assert "set 'mine-qr-ndcg'" in named.output and "); give another --name to keep it" in named.output
    assert len(load_head_sets(model_id, fp)) == 6
    assert runner.invoke(app, [*args, "--name", " "]).exit_code == 2


def test_cli_detect_with_top_past_the_models_heads_says_it_saved_them_all(roots, tiny_dir, scifact_mini):
    """``--top 999`` on a model of fewer heads saved every head and said "saved top 999"."""
    r = runner.invoke(app, _detect_qr(tiny_dir, scifact_mini, 999))
    assert r.exit_code == 0, r.output
    sets = load_head_sets(*model_fingerprint(str(tiny_dir)))
    n = len(sets[0].heads)
    assert n < 999 and all(len(s.heads) == n for s in sets)
    assert r.output.count(f"saved all {n} heads of the model (--top 999 asks for more)") == 3
    assert "saved top 999" not in r.output


def test_cli_detect_says_where_heads_tie_at_the_cut(roots, tiny_dir, scifact_mini):
    """With one query, per-head nDCG takes few values: heads tied in and past the top N were
    registered in layer order without a word; a set whose every head ties with one past it (the
    first heads in layer order, which --heads auto then read) is not registered at all."""
    data = ["--queries", str(scifact_mini / "queries.jsonl"), "--qrels", str(scifact_mini / "qrels" / "train.tsv")]
    args = ["heads", "detect", "--model", str(tiny_dir), *data, "--corpus", str(scifact_mini / "corpus.jsonl")]
    args += ["--method", "qr", "--max-queries", "1", "--depth", "6", "-q"]
    looked = runner.invoke(app, [*args, "--top", "10000", "--no-save"])
    assert looked.exit_code == 0, cli_text(looked)
    scores = [float(v) for v in re.findall(r"\d+-\d+ ([0-9.]+)", re.search(r"qr-ndcg: (.*)", looked.output).group(1))]
    assert len(scores) > 2 and scores[0] == scores[1] == 1.0  # (the best heads tie)
    r = runner.invoke(app, [*args, "--top", "1"])
    assert (
        r.exit_code == 0 and "qr-ndcg: not saved: its best 1 heads all scored 1.000, as heads past them did" in r.output
    )
    model_id, fp = model_fingerprint(str(tiny_dir))
    assert {s.method for s in load_head_sets(model_id, fp)} == {"qr-score", "contrastive"}
    # a cut inside a tie below the best: registered, and said
    cut = next(n for n in range(1, len(scores)) if scores[n - 1] == scores[n] and scores[0] > scores[n])
    r = runner.invoke(app, [*args, "--top", str(cut)])
    assert r.exit_code == 0, cli_text(r)
    assert f"qr-ndcg: note: heads scored {scores[cut]:.3f} both in and past the {cut} saved" in r.output, r.output
    assert "qr-ndcg" in {s.method for s in load_head_sets(model_id, fp)}


def test_cli_detect_qr_cuts_passages_as_the_advice_it_gives_says(roots, tiny_dir, scifact_mini, monkeypatch):
    """A candidate too long for the model's window was refused with "lower
    max_doc_words/max_doc_tokens", options heads detect did not have; and then only after the
    model had loaded, advising a max_prompt_tokens it has no option for, naming no query."""
    from attnrank.llm import models

    small = save_tiny(roots / "small", layers=3, max_positions=640)
    data = ["--queries", str(scifact_mini / "queries.jsonl"), "--qrels", str(scifact_mini / "qrels" / "train.tsv")]
    args = ["heads", "detect", "--model", str(small), *data, "--corpus", str(scifact_mini / "corpus.jsonl")]
    args += ["--max-queries", "2", "--depth", "4", "--no-save", "-q"]
    loads, load = [], models.load_llm
    monkeypatch.setattr(models, "load_llm", lambda *a, **k: loads.append(a) or load(*a, **k))
    r = runner.invoke(app, args)
    text = cli_text(r)
    assert r.exit_code == 2 and re.search(r"query '\d+': (no )?document .* even alone", text), text
    assert "shorten the query, or lower --max-doc-words / --max-doc-tokens" in text and not loads
    r = runner.invoke(app, [*args, "--max-doc-words", "12"])
    assert r.exit_code == 0 and "qr-ndcg:" in r.output, cli_text(r)
    _niah(roots / "niah-data")
    copy = ["heads", "detect", "--method", "copy", "--model", str(small), "--data", str(roots / "niah-data")]
    r = runner.invoke(app, [*copy, "--max-doc-tokens", "9"])
    assert r.exit_code == 2 and "--max-doc-tokens configure(s) --method qr" in cli_text(r), cli_text(r)


def test_cli_detect_names_a_registry_file_it_cannot_save_to_before_detecting(
    roots, tiny_dir, scifact_mini, monkeypatch
):
    """heads detect ran every trial, then the save was refused (and with --method qr the first
    refusal hid the other methods' results); train and heads train checked first."""
    from attnrank.llm import models

    model_id, fp = model_fingerprint(str(tiny_dir))
    path = save_head_set(model_id, fp, "copy", ["0-1"])
    path.write_text(path.read_text().replace('"sets"', '"notes": 1, "sets"'))  # edited by hand
    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    data = ["--queries", str(scifact_mini / "queries.jsonl"), "--qrels", str(scifact_mini / "qrels" / "train.tsv")]
    args = ["heads", "detect", "--method", "qr", "--model", str(tiny_dir), *data, "-q"]
    r = runner.invoke(app, [*args, "--corpus", str(scifact_mini / "corpus.jsonl")])
    assert r.exit_code == 1 and "keys attnrank does not write" in cli_text(r) and "--no-save" in cli_text(r)
    assert loads == []


@pytest.mark.parametrize("haystack", ["book", "essays"])
def test_cli_detect_copy_checks_the_haystack_before_the_model_loads(roots, tiny_dir, tmp_path, haystack, monkeypatch):
    """Missing haystack files were found only after the model had loaded; an essays folder
    without essays read as an empty haystack."""
    from attnrank.llm import models

    folder = tmp_path / "niah" / "retrieval_head"
    folder.mkdir(parents=True)
    (folder / "needles.jsonl").write_text(
        json.dumps({"needle": "The code is 42.", "question": "Code?", "real_needle": "42"}) + "\n"
    )
    (tmp_path / "niah" / "PaulGrahamEssays").mkdir()
    loaded = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loaded.append(a))
    args = ["heads", "detect", "--method", "copy", "--model", str(tiny_dir), "--data", str(tmp_path)]
    r = runner.invoke(app, [*args, "--haystack", haystack, "-q"])
    assert r.exit_code != 0 and isinstance(r.exception, InputError) and not loaded
    assert ("haystack_part1_p1.txt.gz does not exist" if haystack == "book" else "holds no essays") in str(r.exception)


def test_cli_detect_copy_refuses_lengths_past_the_models_context_before_it_loads(
    roots, tiny_dir, tmp_path, monkeypatch
):
    """Trials ran at positions the model was never trained on (or failed half-way through a run)."""
    from attnrank.llm import models
    from attnrank.llm.modelconfig import model_context_length

    _niah(tmp_path)
    context = model_context_length(str(tiny_dir))
    assert context is not None and context == models.load_llm(str(tiny_dir)).context_length
    loaded = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loaded.append(a))
    args = ["heads", "detect", "--method", "copy", "--model", str(tiny_dir), "--data", str(tmp_path), "--no-save"]
    r = runner.invoke(app, [*args, "--haystack", "essays", "--lengths", f"100,{context}", "-q"])
    assert r.exit_code == 2 and not loaded
    assert f"--lengths {context} plus --max-new-tokens 50 exceeds the {context}-token context" in cli_text(r)
    for option, given in (("--lengths", "100,200,100"), ("--depths", "0,50,50.0")):  # (each trial ran twice)
        r = runner.invoke(app, [*args, option, given, "-q"])
        assert r.exit_code == 2 and not loaded and "twice; give each once" in cli_text(r), cli_text(r)


def test_cli_detect_copy_reports_no_accepted_trial(roots, tiny_dir, tmp_path):
    _niah(tmp_path, essay="Some text here. " * 40)
    r = runner.invoke(
        app,
        [
            "heads",
            "detect",
            "--method",
            "copy",
            "--model",
            str(tiny_dir),
            "--data",
            str(tmp_path),
            "--haystack",
            "essays",
            "--lengths",
            "150",
            "--depths",
            "50",
            "--max-new-tokens",
            "3",
            "-q",
        ],
    )
    assert r.exit_code != 0 and "no trial was accepted" in str(r.exception)


# --------------------------------------------------------------------------- corrupt or shared files
def _user_doc(roots, text: str | bytes, model_id="org/m", fingerprint=FP):
    path = registry.user_file(model_id, fingerprint, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_malformed_registry_entries_are_skipped_not_raised(roots):
    doc = {"format": registry.FORMAT, "model_id": "org/m", "fingerprint": FP}
    sets = [
        {"method": "copy", "heads": ["0-1"], "date": None},  # date null: once a TypeError in the sort
        "not an object",
        {"method": "qr-ndcg", "heads": "all"},  # no pairs: once resolved to an empty head list
        {"method": "qr-score", "heads": ["1-2"], "date": "2024-01-01"},
    ]
    _user_doc(roots, json.dumps({**doc, "sets": sets}))
    llm = SimpleNamespace(model_id="org/m", fingerprint=FP)
    assert [s.method for s in load_head_sets("org/m", FP)] == ["qr-score"]
    assert resolve_heads("auto", llm) == [(1, 2)]
    for bad in (
        {**doc, "sets": {"a": 1}},
        {**doc, "sets": [], "artifacts": [1]},
        {"models": 3},
        {**doc, "fingerprint": None},
    ):
        _user_doc(roots, json.dumps(bad))
        assert load_head_sets("org/m", FP) == [] and load_artifact("x", "org/m", FP) is None
    _user_doc(roots, b"\xff\xfe\x00 not text")
    assert load_head_sets("org/m", FP) == [] and load_artifact("x", "org/m", FP) is None


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00", b'{"format": "attnrank-heads/2", "sets": []}'])
def test_save_does_not_overwrite_an_unreadable_registry_file(roots, content):
    path = _user_doc(roots, content)
    with pytest.raises(InputError, match="move it away"):
        save_head_set("org/m", FP, "copy", ["0-1"])
    with pytest.raises(InputError, match="move it away"):
        save_artifact("head-weights", "org/m", FP, {"v": 1})
    assert path.read_bytes() == content


def _doc(model_id="org/m", fingerprint=FP, **extra):
    return {"format": registry.FORMAT, "model_id": model_id, "fingerprint": fingerprint, "sets": [], **extra}


@pytest.mark.parametrize(
    "content, why",
    [
        ({"models": [_doc(), _doc("org/other")]}, "one attnrank-heads"),  # a shipped-style file of two models
        (_doc(note="mine"), r"keys attnrank does not write \(note\)"),
        (_doc("org/other", "b" * 64), "belongs to 'org/other'"),
        (_doc(fingerprint=FP[:12] + "c" * 52), "belongs to 'org/m' with fingerprint"),  # same file name, other weights
    ],
)
def test_save_refuses_a_registry_file_attnrank_did_not_write_for_this_model(roots, content, why):
    """Saving rewrites the whole file: one holding other documents, keys or another model's weights
    would lose them, or re-key them to this model."""
    path = _user_doc(roots, json.dumps(content))
    before = path.read_bytes()
    for save in (lambda: save_head_set("org/m", FP, "copy", ["0-1"]), lambda: save_artifact("w", "org/m", FP, {})):
        with pytest.raises(InputError, match=why):
            save()
        with pytest.raises(InputError, match="move it away"):
            registry_save.check_saveable("org/m", FP)
    assert path.read_bytes() == before


def test_saving_keeps_what_attnrank_wrote_before(roots):
    save_head_set("org/m", FP, "copy", ["0-1"])
    save_artifact("w", "org/m", FP, {"v": 1})
    registry_save.check_saveable("org/m", FP)
    save_artifact("v", "org/m", FP, {"v": 2})
    assert load_artifact("w", "org/m", FP) == {"v": 1} and load_artifact("v", "org/m", FP) == {"v": 2}
    assert [s.pairs for s in load_head_sets("org/m", FP)][0] == [(0, 1)]


def test_an_empty_registry_file_is_saved_over(roots):
    """A 0-byte file holds nothing to lose (what a crash mid-write could leave)."""
    path = _user_doc(roots, b"")
    save_artifact("head-weights", "org/m", FP, {"v": 1})
    assert load_artifact("head-weights", "org/m", FP) == {"v": 1} and path.stat().st_size > 0


def test_newest_artifact_wins_among_ids_of_the_same_weights(roots):
    """The same weights under two ids (e.g. a model folder given as ./m and as /abs/m) share the
    fingerprint: the artifact trained last must be served, whichever file name sorts first."""
    old = save_artifact("head-weights", "/a/m", FP, {"v": "old"})
    data = json.loads(old.read_text())
    data["artifacts"]["head-weights"]["date"] = "2020-01-01T00:00:00"
    old.write_text(json.dumps(data))
    new = save_artifact("head-weights", "/z/m", FP, {"v": "new"})
    assert sorted([old.name, new.name])[0] == old.name
    assert load_artifact("head-weights", "/a/m", FP) == {"v": "new"}
    assert load_artifact("head-weights", "/z/m", FP) == {"v": "new"}


def test_saving_the_scores_of_a_loaded_set_again(roots):
    scores = np.array([[np.nan, 1.0], [2.0, 3.0]])
    save_head_set("org/m", FP, "copy", ["0-1"], scores=scores)
    (hs,) = load_head_sets("org/m", FP)
    save_head_set("org/m", FP, "copy", hs.heads, name="copy-2", scores=hs.scores)  # None = not measured
    assert [s.scores for s in load_head_sets("org/m", FP)] == [[[None, 1.0], [2.0, 3.0]]] * 2


def test_registry_writes_are_fsynced(roots, monkeypatch):
    """The registry holds detections and trained weights that cannot be regenerated cheaply."""
    import os
    import stat

    import attnrank.files

    synced: list[tuple[str, Path]] = []
    real = attnrank.files.os.fsync

    def spy(fd):  # what each fsync reached: the written file, or a folder (for the rename)
        kind = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        synced.append((kind, Path(os.readlink(f"/proc/self/fd/{fd}"))))
        return real(fd)

    monkeypatch.setattr(attnrank.files.os, "fsync", spy)
    for write in (
        lambda: save_head_set("org/m", FP, "copy", ["0-1"]),
        lambda: save_artifact("head-weights", "org/m", FP, {"v": 1}),
    ):
        synced.clear()
        saved = Path(write())
        # the file's bytes before the rename, then its folder (a power loss could leave an empty file,
        # or bring the old one back): the count alone (>= 2 over both writes) passed without either
        kinds = [k for k, _ in synced]
        assert "file" in kinds and ("folder", saved.parent) in synced, synced
        assert kinds.index("file") < synced.index(("folder", saved.parent))
        assert all(p.parent == saved.parent for k, p in synced if k == "file")


def test_cli_detect_qr_refuses_queries_without_a_relevant_candidate(roots, tiny_dir, tmp_path, scifact_mini):
    """Every head scored nDCG 0, ties went to heads 0-0, 0-1, ... and those were registered (exit 0)."""
    import json

    from attnrank.eval import read_qrels

    qrels = read_qrels(scifact_mini / "qrels" / "train.tsv")
    qids = sorted(qrels)[:2]
    relevant = {d for q in qids for d in qrels[q]}
    run = tmp_path / "run.trec"  # candidates that are none of the judged documents
    corpus = [json.loads(line) for line in (scifact_mini / "corpus.jsonl").read_text().splitlines()]
    others = [d["_id"] for d in corpus if d["_id"] not in relevant][:3]
    run.write_text("".join(f"{q} Q0 {d} {i + 1} {3 - i} bm25\n" for q in qids for i, d in enumerate(others)))
    args = ["heads", "detect", "--method", "qr", "--model", str(tiny_dir), "--queries"]
    args += [str(scifact_mini / "queries.jsonl"), "--qrels", str(scifact_mini / "qrels" / "train.tsv")]
    args += ["--corpus", str(scifact_mini / "corpus.jsonl"), "--run", str(run), "--depth", "3", "-q"]
    r = runner.invoke(app, args)
    out = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code != 0 and "no labelled query has a relevant document among its top-3" in out, out
    assert load_head_sets(*model_fingerprint(str(tiny_dir))) == []


def test_a_head_set_naming_heads_the_model_lacks_is_not_saved(roots):
    """It was saved, and failed only when a reranker read it, after loading the model."""
    scores = [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]]  # 2 layers of 4 heads
    with pytest.raises(InputError, match="7-9"):
        save_head_set("org/m", FP, "qr-ndcg", ["7-9"], scores=scores)
    with pytest.raises(InputError, match="0-4"):
        save_head_set("org/m", FP, "qr-ndcg", ["0-4"], n_layers=2, n_heads=4)
    save_head_set("org/m", FP, "qr-ndcg", ["1-3"], scores=scores)


def test_a_registry_root_that_is_a_file_is_one_input_error(tmp_path):
    """save(root=<a file>) raised FileExistsError from the lock beside the registry file."""
    (root := tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"the head registry file .*: .*notes.txt is a file, not a folder"):
        save_head_set("org/m", FP, "qr-ndcg", ["0-1"], root=root)
    with pytest.raises(InputError, match="is a file, not a folder"):
        registry_save.save_artifact("head-weights", "org/m", FP, {"w": 1}, root=root)
    assert root.read_text() == "mine"


def test_two_saves_at_once_keep_each_others_entries(roots, monkeypatch):
    """Each save read the file and renamed its own version over it: a head set saved while an
    artifact was being saved was lost (both read before either wrote)."""
    import contextlib
    import threading

    read = registry_save._load_user_doc
    both_read = threading.Barrier(2)

    def slow_read(*args, **kwargs):  # both saves reach the write together, unless one waits for the other
        doc = read(*args, **kwargs)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_read.wait(timeout=1)
        return doc

    monkeypatch.setattr(registry_save, "_load_user_doc", slow_read)
    saves = [
        threading.Thread(target=save_head_set, args=("org/m", FP, "copy", ["1-2"])),
        threading.Thread(target=save_artifact, args=("head-weights", "org/m", FP, {"w": [1.0]})),
    ]
    for t in saves:
        t.start()
    for t in saves:
        t.join(10)
    assert [s.heads for s in load_head_sets("org/m", FP)] == [["1-2"]]
    assert load_artifact("head-weights", "org/m", FP) == {"w": [1.0]}


def test_a_set_entry_that_is_not_an_object_is_refused_in_one_line(roots):
    """A save read .get of each entry: an AttributeError traceback instead of the refusal."""
    path = save_head_set("org/m", FP, "copy", ["1-2"])
    doc = json.loads(path.read_text())
    doc["sets"].append("junk")
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="holds a head set entry that is not an object"):
        save_head_set("org/m", FP, "qr-score", ["0-1"])
    del doc["sets"]  # a file holding artifacts only is one attnrank wrote (the check read doc["sets"]: KeyError)
    path.write_text(json.dumps(doc))
    save_head_set("org/m", FP, "qr-score", ["0-1"])
    assert [s.heads for s in load_head_sets("org/m", FP)] == [["0-1"]]


def _niah(root, essay="An essay. " * 50):
    """A NIAH data folder of one needle and one essay (the copy method's inputs)."""
    folder = root / "niah" / "retrieval_head"
    folder.mkdir(parents=True)
    (folder / "needles.jsonl").write_text(
        json.dumps({"needle": "The code is 42.", "question": "Code?", "real_needle": "42"}) + "\n"
    )
    (root / "niah" / "PaulGrahamEssays").mkdir()
    (root / "niah" / "PaulGrahamEssays" / "a.txt").write_text(essay)
    return root


def test_cli_detect_refuses_the_other_methods_options(roots, tiny_dir, scifact_mini, tmp_path):
    """--method qr ignored --lengths, --depths, --haystack and --max-new-tokens, and copy ignored
    --depth, --max-queries and --skip-invalid (their defaults hid that they were given)."""
    data = ["--queries", str(scifact_mini / "queries.jsonl"), "--qrels", str(scifact_mini / "qrels" / "train.tsv")]
    base = ["heads", "detect", "--model", str(tiny_dir), "--no-save", "-q"]
    r = runner.invoke(app, [*base, "--method", "qr", *data, "--lengths", "500", "--haystack", "essays"])
    assert r.exit_code == 2 and "--lengths, --haystack configure(s) --method copy, not qr" in cli_text(r)
    r = runner.invoke(app, [*base, "--method", "copy", "--data", str(_niah(tmp_path)), "--lengths", ""])
    assert r.exit_code == 2 and "--lengths '' must be token counts" in cli_text(r)  # not the defaults, silently
    r = runner.invoke(app, [*base, "--method", "copy", "--data", str(tmp_path), "--max-queries", "3"])
    assert r.exit_code == 2 and "--max-queries configure(s) --method qr, not copy" in cli_text(r)
    corpus = ["--corpus", str(scifact_mini / "corpus.jsonl")]
    r = runner.invoke(app, [*base, "--method", "qr", *data, *corpus, "--data", str(tmp_path)])  # was ignored
    assert r.exit_code == 2 and "is read with --dataset" in cli_text(r)


def test_cli_detect_copy_refuses_a_length_its_haystack_cannot_fill_before_the_model_loads(
    roots, tiny_dir, tmp_path, monkeypatch
):
    """A length the haystack was too short for failed the detection half-way through its trials."""
    from attnrank.llm import models

    _niah(tmp_path)  # an essay of about 150 tokens
    loaded = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loaded.append(a))
    args = ["heads", "detect", "--method", "copy", "--model", str(tiny_dir), "--data", str(tmp_path), "--no-save"]
    r = runner.invoke(app, [*args, "--haystack", "essays", "--lengths", "100,2000", "-q"])
    assert r.exit_code == 1 and not loaded
    assert "context length 2000 does not fit" in cli_text(r) and "the haystack has" in cli_text(r)
    r = runner.invoke(app, [*args, "--haystack", "essays", "--lengths", "100,2", "-q"])  # shorter than the needle
    assert r.exit_code == 1 and not loaded and "context length 2 does not fit" in cli_text(r)


def test_replacing_a_head_set_is_warned_of(roots, caplog):
    """Sets are named after their method, so a second detection replaced the first without a word."""
    save_head_set("org/m", FP, "qr-ndcg", ["1-1"], data="scifact", date="2026-01-01")
    assert "replaced" not in caplog.text
    save_head_set("org/m", FP, "qr-ndcg", ["2-2"], data="hotpotqa")
    assert "head set 'qr-ndcg' of org/m replaced: the one detected 2026-01-01 on scifact" in caplog.text
    save_head_set("org/m", FP, "qr-ndcg", ["3-3"], name="second")  # another name keeps both
    assert sorted(s.name for s in load_head_sets("org/m", FP)) == ["qr-ndcg", "second"]


def test_weights_fitted_to_bm25_of_another_stemmer_are_named_stale(roots, caplog):
    """Candidate BM25 stems only where PyStemmer imports (the 'stem' extra); weights fitted on one
    install and applied on the other read BM25 of other terms without a word."""
    from attnrank.rerank.fused import FusedWeights
    from attnrank.rerank.fused_features import FusionExample
    from attnrank.rerank.fused_resolve import resolve_fused
    from attnrank.rerank.fused_training import train_fused
    from attnrank.rerank.signals import SIGNALS_VERSION, candidate_terms

    here = candidate_terms().stemmer
    other = "none" if here == "porter" else "porter"
    weights = FusedWeights(["attention", "bm25", "dense"], [1.0, 0.5, 0.25], base_weights=[0.5, 0.25])
    weights.signals_version = SIGNALS_VERSION
    for stemmer, warned in ((None, False), (here, False), (other, True)):
        caplog.clear()
        weights.bm25_stemmer = stemmer
        weights.save("org/m", FP)
        assert resolve_fused("auto", "org/m", FP).bm25_stemmer == stemmer  # type: ignore[union-attr]
        assert (
            f"candidate BM25 with stemmer {other!r}; this install computes it with {here!r}" in caplog.text
        ) is warned
    rng = np.random.default_rng(0)
    ex = [
        FusionExample(f"q{i}", ["a", "b", "c"], {"bm25": rng.random(3), "dense": rng.random(3)}, np.array([1, 0, 0]))
        for i in range(4)
    ]
    assert train_fused(ex, ["bm25", "dense"], gate=False).bm25_stemmer == here  # recorded when fitted
    assert train_fused(ex, ["dense"], gate=False).bm25_stemmer is None


def test_the_registry_digest_covers_the_packaged_models_fallback_weights(roots):
    """A model with no fused weights of its own is scored with the packaged model's shipped ones;
    the digest a batch resume compares left them out, so rows scored with two of them could mix."""
    from attnrank.rerank.fused import FusedWeights

    def ship(weight: float, profiles: int = 0) -> str:
        payload = FusedWeights(["attention", "bm25"], [weight, 1.0], base_weights=[1.0]).to_json()
        artifacts = {"fused-weights": {"payload": payload}, "slot-profiles": {"payload": {"n": profiles}}}
        _ship(roots, "smollm2-135m", "*", [], artifacts, name="packaged.json")
        return registry.registry_digest("other/model", FP)

    assert ship(1.0) != ship(1.5)  # an upgrade that ships other weights
    assert ship(1.0) == ship(1.0, profiles=1)  # what it does not read of the packaged model's: not counted
    registry_save.save_artifact("fused-weights", "other/model", FP, {"w": 1})  # its own weights: the fallback unread
    assert ship(1.0) == ship(1.5)


def test_replacing_registered_weights_names_them(roots, caplog):
    """heads train and train --preset fused replaced the user's registered weights without a word
    (save_head_set warned; the weights of a long earlier run were simply gone)."""
    save_artifact("head-weights", "org/m", FP, {"trained_on": "dataset A", "w": [1]})
    with caplog.at_level("WARNING", logger="attnrank.registry"):
        save_artifact("head-weights", "org/m", FP, {"trained_on": "dataset A", "w": [1]})  # the same: quiet
        assert caplog.text == ""
        save_artifact("head-weights", "org/m", FP, {"trained_on": "dataset B", "w": [2]})
    assert (
        "replacing the head-weights registered for org/m in " in caplog.text and "(trained on dataset A)" in caplog.text
    )
    assert load_artifact("head-weights", "org/m", FP)["trained_on"] == "dataset B"


def test_an_update_reads_this_models_file_alone(roots, caplog):
    """The current payload came from any user file of the same weights (another id's): a slot-profile
    merge copied that id's profiles into this file, frozen, and a first save warned of replacing them."""
    from attnrank.registry_save import update_artifact

    save_artifact("slot-profiles", "/models/a", FP, {"20": [1]})
    seen = []
    update_artifact("slot-profiles", "/models/b", FP, lambda current: seen.append(current) or {"40": [2]})
    assert seen == [None]
    b = json.loads(registry.user_file("/models/b", FP, None).read_text())
    assert b["artifacts"]["slot-profiles"]["payload"] == {"40": [2]}
    with caplog.at_level("WARNING", logger="attnrank.registry"):
        save_artifact("head-weights", "/models/a", FP, {"v": 1})
        save_artifact("head-weights", "/models/b", FP, {"v": 2})
    assert "replacing" not in caplog.text
    path = registry.user_file("/models/b", FP, None)  # an entry that is no object (hand-edited) is replaced
    doc = json.loads(path.read_text())
    doc["artifacts"]["slot-profiles"] = ["not", "an", "entry"]
    path.write_text(json.dumps(doc))
    update_artifact("slot-profiles", "/models/b", FP, lambda current: seen.append(current) or {"60": [3]})
    assert seen[-1] is None and json.loads(path.read_text())["artifacts"]["slot-profiles"]["payload"] == {"60": [3]}


def test_a_registry_it_cannot_write_is_named_before_training(roots):
    """check_saveable only read the file: a file where the registry folder would be (or a read-only
    one) failed at the save, after the capture and the fit, and the trained weights were lost."""
    folder = registry.user_file("org/m", FP, None).parent  # (ATTNRANK_HOME/heads)
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.write_text("not a folder")
    with pytest.raises(InputError, match="is a file, not a folder"):
        registry_save.check_saveable("org/m", FP)


def test_cli_detect_that_saves_nothing_exits_non_zero(roots, tmp_path, scifact_mini):
    """`heads detect` printed "not saved: every head scored the same" and exited 0, read by a script
    as a registered set (`--heads auto` still read the one before)."""
    import torch
    from _tiny import tiny_model, tiny_tokenizer

    model = tiny_model("llama", max_positions=4096)  # (room for a SciFact abstract's prompt)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # every attention weight alike: every head scores the same
    folder = tmp_path / "flat"
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    data = ["--queries", str(scifact_mini / "queries.jsonl"), "--qrels", str(scifact_mini / "qrels" / "train.tsv")]
    args = ["heads", "detect", "--method", "qr", "--model", str(folder), *data, "--max-queries", "3", "-q"]
    r = runner.invoke(app, [*args, "--corpus", str(scifact_mini / "corpus.jsonl")])
    assert "not saved: every head scored the same" in r.output, cli_text(r)
    assert r.exit_code == 1 and "no head set was saved" in cli_text(r), cli_text(r)


def test_a_fingerprint_cannot_lead_a_save_out_of_the_registry_and_a_short_one_is_named(tmp_path):
    """save(fingerprint="/../../escaped") wrote outside the root; load(..., "b179c9523d0e"), the 12
    characters file names show, found nothing and said so with the same 12 characters twice."""
    from attnrank.rerank.fused import SignalsWeights

    root = tmp_path / "reg"
    path = save_head_set("org/m", "/../../escaped", "qr-ndcg", ["0-1"], root=root)
    assert path.parent == root and not (tmp_path / "escap.json").exists()
    with pytest.raises(InputError, match=r"a fingerprint is the 64 hex characters of LLM.fingerprint, not 'abcd'"):
        SignalsWeights.load("org/m", "abcd", root=root)
