"""Tests of ``dtype="int8"`` (attnrank.llm.quantize): dynamic int8 linear layers on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnrank.errors import InputError, ModelError
from attnrank.llm import device as llm_device
from attnrank.llm import quantize
from attnrank.llm.models import clear_llm_cache, load_llm
from attnrank.registry_save import save_head_set
from attnrank.rerank.attention import AttentionReranker
from attnrank.types import Document

pytestmark = pytest.mark.skipif(not quantize.int8_available(), reason="this torch has no dynamic int8 engine")

WORDS = [
    "the",
    "capital",
    "city",
    "of",
    "france",
    "is",
    "paris",
    "river",
    "seine",
    "flows",
    "germany",
    "berlin",
    "bananas",
    "yellow",
    "rome",
    "italy",
    "old",
]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    clear_llm_cache()
    yield
    clear_llm_cache()


def _docs(n: int = 12) -> list[Document]:
    rng = np.random.default_rng(0)
    return [Document(f"d{i}", " ".join(rng.choice(WORDS, size=int(rng.integers(6, 20))))) for i in range(n)]


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def test_int8_load_keeps_the_fingerprint(tiny_dir):
    f32 = load_llm(str(tiny_dir), dtype="float32")
    q = load_llm(str(tiny_dir), dtype="int8")
    assert q is not f32 and load_llm(str(tiny_dir), dtype="INT8") is q  # its own process-cache entry
    assert q.quantization == "int8" and f32.quantization == ""
    assert q.fingerprint == f32.fingerprint  # same model: registered artifacts apply
    assert q.weights_key != f32.weights_key == f32.fingerprint  # computed states must not mix
    assert q.dtype == torch.float32
    modules = list(q.model.model.layers.modules())
    assert not any(type(m) is torch.nn.Linear for m in modules)
    assert sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in modules) == 3 * 7  # q k v o gate up down
    assert type(q.model.lm_head) is torch.nn.Linear  # logits stay float32
    assert type(f32.model.model.layers[0].mlp.up_proj) is torch.nn.Linear  # the float model is untouched


def test_int8_scores_are_finite_and_close_to_float32(tiny_dir):
    docs = _docs()
    f32 = AttentionReranker(load_llm(str(tiny_dir), dtype="float32"), heads="all", signals=None).score(
        "where is the capital of france", docs
    )
    q = AttentionReranker(load_llm(str(tiny_dir), dtype="int8"), heads="all", signals=None).score(
        "where is the capital of france", docs
    )
    assert np.all(np.isfinite(q)) and q.shape == f32.shape
    assert not np.array_equal(q, f32)  # int8 really ran
    assert _spearman(q, f32) >= 0.9
    assert np.max(np.abs(q - f32)) <= 0.05 * np.max(np.abs(f32))


def test_registered_heads_resolve_for_the_int8_model(tiny_dir, tmp_path):
    f32 = load_llm(str(tiny_dir))
    save_head_set(f32.model_id, f32.fingerprint, "qr", "0-1,2-3")
    q = load_llm(str(tiny_dir), dtype="int8")
    rr = AttentionReranker(q, heads="auto", signals=None)
    assert rr.heads == [(0, 1), (2, 3)]
    assert np.all(np.isfinite(rr.score("capital of france", _docs(4))))


def test_int8_off_cpu_is_refused():
    with pytest.raises(InputError, match=r"dtype='int8'.*CPU only.*device='cpu'"):
        llm_device.resolve_dtype("int8", torch.device("cuda:0"))
    assert llm_device.dtype_name("int8", torch.device("cpu")) == "int8"
    assert llm_device.dtype_name("auto", torch.device("cpu")) in ("float32", "bfloat16")  # never int8


def test_int8_without_an_engine_names_the_fix_before_the_weights_load(tiny_dir, monkeypatch):
    """On a CPU without an int8 engine (ARM's qnnpack only) the weights loaded, then it was refused."""
    from attnrank.llm import models

    loads: list[object] = []
    monkeypatch.setattr(models, "_load_folder", lambda *a, **k: loads.append(a))
    monkeypatch.setattr(quantize, "int8_available", lambda: False)
    with pytest.raises(ModelError, match=r"dtype='int8'.*use dtype='float32' or 'bfloat16'"):
        load_llm(str(tiny_dir), dtype="int8")
    assert loads == []


def test_int8_block_states_do_not_depend_on_the_blocks_encoded_beside_them():
    """A dynamic int8 linear quantizes its input with one scale per pass: packed or batched with
    other passages, a block got other states than alone, under the same cache key (warm rows
    differed from cold ones, and a passage's score from its neighbours)."""
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.attention import AttentionCapturer
    from attnrank.llm.blocks import build_block_prompts
    from attnrank.llm.states import encode_blocks

    model = tiny_model("llama", layers=2)
    quantize.quantize_int8(model)
    assert quantize.is_int8(model)
    capturer = AttentionCapturer(model, [(1, 0)])
    tok = tiny_tokenizer()
    prompt = build_block_prompts(tok, "Where is Paris?", ["Paris is in France.", "ZZZZ " * 30])
    prefix = capturer.prefill(prompt.prefix_ids)
    short, long = prompt.blocks
    alone = encode_blocks(capturer, prefix, [short], [prefix.length])[0]
    beside = encode_blocks(capturer, prefix, [short, long], [prefix.length, prefix.length])[0]
    assert torch.equal(alone.keys, beside.keys) and torch.equal(alone.values, beside.values)


def test_an_int8_models_query_likelihood_does_not_depend_on_the_other_passages():
    """The likelihood's passes batched several passages' prompts: in int8 one input scale over the
    batch made a passage's log-probabilities depend on its neighbours (and the states kept under
    its ids too). They run one per pass there, cold and warm alike."""
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.likelihood import continuation_logprob
    from attnrank.llm.models import LLM
    from attnrank.llm.states import StateCache

    model = tiny_model("llama", layers=2)
    quantize.quantize_int8(model)
    tok = tiny_tokenizer()
    llm = LLM(model=model, tokenizer=tok, model_id="tiny-int8", fingerprint="c" * 64, quantization="int8")
    a = tok("Passage: Paris is in France. Question:", add_special_tokens=False)["input_ids"]
    b = tok("Passage: " + "ZZZZ " * 40 + "Question:", add_special_tokens=False)["input_ids"]
    cont = tok(" where is Paris", add_special_tokens=False)["input_ids"]
    alone = continuation_logprob(llm, [a], cont)[0]
    beside = continuation_logprob(llm, [a, b], cont)[0]
    np.testing.assert_array_equal(alone, beside)
    # an int8 model keeps no states (a state kept from a pass with one query's tokens would depend on
    # that query): a second call scores in full again, equal to the first
    cache = StateCache(64 * 2**20)
    first = continuation_logprob(llm, [a, b], cont, states=cache)[0]
    assert len(cache) == 0
    np.testing.assert_array_equal(continuation_logprob(llm, [a, b], cont, states=cache)[0], first)
    np.testing.assert_array_equal(first, alone)


def test_an_int8_models_block_windows_are_each_scored_alone():
    """Windows batched into one suffix pass shared int8's input scale, so a window's rows changed
    with the others in the pass: they run one per pass, as for sliding-window models."""
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.attention import AttentionCapturer
    from attnrank.llm.blocks import build_block_prompts
    from attnrank.llm.capture import capture_block_windows

    model = tiny_model("llama", layers=2)
    quantize.quantize_int8(model)
    capturer = AttentionCapturer(model, [(0, 1), (1, 0)])
    whole = build_block_prompts(tiny_tokenizer(), "Where is Paris?", ["Paris is in France.", "Rome is in Italy. " * 8])
    first, second = whole.select([0], "forward"), whole.select([1], "forward")
    prefix = capturer.prefill(first.prefix_ids)
    alone = capture_block_windows(capturer, [first], prefix, fingerprint="t", positions="rotated")[0]
    beside = capture_block_windows(capturer, [first, second], prefix, fingerprint="t", positions="rotated")[0]
    np.testing.assert_array_equal(alone.real, beside.real)


def test_an_int8_models_pointwise_scores_do_not_depend_on_the_batch():
    """The pointwise (yes/no) reranker batched its prompts: in int8 a passage's score moved with
    the passages beside it."""
    from _tiny import rerank_docs, tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM
    from attnrank.rerank.generative import PointwiseReranker

    model = tiny_model("llama", layers=2)
    quantize.quantize_int8(model)
    llm = LLM(model=model, tokenizer=tiny_tokenizer(), model_id="tiny-int8", fingerprint="d" * 64, quantization="int8")
    docs = rerank_docs()[:3]
    batched = PointwiseReranker(llm, batch_size=3).score("capital of France?", docs)
    alone = [PointwiseReranker(llm, batch_size=1).score("capital of France?", [d])[0] for d in docs]
    np.testing.assert_array_equal(batched, alone)


def test_an_int8_models_query_rows_do_not_depend_on_the_calibration_suffix():
    """The real query and the "N/A" calibration suffix ran in one pass, sharing int8's input
    scale: the query's rows moved with the "N/A" beside it (and would with a longer one)."""
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.attention import AttentionCapturer
    from attnrank.llm.capture import capture_window
    from attnrank.llm.prompts import build_rerank_prompts

    model = tiny_model("llama", layers=2)
    quantize.quantize_int8(model)
    capturer = AttentionCapturer(model, [(0, 1), (1, 0)])
    pair = build_rerank_prompts(tiny_tokenizer(), "Where is Paris?", ["Paris is in France.", "Rome is in Italy."])
    calibrated = capture_window(capturer, pair, calibrate=True, query_span="full")
    alone = capture_window(capturer, pair, calibrate=False, query_span="full")
    np.testing.assert_array_equal(calibrated.real, alone.real)


def test_int8_quantizes_the_language_decoder_of_a_multimodal_model():
    """The first module list named "*layers" was quantized: in a multimodal model, the vision
    tower's, while the language decoder kept running in float32 and the model said int8."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    cfg = Gemma3Config(
        text_config=dict(
            vocab_size=300,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=28,
            patch_size=14,
        ),
        mm_tokens_per_image=4,
    )
    model = Gemma3ForConditionalGeneration(cfg).eval()
    quantize.quantize_int8(model)
    quantized = [n for n, m in model.named_modules() if isinstance(m, DynamicInt8Linear)]
    assert quantized and all(n.startswith("model.language_model.layers.") for n in quantized)


def test_an_architecture_int8_cannot_quantize_is_refused_before_its_weights_load(tmp_path, monkeypatch):
    """GPT-2 (its layers in `.h`, Conv1D projections) loaded in full, then int8 refused it."""
    from _tiny import tiny_tokenizer
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=259, n_embd=32, n_layer=2, n_head=4, n_positions=256)).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    weights: list[object] = []
    real_from = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained", lambda *a, **k: weights.append(a) or real_from(*a, **k)
    )
    clear_llm_cache()
    with pytest.raises(ModelError, match="no decoder layer list found; int8 cannot be applied"):
        load_llm(str(folder), dtype="int8")
    assert weights == []  # refused from its config, no weights read
