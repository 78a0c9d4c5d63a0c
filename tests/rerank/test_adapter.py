"""Head adapters (QRRanker-style LoRA on q/k): the differentiable score equals the captured one at
zero adapters, training lowers the listwise loss, only q/k of layers <= the deepest head change,
and the saved adapter round-trips."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import replace

import pytest
import torch

pytest.importorskip("peft")

from _tiny import RERANK_QUERY, rerank_docs, tiny_model, tiny_tokenizer

from attnrank.errors import InputError
from attnrank.heads.queryfocused import detect_query_focused
from attnrank.llm.attention import AttentionCapturer
from attnrank.llm.capture import capture_window
from attnrank.llm.models import LLM
from attnrank.llm.prompts import build_rerank_prompts
from attnrank.llm.rows import document_scores, token_scores
from attnrank.rerank.adapter import (
    AdapterConfig,
    HeadAdapter,
    ListInstance,
    add_lora,
    list_scores,
    listwise_loss,
    prompt_options,
    train_head_adapter,
)
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.position import SlotProfile, store_profile
from attnrank.rerank.profile import measure_slot_profile
from attnrank.types import Document

HEADS = [(1, 0), (2, 3), (2, 1)]  # deepest layer 2 of 4


def _llm(family: str = "llama") -> LLM:
    model = tiny_model(family, layers=4, heads=4, kv_heads=2, max_positions=2048)
    return LLM(model=model, tokenizer=tiny_tokenizer(), model_id=f"tiny-{family}", fingerprint="a" * 64)


def _captured(llm: LLM, query: str, docs) -> torch.Tensor:
    """The reranker's no-grad capture path (prefix cache + suffix), uncalibrated and unfiltered."""
    pair = build_rerank_prompts(llm.tokenizer, query, docs, **prompt_options())
    w = capture_window(AttentionCapturer(llm.model, HEADS), pair, calibrate=False)
    return torch.as_tensor(document_scores(token_scores(w.real), w.spans, use_filter=False))


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma"])
def test_zero_adapter_score_equals_captured_score(family):
    llm = _llm(family)
    docs = rerank_docs()
    model = copy.deepcopy(llm.model)
    add_lora(model, 2, rank=4, alpha=8)
    scores = list_scores(AttentionCapturer(model, HEADS), llm.tokenizer, RERANK_QUERY, docs, prompt_options())
    assert scores.requires_grad and scores.shape == (len(docs),)
    torch.testing.assert_close(scores.detach().double(), _captured(llm, RERANK_QUERY, docs), atol=1e-5, rtol=0)
    # the adapters are in the graph: a non-zero B changes the scores
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    moved = list_scores(AttentionCapturer(model, HEADS), llm.tokenizer, RERANK_QUERY, docs, prompt_options())
    assert (moved.detach() - scores.detach()).abs().max() > 1e-4


def test_listwise_loss_values():
    s = torch.tensor([1.0, 0.0, 0.5])
    expected = -math.log(math.exp(10) / (math.exp(10) + 1 + math.exp(5)))
    assert float(listwise_loss(s, [1, 0, 0], 0.1, True)) == pytest.approx(expected)
    # two positives: the log of their summed probability; scale-free when normalised
    two = float(listwise_loss(s * 7 + 3, [1, 0, 1], 0.1, True))
    assert two == pytest.approx(-math.log((math.exp(10) + math.exp(5)) / (math.exp(10) + 1 + math.exp(5))))
    assert float(listwise_loss(s, [1, 0, 0], 1.0, False)) == pytest.approx(
        -math.log(math.e / (math.e + 1 + math.exp(0.5)))
    )
    with pytest.raises(InputError):
        listwise_loss(s, [0, 0, 0], 0.1, True)


def _lists() -> list[ListInstance]:
    docs = rerank_docs()
    return [
        ListInstance(RERANK_QUERY, docs, [1, 0, 0, 0]),
        ListInstance("capital of Germany?", docs[::-1], [0, 0, 1, 0]),
        ListInstance("what fruit is yellow?", docs, [0, 0, 1, 0]),
        ListInstance("no negatives", docs[:2], [1, 1]),  # skipped: no contrast
    ]


def _mean_loss(llm: LLM, lists: list[ListInstance]) -> float:
    cap = AttentionCapturer(llm.model, HEADS)
    return sum(
        float(listwise_loss(list_scores(cap, llm.tokenizer, x.query, x.docs, prompt_options()), x.labels, 0.1, True))
        for x in lists
    ) / len(lists)


@pytest.fixture(scope="module")
def trained():
    llm = _llm()
    cfg = AdapterConfig(rank=4, alpha=8.0, steps=24, lr=3e-3)
    return llm, train_head_adapter(llm, HEADS, _lists(), config=cfg)


