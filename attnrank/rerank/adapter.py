"""QRRanker-style fine-tuning of the selected retrieval heads: low-rank adapters on query/key.

QRRanker (Li et al., "Query-focused and Memory-aware Reranker for Long Context Processing",
arXiv 2602.12192) takes the query-focused retrieval heads found with QRHead's score (Zhang et al.,
EMNLP 2025), builds listwise instances (a query and its candidate list), and trains those heads
with a group-wise contrastive loss over the documents' attention scores; at inference it reads the
heads' attention averaged over the question tokens and summed over each document's tokens. This
module does the same for attnrank's registered heads, on a CPU:

- **score** (:func:`list_scores`): the reranker's own prompt (:func:`build_rerank_prompts`) run
  once up to the deepest selected layer, the selected heads' query-span rows kept differentiable
  (:meth:`AttentionCapturer.capture` with ``grad=True``; no full attention maps are asked for),
  ``s_d = Σ_h Σ_{j∈d} (1/|T_q|) Σ_{t∈T_q} a_h(t→j)``. This is the reranker's uncalibrated,
  unfiltered sum: ICR's "N/A" calibration and μ−2σ filter stay out of the loss (the filter is
  not differentiable; calibration would add a second suffix pass per step);
- **adapters** (:func:`add_lora`): LoRA (peft) on ``q_proj``/``k_proj`` of layers
  0..deepest selected layer only, the rest of the model frozen;
- **loss** (:func:`listwise_loss`): ``−log Σ_{d∈D⁺} softmax(ŝ/τ)_d`` over each candidate list,
  ``ŝ`` the max–min normalised scores (QRRanker's normalisation, second-hand): the heads' raw
  scores are shares of an attention budget whose size varies with the prompt length and with how
  much goes to the sink and the query, so a per-list rescaling lets one ``τ`` serve 10-paragraph
  and 20-turn lists alike;
- :class:`HeadAdapter`: the trained tensors and what they were trained for; saved as
  ``adapter.safetensors`` + ``adapter.json``, applied by merging into a copy of the model's
  weights, so the reranker's capture path (and its speed) is unchanged.
"""

from __future__ import annotations

import copy
import json
import logging
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InputError, require
from ..files import atomic_path, check_file_target, file_sha256, refuse_replacing
from ..llm.attention import AttentionCapturer
from ..llm.models import ADAPTED, LLM
from ..llm.prompts import build_rerank_prompts
from ..llm.recording import forward_lock
from ..types import Document, is_count
from .config import RerankConfig

logger = logging.getLogger(__name__)

TARGETS = ("q_proj", "k_proj")
WEIGHTS_FILE, META_FILE = "adapter.safetensors", "adapter.json"


def _peft() -> Any:
    return require("peft", "train", "Fine-tuning the retrieval heads with low-rank adapters")


@dataclass(frozen=True)
class AdapterConfig:
    """LoRA shape and training settings (rank 8 and alpha 16 as QRRanker-scale defaults; AdamW)."""

    rank: int = 8
    alpha: float = 16.0
    steps: int = 200
    lr: float = 1e-4
    weight_decay: float = 0.0
    temperature: float = 0.1
    normalize: bool = True  # max–min per list before the softmax
    clip_norm: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("rank", "steps"):
            value = getattr(self, key)
            if not is_count(value):
                raise InputError(f"{key}={value!r} must be a positive integer")
            object.__setattr__(self, key, int(value))  # a NumPy integer written as JSON
        for key in ("alpha", "lr", "temperature", "clip_norm"):
            if not float(getattr(self, key)) > 0:
                raise InputError(f"{key}={getattr(self, key)!r} must be > 0")
        decay = self.weight_decay
        if isinstance(decay, bool) or not isinstance(decay, numbers.Real) or not 0 <= float(decay) < float("inf"):
            raise InputError(f"weight_decay={decay!r} must be a finite number >= 0")  # (AdamW refused it, late)
        if not is_count(self.seed, 0):
            raise InputError(f"seed={self.seed!r} must be an integer >= 0")
        # NumPy values kept as Python ones: the adapter's metadata is JSON
        object.__setattr__(self, "weight_decay", float(decay))
        object.__setattr__(self, "seed", int(self.seed))


@dataclass(frozen=True)
class ListInstance:
    """One listwise training instance: a query, its candidates (first-stage order), binary labels."""

    query: str
    docs: list[Document]
    labels: list[int]

    def __post_init__(self) -> None:  # (a short label list failed only at the training step reaching it)
        if len(self.labels) != len(self.docs):
            raise InputError(
                f"the list of query {self.query[:60]!r} has {len(self.docs)} candidates and {len(self.labels)} "
                "labels; give one label per candidate"
            )

    @property
    def usable(self) -> bool:
        """A contrastive loss needs at least one positive and one negative."""
        n_pos = sum(1 for y in self.labels if y > 0)
        return 0 < n_pos < len(self.labels)


