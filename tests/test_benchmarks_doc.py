"""docs/benchmarks.md is assembled from the committed records (scripts/make_benchmarks_doc.py) and
its "At a glance" section is computed from their JSON (scripts/benchmarks_glance.py)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import benchmarks_glance
import make_benchmarks_doc


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A copy of docs/results (markdown and JSON only) a test may change."""
    out = tmp_path / "results"
    out.mkdir()
    for f in (REPO / "docs" / "results").iterdir():
        if f.suffix in (".md", ".json"):
            shutil.copy(f, out / f.name)
    return out


def _row(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def test_committed_page_is_what_the_records_assemble_to():
    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert page == make_benchmarks_doc.assemble(), "run python scripts/make_benchmarks_doc.py and commit the page"


def test_every_record_is_listed_and_an_unlisted_one_is_refused(results: Path):
    page = make_benchmarks_doc.assemble(results)
    assert "## Dense index build by embed backend" in page  # once left out of ORDER, and of the page
    (results / "new_bench.md").write_text("# New\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="new_bench"):
        make_benchmarks_doc.assemble(results)


def test_glance_reads_the_figures_from_the_json(results: Path):
    text = benchmarks_glance.glance(results)
    assert "**missed** on DL19 (met on 3 of 4)" in _row(text, "| #14 | default ≥ best first stage")
    assert "| DL19 | 43 | first stage's dense 0.5932 | 0.5790 | **0.5812** | -1.20 | 18/21 |" in text

    record = results / f"{benchmarks_glance.LIKELIHOOD}.json"
    payload = json.loads(record.read_text(encoding="utf-8"))
    for row in payload["rows"]:
        if row["dataset"] == "DL19" and row["method"] == benchmarks_glance.DEFAULT:
            row["nDCG@10"], row["Δ"] = 0.6032, 1.0
    record.write_text(json.dumps(payload), encoding="utf-8")
    text = benchmarks_glance.glance(results)
    assert _row(text, "| #14 | default ≥ best first stage").endswith("| met |")
    assert "| DL19 | 43 | first stage's dense 0.5932 | 0.5790 | **0.6032** | +1.00 |" in text


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "scripts").glob("bench_*.py")))
def test_every_benchmark_script_loads_against_the_package(script):
    """A script is thin over the package: its imports must resolve against the package as it is
    (bench_sharded imported a module removed days before, and its documented command failed at once)."""
    import runpy

    runpy.run_path(str(REPO / "scripts" / script), run_name="loaded by a test")  # module level only


def _package_imports(tree):
    """``(line, module, names)`` of every ``import attnrank...`` / ``from attnrank... import ...``
    anywhere in ``tree`` (in functions too), but for those under ``if TYPE_CHECKING:``; ``names``
    is empty for a plain ``import``."""
    import ast

    def type_checking(test) -> bool:
        return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )

    def walk(node):
        if isinstance(node, ast.If) and type_checking(node.test):
            children = node.orelse  # (its body never runs)
        else:
            children = list(ast.iter_child_nodes(node))
        for child in children:
            if isinstance(child, ast.Import):
                yield from ((child.lineno, a.name, ()) for a in child.names if a.name.split(".")[0] == "attnrank")
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module.split(".")[0] == "attnrank":
                yield child.lineno, child.module, tuple(a.name for a in child.names if a.name != "*")
            yield from walk(child)

    return list(walk(tree))


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "scripts").glob("*.py")))
def test_every_package_import_of_a_script_resolves_in_functions_too(script):
    """runpy above runs module-level code only; most scripts import attnrank inside their
    functions (bench_rerank, bench_ask, bench_locomo, bench_prune, bench_sharded...), where a
    renamed or removed module or name failed only once the benchmark ran. Each must resolve."""
    import ast
    import importlib
    import importlib.util

    tree = ast.parse((REPO / "scripts" / script).read_text(encoding="utf-8"), filename=script)
    missing = []
    for line, module, names in _package_imports(tree):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{script}:{line}: {module} ({e})")
            continue
        for name in names:  # an attribute, or a submodule `from attnrank.x import y` imports
            package = hasattr(mod, "__path__")  # (find_spec of a name under a plain module raises)
            if not hasattr(mod, name) and not (package and importlib.util.find_spec(f"{module}.{name}")):
                missing.append(f"{script}:{line}: {module} has no {name}")
    assert not missing, missing


