"""Tiny models and tokenizers built in memory for tests (no downloads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer():
    """A byte-level BPE tokenizer without merges (one token per byte) plus 3 special tokens."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(tok_models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>", unk_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model(
    family: str = "llama",
    vocab_size: int = 259,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 256,
    **config: object,
):
    """A random causal LM of ``family`` (GQA: ``heads`` query heads over ``kv_heads``): one of
    the four below, or any transformers name with a ``<name>Config`` (``"Phi"``, ``"Lfm2"``;
    ``"Gemma3Text"`` builds ``Gemma3ForCausalLM``); ``config``: further config fields."""
    import transformers

    torch.manual_seed(0)
    names = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "gemma": "Gemma"}
    name = names.get(family, family)
    cfg_cls = getattr(transformers, f"{name}Config")
    model_cls = getattr(transformers, f"{name.removesuffix('Text')}ForCausalLM")
    cfg = cfg_cls(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=8,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        **config,
    )
    return model_cls(cfg).eval()


def tiny_latent_attention_model():
    """A tiny DeepSeek-V3 (multi-head latent attention): values 6 wide, keys 12 (8 + 4 rotary)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV3Config(
        vocab_size=259, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
        kv_lora_rank=16, q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=2,
        head_dim=4, max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    return DeepseekV3ForCausalLM(cfg).eval()


def tiny_longrope_model(max_positions: int = 160, switch: int = 40):
    """A tiny random Phi-3 whose LongRoPE switches to its long rotary frequencies past ``switch``
    positions (frequencies that follow the pass's longest position)."""
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0] * 4,
        "long_factor": [4.0] * 4,
        "original_max_position_embeddings": switch,
        "factor": 4.0,
    }
    return tiny_model(
        "Phi3",
        layers=2,
        max_positions=max_positions,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        rope_parameters=rope,
        original_max_position_embeddings=switch,
    )


def save_tiny(path: Path, family: str = "llama", **kw) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tiny_tokenizer().save_pretrained(path)
    tiny_model(family, **kw).save_pretrained(path)
    return path


def tiny_llm(layers: int = 4, heads: int = 4, kv_heads: int = 2, max_positions: int = 2048):
    """An :class:`attnrank.llm.models.LLM` around a tiny random Llama and the byte tokenizer."""
    from attnrank.llm.models import LLM

    model = tiny_model("llama", layers=layers, heads=heads, kv_heads=kv_heads, max_positions=max_positions)
    return LLM(model=model, tokenizer=tiny_tokenizer(), model_id="tiny-llama", fingerprint="test")


# A small candidate list for reranking tests: one relevant passage, near misses and noise.
RERANK_DOCS_SPEC = [
    ("paris", "Paris is the capital of France.", "Paris"),
    ("berlin", "Berlin is the capital of Germany.", "Berlin"),
    ("banana", "Bananas are yellow.", "Fruit"),
    ("rome", "Rome is in Italy.", ""),
]
RERANK_QUERY = "capital of France?"


def rerank_docs():
    from attnrank.types import Document

    return [Document(i, t, h) for i, t, h in RERANK_DOCS_SPEC]


ENCODER_WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "vitamin",
    "d",
    "and",
    "bone",
    "fractures",
    "in",
    "older",
    "adults",
    "a",
    "paris",
    "is",
    "capital",
    "of",
    "france",
    "seine",
    "flows",
    "through",
    "it",
]


def save_tiny_encoder(path: Path, seed: int = 0, prompts: dict[str, str] | None = None) -> Path:
    """A random 2-layer BERT with a WordPiece vocabulary, as a sentence-transformers folder (mean
    pooling; ``prompts``: its role prompts, e.g. e5's ``{"query": "query: ", "document": "passage: "}``)."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    raw = path.parent / f"{path.name}-hf"
    raw.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(set(ENCODER_WORDS)), *"abcdefghijklmnopqrstuvwxyz"]
    (raw / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(raw / "vocab.txt"), do_lower_case=True).save_pretrained(raw)
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    BertModel(cfg).save_pretrained(raw)
    transformer = models.Transformer(str(raw), max_seq_length=24)
    st = SentenceTransformer(
        modules=[transformer, models.Pooling(32, "mean"), models.Normalize()], device="cpu", prompts=prompts
    )
    st.save(str(path))
    return path


def save_tiny_router(path: Path) -> Path:
    """A sentence-transformers Router over two tiny encoders (mean pooling for queries, CLS for
    documents) without a default route: it embeds no text without a role."""
    from sentence_transformers import SentenceTransformer, models

    save_tiny_encoder(path.parent / f"{path.name}-base")
    raw = str(path.parent / f"{path.name}-base-hf")

    def route(pooling: str) -> list[Any]:
        return [models.Transformer(raw, max_seq_length=24), models.Pooling(32, pooling), models.Normalize()]

    router = models.Router.for_query_document(route("mean"), route("cls"), default_route=None, allow_empty_key=False)
    SentenceTransformer(modules=[router], device="cpu").save(str(path))
    return path