def prompt_options(config: RerankConfig | None = None) -> dict[str, Any]:
    """The prompt settings of :class:`AttentionReranker` for ``config`` (default: its defaults)."""
    cfg = config or RerankConfig()
    return dict(
        instruction=cfg.instruction, order=cfg.order, max_doc_words=cfg.max_doc_words, max_doc_tokens=cfg.max_doc_tokens
    )


def add_lora(model: Any, deepest_layer: int, rank: int, alpha: float) -> Any:
    """Inject LoRA (peft) into ``q_proj``/``k_proj`` of layers 0..``deepest_layer`` of ``model``
    in place, freeze everything else; returns the peft wrapper (``model`` itself is modified).
    The adapters start at zero (B = 0), so the model's outputs are unchanged until trained."""
    peft = _peft()
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    if not set(TARGETS) <= names:
        raise InputError(
            f"{type(model).__name__} has no separate {TARGETS} linear layers (found {sorted(names)[:8]}); "
            "head adapters need a Llama/Qwen2/Mistral/Gemma-style attention with q_proj and k_proj"
        )
    cfg = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=list(TARGETS),
        layers_to_transform=list(range(deepest_layer + 1)),
        bias="none",
    )
    wrapped = peft.get_peft_model(model, cfg)
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
    return wrapped


def list_scores(
    capturer: AttentionCapturer, tokenizer: Any, query: str, docs: Sequence[Document], prompt: dict[str, Any]
) -> torch.Tensor:
    """Differentiable ``[D]`` passage scores (input order) of the capturer's heads: query-span
    attention averaged over the query tokens, summed over each passage's tokens and the heads."""
    pair = build_rerank_prompts(tokenizer, query, list(docs), **prompt)
    rows = capturer.capture(pair.real.input_ids, query_start=pair.real.query_start, grad=True)
    tokens = rows.sum(0)
    return torch.stack([tokens[s:e].sum() for s, e in pair.real.doc_spans])


def check_prompt_lengths(llm: LLM, lists: Sequence[ListInstance], prompt: dict[str, Any]) -> None:
    """Each list is one prompt (no windows while training): one longer than the model's context
    would train on positions the model never saw, so it is refused before training starts."""
    for n, item in enumerate(lists):
        length = len(build_rerank_prompts(llm.tokenizer, item.query, list(item.docs), **prompt).real.input_ids)
        if length > llm.context_length:
            raise InputError(
                f"training list #{n} ({item.query[:40]!r}, {len(item.docs)} candidates) is a {length}-token prompt, "
                f"past the {llm.context_length}-token context of {llm.model_id}; give fewer candidates per list "
                "or cut them shorter (max_doc_words)"
            )


def listwise_loss(scores: torch.Tensor, labels: Sequence[int], temperature: float, normalize: bool) -> torch.Tensor:
    """Group-wise contrastive loss ``−log Σ_{d∈D⁺} softmax(ŝ/τ)_d`` over one candidate list;
    ``ŝ`` = ``scores`` max–min normalised to [0, 1] when ``normalize``."""
    pos = torch.as_tensor([y > 0 for y in labels], dtype=torch.bool, device=scores.device)
    if pos.shape != scores.shape or not bool(pos.any()):
        raise InputError(f"labels must give one value per score ({scores.shape[0]}) with at least one positive")
    s = scores.double()
    if normalize:
        s = (s - s.min()) / (s.max() - s.min()).clamp_min(1e-12)
    logp = torch.log_softmax(s / temperature, dim=0)
    return -torch.logsumexp(logp[pos], dim=0)


