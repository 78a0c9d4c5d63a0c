"""A batch run's checkpoint folder (:func:`attnrank.batch.runner.run_batch`): the settings a
resume must match, the files a run writes there (anything else means the folder is not a
checkpoint, and it is never written into), and the lock that keeps a second run out."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import atomic_path, held_lock, is_batch_parquet
from ..rerank.versions import scores_moved
from .parts import FINISH_FILE
from .sink import PART_FILE

logger = logging.getLogger(__name__)

SETTINGS = "settings.json"


# Settings recorded after the first checkpoints were written: a checkpoint without one is not refused for it.
_LATER = (
    "index_tag",
    "model_fingerprint",
    "heads_in_file",
    "registry",
    "signals_version",
    "likelihood_model",
    "dtype",  # resolved by the driver since 2026-12-05; before, "auto" decided by each actor
)


def check_folder(parts_dir: Path) -> None:
    """Make the checkpoint folder, unless it is a file or a folder attnrank did not write (never written into)."""
    if parts_dir.exists() and not parts_dir.is_dir():
        raise InputError(f"checkpoint {parts_dir} is a file, not a folder; give another --checkpoint")
    if (parts_dir / SETTINGS).exists():  # (a run's own -o may sit beside them: other files are not scanned)
        read_settings(parts_dir / SETTINGS)  # refuses a folder whose settings are not a checkpoint's
        foreign = None
    else:
        # (pyarrow's write_dataset names its files part-0.parquet too: without settings, a part must carry the mark)
        foreign = (
            next((f.name for f in parts_dir.iterdir() if not is_checkpoint_file(f)), None)
            if parts_dir.exists()
            else None
        )
    if foreign is not None:
        raise InputError(
            f"checkpoint {parts_dir} holds {foreign!r}, which no attnrank batch run writes, so it is not an attnrank "
            "batch checkpoint; refusing to write into it; give another --checkpoint"
        )
    parts_dir.mkdir(parents=True, exist_ok=True)


def _unrecorded(theirs: dict[str, Any]) -> dict[str, Any]:
    """Settings a checkpoint holds without recording them: what every run before the record did.
    ``candidate_stemmer`` (2026-12-05): a run that computed signals stemmed (it could not run
    without PyStemmer), so a resume without it is refused, not mixed."""
    return {"candidate_stemmer": "porter" if theirs.get("signals_version") is not None else None}


def check_checkpoint(parts_dir: Path, mine: dict[str, Any], reads: ScoresRead = (True, True)) -> None:
    """With the checkpoint locked (:func:`locked_checkpoint`: two runs starting at once never both write
    settings): start it with the run's settings ``mine``, or accept it if written with the same.
    ``reads``: whether the run's scores read attention and the query likelihood; a checkpoint of
    another scoring version is accepted where neither kind it reads moved since (:func:`same_scores`)."""
    path = parts_dir / SETTINGS
    if not path.exists():
        part = next(iter(sorted(parts_dir.glob("part-*.parquet"))), None)
        if part is not None:  # (a run writes its settings before any row): whose rows they are is unknown
            raise InputError(
                f"checkpoint {parts_dir} holds rows ({part.name}) but no {SETTINGS}, so the settings they were "
                "computed with are unknown and they cannot be resumed; delete the folder's part files, or give "
                "another --checkpoint"
            )
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(mine, indent=1), encoding="utf-8")
        return
    theirs = read_settings(path)
    if isinstance(theirs.get("index"), str):  # (checkpoints before 2026-12-05 kept the folder as typed)
        theirs = {**theirs, "index": str(Path(theirs["index"]).resolve())}
    theirs = {**_unrecorded(theirs), **theirs}
    # devices batch took before it refused them: "auto" declared no GPU (the actors ran on the CPU) and
    # Ray shows an actor its one GPU as cuda:0, so their rows are cpu's and cuda's
    theirs["device"] = _RENAMED_DEVICES.get(str(theirs["device"]), theirs["device"])
    mine = {**mine, "device": _RENAMED_DEVICES.get(str(mine["device"]), mine["device"])}
    diff = sorted(
        k
        for k in mine
        if mine[k] != theirs.get(k)
        and not (k in _LATER and k not in theirs)
        and not (k == "scoring_version" and same_scores(theirs.get(k), mine[k], reads))
    )
    if diff and not any(parts_dir.glob("part-*.parquet")):  # no rows yet (a run that failed to start)
        logger.info("checkpoint %s holds no rows: its settings are replaced (%s)", parts_dir, ", ".join(diff))
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(mine, indent=1), encoding="utf-8")
        return
    if diff:
        raise InputError(
            f"checkpoint {parts_dir} holds a run with other settings ({', '.join(diff)}); "
            "delete it or give another --checkpoint"
        )


# Whether a run's scores read (attention, the query likelihood).
ScoresRead = tuple[bool, bool]


def same_scores(theirs: Any, mine: Any, reads: ScoresRead) -> bool:
    """Whether rows of scoring version ``theirs`` score as this attnrank's (``mine``) do for a run
    whose scores read ``reads``: no kind it reads moved since (:func:`~attnrank.rerank.versions.scores_moved`).
    Why: version 2 moved the likelihood alone, and an attention run begun at version 1 was refused a
    resume, its hours of rows computed again. Either missing (no reranking, or a checkpoint written
    before the version was recorded): only the same."""
    if not isinstance(theirs, int) or not isinstance(mine, int):
        return bool(theirs == mine)
    attention, likelihood = reads
    return not scores_moved(theirs, attention=attention, likelihood=likelihood)


_RENAMED_DEVICES = {"auto": "cpu", "cuda:0": "cuda"}
# The options every checkpoint's settings have recorded since the first (BatchConfig's fields then).
_RECORDED = ("index", "k", "rerank", "mode", "model", "heads", "device")
_CHECKPOINT_FILE = re.compile(  # (FINISH_FILE's temporary copy: left where a finish was killed)
    rf"^(\.lock|{re.escape(SETTINGS)}|part-\d+\.parquet|\.(part-\d+\.parquet|{re.escape(SETTINGS)}|"
    rf"{re.escape(FINISH_FILE)})\.tmp-.+)$"
)


def is_checkpoint_file(path: Path) -> bool:
    """A file a run writes in a checkpoint (lock, settings, parts that carry the batch mark, and
    theirs being written): a folder holding anything else is not a checkpoint, and is never
    written into."""
    if _CHECKPOINT_FILE.match(path.name) is None:
        return False
    return not PART_FILE.match(path.name) or is_batch_parquet(path)


def read_settings(path: Path) -> dict[str, Any]:
    try:
        theirs = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        theirs = None
    # every option of the run, as each checkpoint records them (a user's settings.json with an
    # "index" key alone was taken for one, and replaced)
    if not isinstance(theirs, dict) or not set(_RECORDED) <= theirs.keys():
        raise InputError(
            f"{path} is not an attnrank batch checkpoint's settings; delete the folder or give another --checkpoint"
        )
    return theirs


@contextlib.contextmanager
def locked_checkpoint(parts_dir: Path) -> Iterator[None]:
    """Hold ``parts_dir`` for one run: a second run on the same checkpoint is refused, not interleaved."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(held_lock(parts_dir / ".lock", wait=False))
        except BlockingIOError:
            raise InputError(
                f"checkpoint {parts_dir} is in use by another attnrank batch run; "
                "wait for it to finish or give another --checkpoint"
            ) from None
        yield