def test_training_lowers_the_loss(trained):
    llm, adapter = trained
    usable = [x for x in _lists() if x.usable]
    before = _mean_loss(llm, usable)
    after = _mean_loss(adapter.apply(llm), usable)
    assert after < before - 0.05, (before, after)
    info = adapter.info
    assert info["steps"] == 24 and info["lists"] == 3 and info["lists_skipped"] == 1 and len(info["losses"]) == 24


def test_adapter_touches_only_qk_up_to_the_deepest_head(trained):
    llm, adapter = trained
    assert adapter.deepest_layer == 2
    for key in adapter.tensors:
        m = re.search(r"layers\.(\d+)\.self_attn\.(q_proj|k_proj)\.lora_[AB]", key)
        assert m is not None and int(m.group(1)) <= 2, key
    before = dict(llm.model.state_dict())
    after = adapter.apply(llm).model.state_dict()
    assert set(after) == set(before)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    expected = {f"model.layers.{i}.self_attn.{p}.weight" for i in range(3) for p in ("q_proj", "k_proj")}
    assert changed == expected
    assert not any("lora" in n for n, _ in llm.model.named_parameters())  # the input model is untouched
    assert not any(p.requires_grad for p in adapter.apply(llm).model.parameters())


def test_save_load_apply_round_trip(trained, tmp_path):
    llm, adapter = trained
    loaded = HeadAdapter.load(adapter.save(tmp_path / "ad"))
    assert loaded.heads == adapter.heads and loaded.rank == 4 and loaded.digest() == adapter.digest()
    a, b = adapter.apply(llm), loaded.apply(llm)
    for (k, v), w in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(v, w), k
    assert a.weights_key != llm.weights_key and a.fingerprint == llm.fingerprint
    half = adapter.apply(replace(llm, model=copy.deepcopy(llm.model).to(torch.bfloat16)))
    assert half.weights_key not in (a.weights_key, llm.weights_key)  # bfloat16 rows never read as float32's
    with pytest.raises(InputError, match=f"lora-{adapter.digest()}"):
        adapter.apply(a)  # an adapted model is not adapted again
    other = LLM(model=llm.model, tokenizer=llm.tokenizer, model_id="x", fingerprint="b" * 64)
    with pytest.raises(InputError, match="trained on"):
        adapter.apply(other)


def test_training_needs_a_contrastive_list():
    llm = _llm()
    with pytest.raises(InputError, match="positive and a negative"):
        train_head_adapter(llm, HEADS, [ListInstance("q", rerank_docs()[:2], [1, 1])], config=AdapterConfig(steps=1))
    with pytest.raises(InputError):
        AdapterConfig(rank=0)
    # refused when configured: AdamW and numpy refused them after the model had been copied
    with pytest.raises(InputError, match="weight_decay=-0.5 must be a finite number >= 0"):
        AdapterConfig(weight_decay=-0.5)
    with pytest.raises(InputError, match="seed=-3 must be an integer >= 0"):
        AdapterConfig(seed=-3)
    with pytest.raises(InputError, match="heads is empty"):  # before: max() arg is an empty sequence
        train_head_adapter(llm, [], _lists(), config=AdapterConfig(steps=1))


def test_a_list_longer_than_the_context_is_refused_before_training():
    llm = LLM(
        model=tiny_model("llama", layers=3, max_positions=128),
        tokenizer=tiny_tokenizer(),
        model_id="t",
        fingerprint="a" * 64,
    )
    docs = [Document(f"d{i}", "word " * 40) for i in range(6)]
    with pytest.raises(InputError, match=r"training list #0 .* past the 128-token context of t; give fewer candidates"):
        train_head_adapter(llm, HEADS, [ListInstance("q", docs, [1, 0, 0, 0, 0, 0])], config=AdapterConfig(steps=1))


def test_time_budget_ends_training_early():
    llm = _llm()
    ad = train_head_adapter(llm, HEADS, _lists(), config=AdapterConfig(rank=2, steps=50), max_seconds=0.0)
    assert ad.info["steps"] == 1 and ad.info["steps_planned"] == 50 and len(ad.info["losses"]) == 1


def test_a_save_that_fails_leaves_the_adapter_already_in_the_folder_whole(tmp_path):
    first = HeadAdapter({"w": torch.ones(2)}, [(0, 1)], 0, 8, 16.0, "tiny", "a" * 64, {"steps": 3})
    first.save(tmp_path)
    second = HeadAdapter({"w": torch.zeros(2)}, [(1, 2)], 1, 8, 16.0, "tiny", "a" * 64, {"data": tmp_path})
    with pytest.raises(TypeError, match="not JSON serializable"):  # a Path in info
        second.save(tmp_path)
    back = HeadAdapter.load(tmp_path)  # not the second's tensors under the first's heads and layers
    assert back.heads == [(0, 1)] and torch.equal(back.tensors["w"], torch.ones(2))