@dataclass
class HeadAdapter:
    """Trained LoRA tensors for one model's retrieval heads, and what they were trained for."""

    tensors: dict[str, torch.Tensor]
    heads: list[tuple[int, int]]
    deepest_layer: int
    rank: int
    alpha: float
    model_id: str
    fingerprint: str
    info: dict[str, Any] = field(default_factory=dict)  # training config, data, time, losses

    def save(self, folder: str | Path) -> Path:
        """Write ``adapter.safetensors`` (the tensors, marked as attnrank's) and ``adapter.json``
        (the rest, with the tensors file's SHA-256) into ``folder``, each atomically. Files of
        those names that are not a head adapter's are refused, never replaced."""
        from safetensors.torch import save_file

        meta = {k: v for k, v in asdict(self).items() if k != "tensors"}
        meta["heads"] = [list(h) for h in self.heads]
        json.dumps(meta)  # before any file is written: a bad info value leaves a saved adapter whole
        out = Path(folder)
        if out.exists() and not out.is_dir():  # (mkdir's FileExistsError)
            raise InputError(f"adapter folder {out} is a file; give a folder for {WEIGHTS_FILE} and {META_FILE}")
        for name in (WEIGHTS_FILE, META_FILE):
            check_file_target(out / name, "head adapter file")
        # each file by its own test: a user's file under the tensors' name was replaced wherever the
        # metadata beside it was an adapter's (the tensors file it describes, by its SHA-256, may go)
        described = _described_weights(out / META_FILE)
        refuse_replacing(
            out / WEIGHTS_FILE,
            lambda p: _is_adapter_weights(p) or described == file_sha256(p),
            "a head adapter's tensors file",
            "head adapter file",
        )
        refuse_replacing(out / META_FILE, _is_adapter_meta, "a head adapter's metadata", "head adapter file")
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.tensors.items()}
        with atomic_path(out / WEIGHTS_FILE) as tmp:
            save_file(tensors, str(tmp), metadata={"attnrank": ADAPTER_MARK})
            meta["weights_sha256"] = file_sha256(tmp)
        with atomic_path(out / META_FILE) as tmp:
            tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8")
        return out

    @classmethod
    def load(cls, folder: str | Path) -> HeadAdapter:
        from safetensors.torch import load_file

        path = Path(folder)
        if not (path / META_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
            raise InputError(f"{path} holds no {META_FILE} + {WEIGHTS_FILE}; pass a folder written by HeadAdapter.save")
        meta = _read_adapter_meta(path / META_FILE)
        digest = meta.pop("weights_sha256", None)  # (adapters saved before it was recorded have none)
        if digest is not None and digest != file_sha256(path / WEIGHTS_FILE):
            raise InputError(
                f"{path / WEIGHTS_FILE} is not the tensors {path / META_FILE} was saved with (a save interrupted "
                "between its two files, or a file copied in); save the adapter again"
            )
        return cls(**{**meta, "tensors": load_file(str(path / WEIGHTS_FILE))})

    def apply(self, llm: LLM) -> LLM:
        """A copy of ``llm`` whose q/k weights have the adapter merged in (``llm`` is untouched).
        The copy keeps ``llm``'s id and fingerprint (the head registry is keyed by them) and marks
        its :attr:`LLM.weights_key` with the adapter, so cached activations never mix the two."""
        if llm.fingerprint != self.fingerprint or llm.quantization:
            raise InputError(
                f"this adapter was trained on {self.model_id} (fingerprint {self.fingerprint[:12]}), not on "
                f"{llm.model_id} ({llm.fingerprint[:12]}{', ' + llm.quantization if llm.quantization else ''}); load "
                "that model unquantized and without an adapter, or train an adapter for this one"
            )
        peft = _peft()
        with forward_lock(llm.model):  # (a capture under way in another thread hooks and switches the model)
            model = copy.deepcopy(llm.model)
        wrapped = add_lora(model, self.deepest_layer, self.rank, self.alpha)
        result = peft.set_peft_model_state_dict(wrapped, self.tensors)
        if getattr(result, "unexpected_keys", None):
            raise InputError(f"adapter tensors {result.unexpected_keys[:3]} do not fit {llm.model_id}")
        merged = wrapped.merge_and_unload()
        for p in merged.parameters():
            p.requires_grad_(False)
        return replace(llm, model=merged.eval(), quantization=f"{ADAPTED}{self.digest()}")

    def digest(self) -> str:
        """A short content hash of the tensors (what the adapted model's weights key records)."""
        import hashlib

        h = hashlib.sha256()
        for k in sorted(self.tensors):
            h.update(k.encode())
            h.update(self.tensors[k].detach().cpu().float().numpy().tobytes())
        return h.hexdigest()[:12]


ADAPTER_MARK = "head-adapter"


def _read_adapter_meta(path: Path) -> dict[str, Any]:
    """A head adapter's metadata, its fields checked (``weights_sha256`` kept); an error if not one."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        meta["heads"] = [(int(l), int(h)) for l, h in meta["heads"]]
        fields = {k: v for k, v in meta.items() if k != "weights_sha256"}
        HeadAdapter(**{**fields, "tensors": {}})  # the fields, checked before the tensors are read
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
        raise InputError(
            f"{path} is not a head adapter's ({type(e).__name__}: {e}); pass a folder written by HeadAdapter.save"
        ) from None
    return meta


def _is_adapter_meta(path: Path) -> bool:
    try:
        _read_adapter_meta(path)
    except InputError:
        return False
    return True


def _described_weights(meta: Path) -> str | None:
    """The SHA-256 of the tensors file that the head adapter metadata ``meta`` describes (None where
    ``meta`` is no adapter's, or records none)."""
    try:
        return _read_adapter_meta(meta).get("weights_sha256")
    except InputError:
        return None


def _is_adapter_weights(path: Path) -> bool:
    """A safetensors file :meth:`HeadAdapter.save` marked as a head adapter's."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("attnrank") == ADAPTER_MARK
    except Exception:  # not safetensors at all: not recognisably ours
        return False


def train_head_adapter(
    llm: LLM,
    heads: Sequence[tuple[int, int]],
    lists: Sequence[ListInstance],
    *,
    config: AdapterConfig | None = None,
    prompt: dict[str, Any] | None = None,
    progress: Callable[[int, float], object] | None = None,
    max_seconds: float | None = None,
) -> HeadAdapter:
    """Train LoRA adapters on q/k of layers 0..max layer of ``heads`` so that the heads' passage
    scores (:func:`list_scores`) rank each list's positives first (:func:`listwise_loss`).

    One list per AdamW step, ``config.steps`` steps over the usable lists in a seeded shuffled
    order (repeated if there are fewer lists than steps). ``llm`` is not modified (a copy is
    trained). ``prompt``: :func:`prompt_options` (default: the reranker's defaults);
    ``progress(step, loss)`` is called after every step; ``max_seconds`` ends training after the
    step that passes this wall time (a CPU budget). The returned adapter's ``info`` holds the
    per-step losses, the steps done, the wall time and s/step."""
    cfg = config or AdapterConfig()
    if llm.quantization:  # (an adapter is saved for the base weights' fingerprint: it must be trained on them)
        raise InputError(
            f"{llm.model_id} is loaded {llm.quantization}; an adapter is trained on, and saved for, the model's "
            "own weights: load it unquantized and without an adapter"
        )
    usable = [x for x in lists if x.usable]
    if not usable:
        raise InputError(
            f"none of the {len(lists)} lists has both a positive and a negative candidate; a listwise "
            "contrastive loss needs both (label some candidates relevant, and keep some irrelevant)"
        )
    pairs = sorted({(int(l), int(h)) for l, h in heads})
    if not pairs:
        raise InputError("heads is empty; pass the (layer, head) pairs to train, e.g. the model's registered set")
    deepest = max(l for l, _ in pairs)
    prompt = prompt_options() if prompt is None else prompt
    check_prompt_lengths(llm, usable, prompt)
    with forward_lock(llm.model):  # (a capture under way in another thread hooks and switches the model)
        model = copy.deepcopy(llm.model).float().eval()
    on_gpu = [model.device] if model.device.type == "cuda" else []  # (fork_rng starts CUDA on every GPU otherwise)
    with torch.random.fork_rng(devices=on_gpu):  # seeded LoRA init, the caller's own random stream left as it was
        torch.manual_seed(cfg.seed)
        wrapped = add_lora(model, deepest, cfg.rank, cfg.alpha)
    capturer = AttentionCapturer(model, pairs)
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(cfg.seed)
    order: list[int] = []
    while len(order) < cfg.steps:
        order.extend(rng.permutation(len(usable)).tolist())
    losses: list[float] = []
    start = time.perf_counter()
    for step, i in enumerate(order[: cfg.steps]):
        item = usable[i]
        scores = list_scores(capturer, llm.tokenizer, item.query, item.docs, prompt)
        loss = listwise_loss(scores, item.labels, cfg.temperature, cfg.normalize)
        if not torch.isfinite(loss):  # (the next capture failed as "check the dtype": the wrong cause)
            raise InputError(f"adapter training diverged at step {step + 1} (loss {loss.item()}); lower lr={cfg.lr:g}")
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm)
        optim.step()
        if not all(bool(torch.isfinite(p).all()) for p in params):
            raise InputError(
                f"adapter training diverged at step {step + 1}: its weights are no longer finite; lower lr={cfg.lr:g}"
            )
        losses.append(loss.item())
        if progress is not None:
            progress(step, losses[-1])
        if (step + 1) % 25 == 0:
            logger.info("adapter step %d/%d: mean loss of the last 25 %.4f", step + 1, cfg.steps, np.mean(losses[-25:]))
        if max_seconds is not None and time.perf_counter() - start > max_seconds:
            logger.info("adapter training stopped at step %d/%d: %.0f s budget spent", step + 1, cfg.steps, max_seconds)
            break
    seconds = time.perf_counter() - start
    peft = _peft()
    tensors = {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(wrapped).items()}
    info = {
        "config": asdict(cfg),
        "prompt": dict(prompt),
        "lists": len(usable),
        "lists_skipped": len(lists) - len(usable),
        "steps": len(losses),
        "steps_planned": cfg.steps,
        "seconds": round(seconds, 2),
        "seconds_per_step": round(seconds / len(losses), 3),
        "threads": torch.get_num_threads(),
        "losses": [round(x, 5) for x in losses],
    }
    return HeadAdapter(tensors, pairs, deepest, cfg.rank, cfg.alpha, llm.model_id, llm.fingerprint, info)
