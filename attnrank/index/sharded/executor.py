"""Where the sharded build's tasks run: in this process, or as Ray tasks (extra ``ray``).

Both executors offer ``map(fn, argument_tuples, num_cpus=…)`` (results in input order) and
``tree_reduce(fn, items)`` (pairwise, so an associative merge runs in log₂(n) rounds on a
cluster). The functions they run are plain module-level functions, usable without Ray.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import AttnrankError, require

logger = logging.getLogger(__name__)


class LocalExecutor:
    """Run every task in this process, one after another."""

    name = "local"

    def map(self, fn: Callable, args: Sequence[tuple], *, num_cpus: float = 1, num_gpus: float = 0) -> list[Any]:
        return [fn(*a) for a in args]

    def tree_reduce(self, fn: Callable, items: list[Any]) -> Any:
        while len(items) > 1:
            items = [fn(items[i], items[i + 1]) if i + 1 < len(items) else items[i] for i in range(0, len(items), 2)]
        return items[0]

    def put(self, value: Any) -> Any:
        return value

    def close(self) -> None:
        pass


def task_cause(error: BaseException) -> BaseException:
    """What a Ray task raised, where it is one of attnrank's errors or an OSError (else ``error``):
    Ray wraps it in a RayTaskError, which the CLI printed as a coloured remote traceback of several
    lines instead of its one-line message."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, (AttnrankError, OSError)) else error


LOOPBACK = "127.0.0.1"


def start_local_ray(ray: Any, **init_kwargs: Any) -> None:
    """Start a new Ray in this process (``ray.init(address="local", **init_kwargs)``) whose servers
    listen on the loopback address alone.

    Why: a local Ray binds its GCS, raylet and workers to the machine's network address, reachable
    from other hosts, and resolves a ``_node_ip_address`` of 127.0.0.1 back to that address. It
    keeps to the loopback only where it believes it runs on a one-machine platform (its
    ``ENABLE_RAY_CLUSTER``, read at the call: set off for the start alone). A Ray that still comes
    up on another address is logged. ``"local"``, not None: None attaches to the cluster that
    RAY_ADDRESS or ``ray start`` names."""
    constants: Any = getattr(getattr(ray, "_private", None), "ray_constants", None)
    before = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if before is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(address="local", _node_ip_address=LOOPBACK, **init_kwargs)
    finally:
        if before is not None:
            constants.ENABLE_RAY_CLUSTER = before
    address = ray.get_runtime_context().gcs_address
    if not address.startswith(LOOPBACK + ":"):
        logger.warning("the local Ray listens on %s, not on the loopback address alone", address)


class RayExecutor:
    """Run tasks as Ray remote functions, on a running cluster (``address``) or a local one.

    ``address=None`` (or ``"local"``) starts a local Ray with ``num_cpus`` and an object store of
    ``object_store_mb`` (shut down by :meth:`close`); ``"auto"`` or ``"ray://host:10001"``
    connects to an existing cluster (left running). ``quiet`` keeps Ray's INFO logs off.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        object_store_mb: int | None = None,
        quiet: bool = False,
    ):
        self.ray = require("ray", "ray", "distributed indexing and batch reranking")
        t0 = time.perf_counter()
        address = None if address == "local" else address  # (ray.init's own name for a new local Ray)
        self.owned = False
        if not self.ray.is_initialized():
            kw: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "logging_level": logging.WARNING if quiet else logging.INFO,
            }
            if address is None:
                kw.update(
                    num_cpus=num_cpus, object_store_memory=None if object_store_mb is None else object_store_mb << 20
                )
            if address is None:
                start_local_ray(self.ray, **kw)
            else:
                self.ray.init(address=address, **kw)
            self.owned = True
        elif address is not None or num_cpus is not None or object_store_mb is not None:
            # (they were ignored without a word: a run meant for a cluster ran on this process's Ray)
            logger.warning(
                "Ray is already running in this process: address=%s, num_cpus=%s and object_store_mb=%s are not "
                "applied; the running Ray is used (ray.shutdown() first to start another)",
                address,
                num_cpus,
                object_store_mb,
            )
        self.startup_seconds = time.perf_counter() - t0
        logger.info("ray ready in %.1fs (%s)", self.startup_seconds, self.ray.cluster_resources())

    def map(self, fn: Callable, args: Sequence[tuple], *, num_cpus: float = 1, num_gpus: float = 0) -> list[Any]:
        remote = self.ray.remote(fn).options(num_cpus=num_cpus, num_gpus=num_gpus)
        refs: list[Any] = []
        try:  # (submitted inside: a submission that fails, e.g. an argument Ray cannot pickle, stops the earlier ones)
            for a in args:
                refs.append(remote.remote(*a))
            return self.ray.get(refs)
        except BaseException as e:
            self._stop(refs)
            cause = task_cause(e)
            if cause is not e:
                raise cause from None
            raise

    def _stop(self, refs: list[Any]) -> None:
        """Cancel ``refs`` until every one has ended, before the caller cleans up: a shard task still
        running wrote its shard into the temporary folder the failed build had just removed (and made
        it again). Cancelled again until each has ended: a task dispatched as the first cancel went
        out (to the CPU the failed one freed) was not stopped by it, and ran to its end. No deadline:
        returning with one still running would let it write after the cleanup (a warning every 30 s
        says what is awaited)."""
        pending, warn_at = list(refs), time.monotonic() + 30
        while pending:
            # (only those not ended: Ray 2.60's driver aborted, "Check failed: it !=
            # submissible_tasks_.end()", on a force-cancel of the task whose failure it had just
            # raised; twice it killed the test suite silently in CI)
            _, pending = self.ray.wait(pending, num_returns=len(pending), timeout=0)
            if not pending:
                break
            for ref in pending:
                self.ray.cancel(ref, force=True)
            _, pending = self.ray.wait(pending, num_returns=len(pending), timeout=0.5)
            if pending and time.monotonic() > warn_at:
                logger.warning("waiting for %d cancelled Ray task(s) to end before cleaning up", len(pending))
                warn_at = time.monotonic() + 30

    def tree_reduce(self, fn: Callable, items: list[Any]) -> Any:
        remote = self.ray.remote(fn).options(num_cpus=1)
        refs = [self.ray.put(x) for x in items]
        while len(refs) > 1:
            refs = [
                remote.remote(refs[i], refs[i + 1]) if i + 1 < len(refs) else refs[i] for i in range(0, len(refs), 2)
            ]
        return self.ray.get(refs[0])

    def put(self, value: Any) -> Any:
        return self.ray.put(value)

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()
            self.owned = False