def test_the_import_walk_sees_function_bodies_and_skips_type_checking():
    import ast

    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import attnrank.eval as ev\n"
        "if TYPE_CHECKING:\n"
        "    from attnrank.gone import Nothing\n"
        "else:\n"
        "    from attnrank.types import Document\n"
        "def main():\n"
        "    if True:\n"
        "        from attnrank.rerank.attention import AttentionReranker, Missing\n"
        "from os import path\n"
    )
    assert _package_imports(tree) == [
        (2, "attnrank.eval", ()),
        (6, "attnrank.types", ("Document",)),
        (9, "attnrank.rerank.attention", ("AttentionReranker", "Missing")),
    ]


def test_a_listed_record_not_run_yet_names_its_command(results: Path):
    """ORDER listed confirm without a command: a page assembled without its record raised KeyError."""
    assert set(make_benchmarks_doc.ORDER) <= set(make_benchmarks_doc.COMMANDS)
    (results / "confirm.md").unlink()
    page = make_benchmarks_doc.assemble(results)
    assert (
        "## confirm\n\nNot run yet (`python scripts/bench_confirm.py --offset 400 --locomo-questions 400 "
        "--scifact-queries 200`)." in page
    )


def test_the_page_generator_reads_its_arguments_before_writing(tmp_path: Path, monkeypatch, capsys):
    """main() ignored argv: --help or a typo regenerated docs/benchmarks.md."""
    page = tmp_path / "benchmarks.md"
    monkeypatch.setattr(make_benchmarks_doc, "PAGE", page)
    for argv, code in ((["--help"], 0), (["--chek"], 2)):
        with pytest.raises(SystemExit) as e:
            make_benchmarks_doc.main(argv)
        assert e.value.code == code and not page.exists()
    with pytest.raises(SystemExit, match="is not what docs/results assembles to"):
        make_benchmarks_doc.main(["--check"])
    assert not page.exists()
    make_benchmarks_doc.main([])
    assert page.read_text(encoding="utf-8") == make_benchmarks_doc.assemble()
    make_benchmarks_doc.main(["--check"])
    assert capsys.readouterr().out.endswith("is up to date\n")


class _Parsed(Exception):
    """Raised in place of running a benchmark once its arguments are parsed."""


