"""What a batch run computes (:class:`BatchConfig`, recorded in its checkpoint) and the actors it
runs it on (:class:`Resources`): the settings of :func:`attnrank.batch.runner.run_batch`."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import cpu_auto_dtype
from ..errors import InputError
from ..index.settings import INDEX_FILES, MODES
from ..index.sharded.layout import is_sharded, read_sharded
from ..index.store import read_manifest
from ..rerank.config import RerankConfig
from ..rerank.resolve import check_head_list, check_lookups

# The devices a rerank actor can use: Ray shows it only the one GPU it declares, as cuda:0
ACTOR_DEVICES = re.compile(r"cpu|cuda(:0)?")


@dataclass
class BatchConfig:
    """What a batch run computes (recorded in the checkpoint; a resume must match it)."""

    index: str
    k: int = 10
    rerank: int = 0
    mode: str | None = None
    model: str | None = None
    heads: str | None = None
    device: str = "cpu"
    preset: str | None = None  # the reranking preset (None: the default), with model, heads, device on top
    dtype: str = "auto"  # the reranker's; "auto" on a CPU is resolved in the driver (:meth:`resolved`)

    def rerank_config(self) -> RerankConfig:
        """The reranker's one configuration object: the preset with the options given, and nothing
        kept from one query to the next (``state_cache_mb=0``). Why: states and vectors reused from
        an earlier query are computed in other shapes, so in bfloat16 a query's scores would move
        with the history of the actor that reranks it; each query reranked as if alone, a resumed
        or redistributed run writes the run one clean process writes."""
        given = {k: v for k, v in (("model", self.model), ("heads", self.heads)) if v is not None}
        return RerankConfig.preset(self.preset or "", device=self.device, dtype=self.dtype, state_cache_mb=0, **given)

    def resolved(self) -> BatchConfig:
        """This configuration with ``dtype="auto"`` decided here, once, by the driver, for
        ``device="cpu"``: "auto" means bfloat16 on a CPU that multiplies it in hardware and float32
        elsewhere, so actors on other machines (a resume there, a mixed Ray cluster) would otherwise
        each decide, and mix precisions in one run; with ``device="cuda"``, "auto" is refused by
        :meth:`check` for the same reason. (``attnrank batch`` takes ``cpu`` or ``cuda``; ``"auto"``, taken before,
        ran on the CPU and is read as ``cpu`` here.)"""
        if self.dtype.strip().lower() != "auto" or self.device not in ("cpu", "auto"):
            return self
        return replace(self, dtype=cpu_auto_dtype())

    def check(self) -> None:
        if self.k < 1:
            raise InputError(f"--top-k {self.k} must be at least 1 (results per query)")
        if self.mode is not None and self.mode not in MODES:
            raise InputError(f"--mode {self.mode!r} is not one of {', '.join(MODES)} (or none: the index's own)")
        if self.rerank < 0:
            raise InputError(f"--rerank {self.rerank} must be 0 (off) or a positive depth")
        if self.heads is not None and not isinstance(self.heads, str):
            # (a checkpoint records the settings as JSON: a list of pairs read back as lists never matched)
            raise InputError(
                f"heads={self.heads!r} is not a string; give 'all', 'l-h,l-h' (e.g. '13-18,14-2') or a JSON file's path"
            )
        if self.rerank and self.device != "auto":  # (auto, taken before: cpu)
            check_actor_device(self.device)
        if not Path(self.index).is_dir():
            raise InputError(f"index {self.index!r} is not a folder; build one with `attnrank index` (--shards N)")
        # its manifest (format, version, listed files) before Ray starts: every actor's load failed
        # in its constructor otherwise, which Ray retries without end
        root = Path(self.index)
        read_sharded(root) if is_sharded(root) else read_manifest(root, required=INDEX_FILES)
        # e.g. heads with a preset that computes no attention, nothing registered, heads outside the model
        if self.rerank:
            cfg = self.rerank_config()
            if cfg.uses_attention:
                check_head_list(cfg.heads, cfg.model)
            check_lookups(cfg)
        if self.rerank and self.device.startswith("cuda") and self.dtype.strip().lower() == "auto":
            # each actor's GPU would decide (bfloat16 where it has it, float16 elsewhere), and a run
            # resumed or scheduled on other GPUs would mix precisions under one recorded "auto"
            raise InputError(
                "--dtype auto with --device cuda lets each worker's GPU choose bfloat16 or float16, so one run "
                "could mix them; give --dtype bfloat16 (A100, H100, L4, ...) or --dtype float16 (T4, V100)"
            )


def check_actor_device(device: str, spelled: str = "device=") -> None:
    """Refuse a rerank actor's ``device`` other than cpu or cuda (:data:`ACTOR_DEVICES`), named as
    ``spelled`` writes the option (``"--device "`` in the CLI). Why: Ray shows an actor only the one
    GPU it declares, as cuda:0, so cuda:1 failed in every actor, retried without end."""
    if not ACTOR_DEVICES.fullmatch(device):
        raise InputError(
            f"{spelled}{device!r} is not cpu or cuda (each rerank actor declares one GPU, which Ray shows it as cuda)"
        )


def check_device(device: str, ray_address: str | None, gpus: float) -> None:
    """A cuda reranker whose actors could never see a GPU, refused before Ray starts: actors that
    declare none (``gpus``: :attr:`Resources.rerank_gpus`), as Ray hides the GPUs from them, or a
    local Ray (``ray_address`` None) on a machine without one. Each failed in every actor, retried
    without end, or waited for a node that never joins."""
    if not device.startswith("cuda"):
        return
    if not gpus > 0:
        raise InputError(
            f"device={device!r} with rerank_gpus={gpus}: Ray hides the GPUs from an actor that declares none; "
            "give Resources(rerank_gpus=1), or device='cpu'"
        )
    if ray_address is None:
        import torch  # (a cuda device only: torch's CUDA check)

        if not torch.cuda.is_available():
            raise InputError(
                f"device {device!r}: this machine has no CUDA GPU for the local Ray; use device cpu "
                "or the address of a Ray cluster with GPUs (--ray-address)"
            )


@dataclass
class Resources:
    """Actors per stage and what each declares to Ray (CPUs may be fractions)."""

    retrieval_actors: int = 1
    rerank_actors: int = 1
    retrieval_cpus: float = 1.0
    rerank_cpus: float = 1.0
    rerank_gpus: float = 0.0
    retrieval_batch: int = 16
    rerank_batch: int = 4

    @property
    def retrieval_threads(self) -> int:
        """The torch threads of a retrieval actor: its CPUs, rounded, at least one."""
        return max(1, round(self.retrieval_cpus))

    @property
    def rerank_threads(self) -> int:
        """The torch threads of a rerank actor: its CPUs, rounded, at least one."""
        return max(1, round(self.rerank_cpus))
