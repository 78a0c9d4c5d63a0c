"""The reliability suite's harness: run the real CLI in a subprocess, snapshot what is stored,
classify and record each case's outcome (rendered into docs/reliability.md).

One case = a command (or a Python snippet run in its own process), the exit code and stderr
fragment expected, and the paths whose files must be unchanged afterwards. The outcome is put
in one of five classes:

- ``clear error``: a non-zero exit with a one-line ``error: ...`` (exit 1) or a usage error
  (exit 2), no traceback; the expected text is in it.
- ``correct result``: exit 0 and the output checks passed.
- ``traceback``: a Python traceback reached the user.
- ``silent wrong result``: exit 0 where an error was due, or output that fails its check.
- ``data lost``: a file under a kept path changed or disappeared.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS: list[dict] = []
_BOX = re.compile(r"[│╭╮╰╯─┃━]")


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("ATTNRANK_FAULT")}
    e.update(
        PYTHONPATH=str(REPO),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        COLUMNS="200",
        TOKENIZERS_PARALLELISM="false",
        ATTNRANK_THREADS="1",
    )
    e.update(extra)
    return e


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def err(self) -> str:
        """stderr with the usage box drawn around option errors removed, whitespace collapsed."""
        return " ".join(_BOX.sub(" ", self.stderr).split())


def cli(*args: str, cwd: Path, extra_env: dict[str, str] | None = None, timeout: float = 120) -> Run:
    """``python -m attnrank.cli ARGS`` in ``cwd`` (PYTHONPATH = this checkout)."""
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "attnrank.cli", *args],
        cwd=cwd,
        env=env(**(extra_env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Run(p.returncode, p.stdout, p.stderr, time.perf_counter() - t0)


def py(code: str, *, cwd: Path, extra_env: dict[str, str] | None = None, timeout: float = 120) -> Run:
    """A Python snippet in its own process (for the library API and for writers/readers)."""
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env(**(extra_env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Run(p.returncode, p.stdout, p.stderr, time.perf_counter() - t0)


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file (SHA-256), folder and link under ``roots`` (symbolic links are not followed)."""
    out: dict[str, str] = {}
    for root in roots:
        if root.is_symlink() or root.is_file():
            out[str(root)] = _entry(root)
            continue
        if not root.exists():
            out[str(root)] = "absent"
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                out[str(p)] = _entry(p)
    return out


def _entry(p: Path) -> str:
    if p.is_symlink():
        return "link->" + os.readlink(p)
    if p.is_dir():
        return "dir"
    return hashlib.sha256(p.read_bytes()).hexdigest()


@dataclass
class Outcome:
    id: str
    group: str
    given: str
    sees: str
    exit: int
    kept: str
    category: str
    expected: str
    passed: bool
    seconds: float
    problems: list[str] = field(default_factory=list)


def first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:260] if lines else ""


def judge(
    case_id: str,
    group: str,
    given: str,
    run: Run,
    *,
    exit: int,
    err: str | Iterable[str] = (),
    before: dict[str, str] | None = None,
    after: dict[str, str] | None = None,
    kept: str = "",
    check: Callable[[Run], str | None] | None = None,
    sees: str | None = None,
) -> Outcome:
    """Classify one case's outcome, record it, and return it (the test asserts ``passed``)."""
    frags = [err] if isinstance(err, str) else list(err)
    problems = []
    lost = [k for k in (before or {}) if (after or {}).get(k) != before[k]] if before is not None else []
    if lost:
        problems.append(f"changed or lost: {lost[:3]}")
    tb = "Traceback (most recent call last)" in run.stderr
    if run.rc != exit:
        problems.append(f"exit {run.rc}, expected {exit}")
    missing = [f for f in frags if f not in run.err]
    if missing:
        problems.append(f"stderr lacks {missing}: {run.err[:300]!r}")
    bad_output = check(run) if check is not None else None
    if bad_output:
        problems.append(bad_output)
    if exit != 0 and run.rc != 0 and not tb:
        lines = [ln for ln in run.stderr.strip().splitlines() if ln.strip()]
        if run.rc == 1 and (len(lines) != 1 or not lines[0].startswith("error: ")):
            problems.append(f"not one 'error:' line: {run.stderr[:300]!r}")
    if lost:
        category = "data lost"
    elif tb:
        category = "traceback"
    elif run.rc == 0 and (exit != 0 or bad_output):
        category = "silent wrong result"
    elif run.rc == 0:
        category = "correct result"
    else:
        category = "clear error"
    shown = sees if sees is not None else (first_line(run.stderr) if run.rc else first_line(run.stdout))
    expected_cat = "correct result" if exit == 0 else "clear error"
    out = Outcome(
        case_id,
        group,
        given,
        _BOX.sub("", shown).strip(),
        run.rc,
        kept or "-",
        category,
        expected_cat,
        not problems and category == expected_cat,
        round(run.seconds, 2),
        problems,
    )
    RESULTS.append(asdict(out))
    return out


def write_results(path: Path, seconds: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    import resource

    cpu = sum(
        getattr(resource.getrusage(who), f)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for f in ("ru_utime", "ru_stime")
    )
    path.write_text(
        json.dumps(
            {
                "seconds": round(seconds, 1),
                "cpu_seconds": round(cpu, 1),
                "cpus": len(os.sched_getaffinity(0)),
                "load_average": round(os.getloadavg()[0], 1),
                "python": sys.version.split()[0],
                "cases": RESULTS,
            },
            indent=1,
            ensure_ascii=False,
        ),
        encoding="utf-8",
    )