def _parse(monkeypatch, script: str, argv: list[str]):
    """Run ``script``'s main() up to its parse_args() with ``argv``: its namespace, or the parser's SystemExit."""
    import argparse
    import runpy

    parse = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise _Parsed(parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    monkeypatch.setattr(sys, "argv", [script, *argv])
    with pytest.raises(_Parsed) as e:
        runpy.run_path(str(REPO / "scripts" / script), run_name="__main__")
    return e.value.args[0]


COUNTS = [
    ("bench_locomo.py", ["--questions", "0"], "argument --questions: '0' is not a whole number >= 1; give 1 or more"),
    ("bench_locomo.py", ["--skip", "-5"], "argument --skip: '-5' is not a whole number >= 0; give 0 or more"),
    ("bench_locomo.py", ["--k", "-1"], "argument --k: '-1'"),
    ("bench_locomo.py", ["--top", "0"], "argument --top: '0'"),
    ("bench_ask.py", ["--skip", "-5"], "argument --skip: '-5' is not a whole number >= 0"),
    ("bench_ask.py", ["--questions", "-1"], "argument --questions: '-1'"),
    ("bench_prune.py", ["--questions", "-3"], "argument --questions: '-3'"),
    ("bench_likelihood_tokens.py", ["--first", "0"], "argument --first: '0'"),
    ("bench_rerank.py", ["--dl19-queries", "-1"], "argument --dl19-queries: '-1'"),
    ("bench_rerank.py", ["--dl19-depths", "20,-5"], "argument --dl19-depths: '-5' is not a whole number >= 1"),
    ("bench_likelihood_states.py", ["--dl19-depths", "0"], "argument --dl19-depths: '0'"),
    ("bench_likelihood_states.py", ["--dl19-queries", "-2"], "argument --dl19-queries: '-2'"),
    ("bench_reweight.py", ["--max-queries", "-1"], "argument --max-queries: '-1'"),
    ("bench_fusion.py", ["--hotpot-questions", "-1"], "argument --hotpot-questions: '-1'"),
    ("bench_heads.py", ["--hotpot-questions", "0"], "argument --hotpot-questions: '0'"),
    ("bench_likelihood.py", ["--locomo-questions", "-400"], "argument --locomo-questions: '-400'"),
    ("bench_serve.py", ["--levels", "1,0"], "argument --levels: '0'"),
]


@pytest.mark.parametrize(("script", "argv", "message"), COUNTS)
def test_a_benchmark_refuses_a_count_it_would_slice_wrongly(monkeypatch, capsys, script, argv, message):
    """A negative count sliced from the end (--skip -5: only the last 5 questions) and 0 kept
    nothing or everything, under a table that named the count asked for."""
    with pytest.raises(SystemExit) as e:
        _parse(monkeypatch, script, argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("script", "option", "default"),
    [("bench_rerank.py", "dl19_depths", [20, 50]), ("bench_likelihood_states.py", "dl19_depths", [20, 100])]
    + [("bench_serve.py", "levels", [1, 4, 16])],
)
def test_a_list_of_counts_is_checked_as_parsed_its_default_too(monkeypatch, script, option, default):
    """The depths were split and int()-ed after parsing, unchecked ("20,-5" cut the last 5)."""
    assert getattr(_parse(monkeypatch, script, []), option) == default  # argparse types a string default


def test_bench_ask_refuses_to_evaluate_the_probe_on_its_training_questions():
    """--prune-method probe with --skip 0 scored the registered probe on the 83 labelled questions
    it was trained on (its record's trained_on), the order bench_ask evaluates first."""
    import bench_ask

    trained = "83 HotpotQA distractor dev questions with sentence-level supporting facts"
    assert "--prune-method probe with --skip 0: the registered probe was trained on the first 83" in (
        bench_ask.probe_overlap(trained, 0) or ""
    )
    assert "give --skip 83 or more" in (bench_ask.probe_overlap(trained, 82) or "")
    assert bench_ask.probe_overlap(trained, 83) is None
    assert "does not say how many" in (bench_ask.probe_overlap("HotpotQA dev questions", 400) or "")
    assert bench_ask.probe_overlap("200 SciFact queries", 0) is None  # nothing evaluated here was seen


def test_bench_locomo_reports_the_candidates_recall_at_the_k_it_ran():
    """The report said "evidence R@{k}" for --k but always computed R@20 (1.0 here at k = 5)."""
    from types import SimpleNamespace

    import bench_locomo

    cands = [f"c{i}" for i in range(10)]
    arm = {
        "f1": 0.5,
        "em": 0.0,
        "contains": 1.0,
        "evidence_in_context": 0.0,
        "context_tokens": 10,
        "timings": {"retrieve": 0.1, "generate": 1.0, "total": 1.1},
    }
    results = [
        {
            "id": "q",
            "category": 1,
            "evidence": ["c7"],  # outside the top 5, inside the top 20
            "rankings": {"first-stage": cands},
            "arms": {"none": dict(arm), "first-stage": dict(arm)},
        }
    ]
    args = SimpleNamespace(k=5, skip=400, top=3, max_new_tokens=32, keep_ratio=0.5, wall=1.0)
    s = bench_locomo.summarise(results, args)
    assert s["R@5 of candidates"] == 0.0 and "R@20 of candidates" not in s
    md = bench_locomo.markdown(s, results, args, {"threads": 2, "cpus": 2}, "m", [])
    assert "evidence R@5 of the candidates = 0.000" in md


def test_bench_rerank_and_likelihood_cut_print_the_dtype_they_loaded():
    """The reports said float32 (bench_rerank) and bfloat16 (bench_likelihood_cut) whatever
    dtype="auto" loaded on the machine."""
    import bench_likelihood_cut
    import bench_rerank

    env = {"date": "2026-01-01", "cpus": 2, "torch": "2", "cpu": "c"}
    md = bench_rerank.markdown([], [], {"llm_dtype": "bfloat16"}, env, None)
    assert "de-quantized, bfloat16) for every LLM method" in md and "float32" not in md
    cost = [{"dataset": "DL19", "x faster": 1.0}]
    p = {"words": 150, "date": "2026-01-01", "env": env, "dtype": "float32", "cost": cost, "rows": []}
    assert "SmolLM2-135M-Instruct (float32)." in bench_likelihood_cut.markdown(p, "cmd")


def test_bench_serve_reports_each_levels_answers_and_its_environment():
    """The report said "over the 200 answers" whatever was answered, and recorded no date or CPU."""
    import bench_serve

    level = {"requests_sent": 16, "rejected_503": 0, "errors": 0, "throughput_rps": 1.0, "stopped_by_time_cap": False}
    level |= {"p50": 1.0, "p95": 2.0, "p99": 3.0}
    result = {
        "command": "python scripts/bench_serve.py",
        "environment": {"date": "2026-01-02", "cpu": "Some CPU (amx_bf16)", "cpus": 2, "python": "3", "torch": "2"},
        "settings": {
            "model": "m",
            "cpus": 2,
            "machine": "x86_64",
            "docs": 4,
            "doc_chars": 150,
            "max_queued": 16,
            "requests": 16,
            "max_seconds": 120,
            "cores": 2,
            "loadavg_1m_before_after": [0.1, 0.2],
        },
        "baseline": {},
        "levels": [{**level, "clients": 1, "ok": 16}, {**level, "clients": 4, "ok": 9}],
    }
    md = bench_serve.markdown(result)
    assert "Run 2026-01-02 on Some CPU (amx_bf16)" in md and "200 answers" not in md
    assert "(status 200: 16 at 1 client(s), 9 at 4 client(s))" in md


def test_no_script_retypes_its_command_line():
    """Records printed a command built by hand, which dropped options (--dtype, set sizes, the
    adapter's --rank and --alpha): the page showed a command that did not make the table. Every
    script writes the command its process ran (attnrank.eval.report.command_line)."""
    import re

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    retyped = [
        f"{p.name}:{i}"
        for p in sorted(scripts.glob("bench_*.py"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(rf"""["'`](flock |(python )?scripts/{re.escape(p.name)})""", line)  # (its own command)
    ]
    assert not retyped, retyped


def test_seconds_read_from_an_earlier_runs_cache_are_said_to_be_that_runs():
    """bench_locomo and bench_ask serve cached per-question results, seconds included: a table of
    seconds must say which were timed in this run and which in another (on another machine)."""
    from collections import Counter

    import _common

    now = "2026-12-07, Intel Xeon"
    assert _common.timing_sources(Counter({now: 4}), now) == "Seconds: 4 of 4 model results were timed in this run."
    line = _common.timing_sources(Counter({now: 1, "2026-12-03, AMD EPYC": 3, "": 2}), now, "questions")
    assert line.startswith("Seconds: 1 of 6 questions were timed in this run")
    assert "3 timed on 2026-12-03, AMD EPYC" in line and "2 timed in a run that recorded no date or CPU" in line