def test_a_folder_of_another_tool_is_refused_in_one_line(tmp_path):
    HeadAdapter({"w": torch.ones(2)}, [(0, 1)], 0, 8, 16.0, "tiny", "a" * 64).save(tmp_path)
    (tmp_path / "adapter.json").write_text('{"heads": [[0, 1]], "peft_type": "LORA"}', encoding="utf-8")
    # before: TypeError: HeadAdapter.__init__() got an unexpected keyword argument 'peft_type'
    with pytest.raises(InputError, match=r"adapter.json is not a head adapter's \(TypeError: .*peft_type"):
        HeadAdapter.load(tmp_path)
    (tmp_path / "adapter.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(InputError, match="is not a head adapter's"):  # before: a JSONDecodeError traceback
        HeadAdapter.load(tmp_path)


def test_save_replaces_only_a_head_adapter(tmp_path):
    """A folder's adapter.json / adapter.safetensors that are not a head adapter's are refused,
    never overwritten; a head adapter saved there before is replaced."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "adapter.json").write_text('{"peft_type": "LORA"}', encoding="utf-8")
    adapter = HeadAdapter({"w": torch.ones(2)}, [(0, 1)], 0, 8, 16.0, "tiny", "a" * 64)
    with pytest.raises(InputError, match="adapter.json exists and is not a head adapter's metadata"):
        adapter.save(user)
    assert (user / "adapter.json").read_text(encoding="utf-8") == '{"peft_type": "LORA"}'
    assert not (user / "adapter.safetensors").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "adapter.safetensors").write_bytes(b"the user's own weights")
    with pytest.raises(InputError, match="adapter.safetensors exists and is not a head adapter's tensors"):
        adapter.save(other)
    assert (other / "adapter.safetensors").read_bytes() == b"the user's own weights"
    ours = tmp_path / "ours"
    adapter.save(ours)
    HeadAdapter({"w": torch.zeros(3)}, [(1, 2)], 1, 8, 16.0, "tiny", "a" * 64).save(ours)
    assert HeadAdapter.load(ours).heads == [(1, 2)]
    # a user's file under the tensors' name beside an adapter's metadata: refused (it was replaced,
    # as the metadata was attnrank's)
    (ours / "adapter.safetensors").write_bytes(b"USER DATA")
    with pytest.raises(InputError, match="adapter.safetensors exists and is not a head adapter's tensors"):
        adapter.save(ours)
    assert (ours / "adapter.safetensors").read_bytes() == b"USER DATA"


def test_load_refuses_tensors_the_metadata_was_not_saved_with(tmp_path):
    """A save interrupted between its two files (or a tensors file copied in) is detected, not
    loaded as the other save's adapter."""
    HeadAdapter({"w": torch.ones(2)}, [(0, 1)], 0, 8, 16.0, "tiny", "a" * 64).save(tmp_path / "a")
    HeadAdapter({"w": torch.zeros(2)}, [(0, 1)], 0, 8, 16.0, "tiny", "a" * 64).save(tmp_path / "b")
    (tmp_path / "a" / "adapter.safetensors").write_bytes((tmp_path / "b" / "adapter.safetensors").read_bytes())
    with pytest.raises(InputError, match="is not the tensors .*adapter.json was saved with"):
        HeadAdapter.load(tmp_path / "a")


def test_what_is_measured_on_an_adapted_model_is_not_registered_as_the_base_models(trained, tmp_path):
    """The adapted copy keeps the base fingerprint (to read the base's registry entries); head
    scores and slot profiles measured on it would be saved under that fingerprint as the base's."""
    llm, adapter = trained
    adapted = adapter.apply(llm)
    assert adapted.adapter == f"lora-{adapter.digest()}" and llm.adapter == ""
    docs = rerank_docs()
    qrels = {"q": {docs[0].id: 1}}
    base = detect_query_focused(AttentionReranker(llm, None), {"q": RERANK_QUERY}, {"q": docs}, qrels)["qr-score"]
    assert base.adapter == "" and base.save(2, root=tmp_path).exists()
    scores = detect_query_focused(AttentionReranker(adapted, None), {"q": RERANK_QUERY}, {"q": docs}, qrels)
    assert scores["qr-score"].adapter == adapted.adapter
    with pytest.raises(InputError, match="head adapter lora-.* detect on the model without the adapter"):
        scores["qr-score"].save(2, root=tmp_path / "adapted")
    assert not (tmp_path / "adapted").exists()
    profile = measure_slot_profile(AttentionReranker(adapted, None), docs, n_slots=2, n_trials=1)
    assert profile.adapter == adapted.adapter
    with pytest.raises(InputError, match="with head adapter lora-.*save it to a file"):
        store_profile(profile, root=tmp_path / "adapted")
    assert not (tmp_path / "adapted").exists()
    assert SlotProfile.load(profile.save(tmp_path / "p.json")) == profile  # a file: saved and read as measured


def test_a_list_with_a_label_per_candidate_missing_is_refused_when_made():
    """It passed every check and failed at whichever training step reached it, naming no list."""
    docs = rerank_docs()[:3]
    with pytest.raises(InputError, match="the list of query 'q' has 3 candidates and 2 labels"):
        ListInstance("q", docs, [1, 0])


def test_an_adapter_is_not_trained_on_an_adapted_model():
    """Trained on top of another adapter's merged weights, it was saved for the base weights and
    later merged into them as if learned there."""
    llm = _llm()
    first = train_head_adapter(llm, HEADS, _lists(), config=AdapterConfig(rank=2, steps=1))
    with pytest.raises(InputError, match="load it unquantized and without an adapter"):
        train_head_adapter(first.apply(llm), HEADS, _lists(), config=AdapterConfig(rank=2, steps=1))


def test_learned_weights_record_the_adapter_and_score_only_on_its_model(trained, tmp_path):
    """Learned head weights trained on an adapted model's features were saved under the base
    fingerprint and scored the plain model's heads with the adapted model's weighting."""
    import numpy as np

    from attnrank.rerank.learned import QueryFeatures, train_head_weights

    llm, adapter = trained
    adapted = adapter.apply(llm)
    heads = list(HEADS)
    ex = [
        QueryFeatures(f"q{i}", ["a", "b", "c"], np.eye(3)[:, :3] * (i + 1), np.array([1, 0, 0]), heads)
        for i in range(4)
    ]
    weights = train_head_weights(ex, adapter=adapted.adapter)
    assert weights.config.adapter == adapted.adapter
    with pytest.raises(InputError, match="head adapter lora-.*registry keys weights by the base"):
        weights.save(llm.model_id, llm.fingerprint, root=tmp_path / "registry")
    assert not (tmp_path / "registry").exists()
    with pytest.raises(InputError, match="trained on the model with the head adapter lora-.* this one has none"):
        AttentionReranker(llm, scorer=weights, signals=None)
    assert AttentionReranker(adapted, scorer=weights, signals=None).learned is weights
    plain = train_head_weights(ex)  # and the other way round
    with pytest.raises(InputError, match="without a head adapter, and this one has the head adapter lora-"):
        AttentionReranker(adapted, scorer=plain, signals=None)


def test_fused_weights_record_the_adapter_and_score_only_on_its_model(trained, tmp_path):
    """Fused weights fitted to an adapted model's attention were saved under the base fingerprint,
    and applied to the plain model's attention (or base ones to the adapted model's) unchecked."""
    from attnrank.rerank.fused import UNTRAINED, FusedWeights

    llm, adapter = trained
    adapted = adapter.apply(llm)
    heads = [f"{l}-{h}" for l, h in HEADS]
    fitted = FusedWeights(["attention", "bm25"], [1.0, 0.5], base_weights=[1.0], heads=heads, adapter=adapted.adapter)
    with pytest.raises(InputError, match="head adapter lora-.*registry keys weights by the base"):
        fitted.save(llm.model_id, llm.fingerprint, root=tmp_path / "registry")
    assert not (tmp_path / "registry").exists()
    with pytest.raises(InputError, match="model with the head adapter lora-.* this model has none"):
        AttentionReranker(llm, signals=fitted)
    assert AttentionReranker(adapted, signals=fitted).fused is not None
    plain = FusedWeights(["attention", "bm25"], [1.0, 0.5], base_weights=[1.0], heads=heads)
    with pytest.raises(InputError, match="without a head adapter, and this model has the head adapter lora-"):
        AttentionReranker(adapted, signals=plain)
    # weights that read no LLM feature, or trained on nothing, are the model's whatever adapter it carries
    assert AttentionReranker(adapted, signals=FusedWeights(["bm25", "dense"], [1.0, 1.0])).fused is not None
    assert AttentionReranker(adapted, config="likelihood").fused.trained_on == UNTRAINED


def test_training_that_diverges_says_so_naming_the_step_and_the_learning_rate():
    """At a learning rate far too high the weights left the finite numbers, and the next capture
    failed as 'check the model weights and dtype (float16 overflow)': the wrong cause."""
    llm = _llm()
    with pytest.raises(InputError, match=r"adapter training diverged at step \d+.*lower lr=1e\+06"):
        train_head_adapter(llm, HEADS, _lists(), config=AdapterConfig(rank=4, alpha=8.0, steps=24, lr=1e6))
