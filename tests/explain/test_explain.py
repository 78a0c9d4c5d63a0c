"""Explanations: per-token evidence of the attention reranker -> HTML heat map, PNG, CLI, and a
headless-Chromium screenshot of the page (skipped where Chromium is not installed)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from _tiny import RERANK_QUERY, rerank_docs, save_tiny, tiny_llm
from typer.testing import CliRunner

from attnrank.cli import app
from attnrank.errors import InputError
from attnrank.explain import explain_results
from attnrank.explain.render import to_html, write_html
from attnrank.files import png_software
from attnrank.rerank.attention import AttentionReranker
from attnrank.types import Document


@pytest.fixture(scope="module")
def reranker():
    return AttentionReranker(tiny_llm(layers=2), config="fused")


@pytest.fixture(scope="module")
def explained(reranker):
    res = reranker.rank(RERANK_QUERY, rerank_docs(), return_evidence=True)
    return res, explain_results(reranker, res)


def test_top_tokens_are_a_positive_number_of_them(explained):
    _, ex = explained
    assert len(ex[0].top_tokens(2)) == 2
    for n in (0, -1):  # (-1 returned every counted token but the last)
        with pytest.raises(InputError, match=f"n={n} tokens"):
            ex[0].top_tokens(n)


def test_token_scores_add_up_to_the_passage_score(explained):
    res, ex = explained
    assert [e.id for e in ex] == res.ids and [e.rank for e in ex] == [1, 2, 3, 4]
    # the default preset fuses attention with first-stage signals: the tokens explain the attention part
    assert res.stage == "fused"
    for r, e in zip(res, ex):
        assert e.score == r.stage_scores["attention"] != r.score
        assert e.token_sum == pytest.approx(e.score, abs=5e-7 * len(e.tokens) + 1e-12)
        # the tokens spell the passage's prompt block ("[k] title\ntext") and end with its text
        assert "".join(t.text for t in e.tokens).endswith(r.text)
    # the μ − 2σ filter leaves out some tokens somewhere, and those do not count
    assert any(e.filtered for e in ex)
    e = next(e for e in ex if e.filtered)
    all_sum = sum(t.score for t in e.tokens)
    assert all_sum != pytest.approx(e.score, abs=1e-9)


def test_tokens_spell_non_ascii_passages(reranker):
    """Characters of several bytes span several tokens; before, each showed as U+FFFD and the
    character itself was lost from the page."""
    docs = [Document("fr", "Café crème à Paris, naïve façade.", "Café"), Document("zh", "北京是中国的首都。", "北京")]
    res = reranker.rank("首都 café?", docs, return_evidence=True)
    for r, e in zip(res, explain_results(reranker, res)):
        spelled = "".join(t.text for t in e.tokens)
        assert "\ufffd" not in spelled and spelled.endswith(r.text) and r.title in spelled


def test_needs_evidence_and_plain_scorer(reranker):
    res = reranker.rank(RERANK_QUERY, rerank_docs())  # no evidence
    with pytest.raises(InputError, match="return_evidence=True"):
        explain_results(reranker, res)
    raw = AttentionReranker(reranker.llm, config="icr", calibrate=False)  # the page said "calibrated" over it
    with pytest.raises(InputError, match="explanations need calibrate=True"):
        explain_results(raw, raw.rank(RERANK_QUERY, rerank_docs(), return_evidence=True))


def test_html_is_self_contained(explained):
    import dataclasses

    ex = explained[1]
    page = to_html("capital <of> France?", ex, model="tiny")
    assert "<script" not in page and "http" not in page and "src=" not in page
    # markup in a passage id and its token texts is escaped too (only the query's was tested)
    hostile = [dataclasses.replace(e, id="<script>x</script>'\"&", tokens=list(e.tokens)) for e in ex[:1]]
    hostile[0].tokens[0] = dataclasses.replace(hostile[0].tokens[0], text="<script>alert(1)</script>")
    escaped = to_html("q", hostile, model="tiny")
    assert "<script" not in escaped and "&lt;script&gt;alert(1)&lt;/script&gt;" in escaped
    assert "capital &lt;of&gt; France?" in page
    for e in ex:
        assert f"{e.rank}. {e.id}" in page and f"{e.score:+.6f}" in page
    assert page.count("class='x' style=") == sum(e.filtered for e in ex)


def test_png(explained, tmp_path):
    pytest.importorskip("matplotlib", reason="needs the 'plot' extra")
    from attnrank.explain.render import write_png

    path = write_png(tmp_path / "e.png", "what does $\\frac{a}$ cost, $5 or $10?", explained[1])  # "$" is text
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png_software(path) == "attnrank explain"  # so a later run knows it may replace it
    assert [p.name for p in tmp_path.iterdir()] == ["e.png"]  # written via a temporary name, none left


def test_drawing_the_png_leaves_the_callers_matplotlib_backend(explained, tmp_path):
    """matplotlib.use("Agg") switched a notebook's inline backend: plt.show() then showed nothing."""
    matplotlib = pytest.importorskip("matplotlib", reason="needs the 'plot' extra")
    from attnrank.explain.render import write_png

    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        write_png(tmp_path / "e.png", RERANK_QUERY, explained[1])
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)


def test_a_page_that_appeared_while_explaining_is_not_replaced(explained, tmp_path):
    """The folder was checked before the index and the model loaded; the page and image were then
    replaced whatever was there by the time they were written."""
    from attnrank.cli.outputs import is_explain_page
    from attnrank.explain.render import write_html
    from attnrank.files import replace_guard

    page = tmp_path / "explain.html"
    page.write_text("my own notes\n")
    with pytest.raises(InputError, match="is not an explain page attnrank wrote.*kept at"):
        write_html(page, "q", explained[1], guard=replace_guard(is_explain_page, "an explain page", "--output"))
    assert page.read_text() == "my own notes\n"
    (kept,) = tmp_path.glob("explain.html.attnrank-new-*")
    assert is_explain_page(kept)  # the page written is kept beside the user's file
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    from attnrank.cli.outputs import is_explain_png
    from attnrank.explain.render import write_png

    image = tmp_path / "explain.png"
    image.write_bytes(b"not a png")
    with pytest.raises(InputError, match="is not an explain image attnrank wrote"):
        write_png(image, "q", explained[1], guard=replace_guard(is_explain_png, "an explain image", "--output"))
    assert image.read_bytes() == b"not a png"


def test_cli_explain(tmp_path, built_retriever, caplog):
    pytest.importorskip("matplotlib", reason="needs the 'plot' extra")
    model = save_tiny(tmp_path / "tiny", layers=2, max_positions=16384)
    index = built_retriever.save(tmp_path / "index")
    out = tmp_path / "out"
    r = CliRunner().invoke(
        app,
        [
            "explain",
            "vitamin D and fractures",
            "--index-dir",
            str(index),
            "--top-k",
            "3",
            "--model",
            str(model),
            "--output",
            str(out),
            "--dtype",
            "float32",
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    assert r.output.count(" = sum of ") == 3 and (out / "explain.png").exists()
    # the token sum is named as attention's: the ranks come from the fused score, which the page says
    assert r.output.count("attention ") >= 3 and "ranked by the reranker's score" in (out / "explain.html").read_text()
    assert "vitamin D and fractures" in (out / "explain.html").read_text()
    again = ["explain", "vitamin D", "--index-dir", str(index), "-k", "2", "--model", str(model), "--output", str(out)]
    with caplog.at_level("WARNING", logger="attnrank"):  # the image beside the new page is the last run's
        r = CliRunner().invoke(app, [*again, "--dtype", "float32", "--no-png", "-q"])
    assert r.exit_code == 0 and "explain.png is an earlier run's image, not this page's" in caplog.text
    (out / "explain.png").write_bytes(b"my own plot")  # a user's file of that name: not called attnrank's
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank"):
        r = CliRunner().invoke(app, [*again, "--dtype", "float32", "--no-png", "-q"])
    assert r.exit_code == 0 and "earlier run's image" not in caplog.text
    assert (out / "explain.png").read_bytes() == b"my own plot"
    r = CliRunner().invoke(app, ["explain", "q", "--index-dir", str(index), "-k", "0"])
    assert r.exit_code != 0 and "-k 0 must be at least 1" in r.output
    r = CliRunner().invoke(app, ["explain", "q", "--index-dir", str(index), "--dtype", "float64", "--no-png"])
    assert r.exit_code == 2 and "float64" in r.output  # explain had no --device/--dtype: it always ran on CPU


def test_cli_explain_without_a_hit_writes_nothing(tmp_path, scifact_docs):
    """A keyword-only index and no query word in it: an empty page, exit 0 (with the image, refused
    after the page had replaced the last one)."""
    from attnrank.index.retriever import HybridRetriever

    index = HybridRetriever(mode="bm25").index(scifact_docs, show_progress=False).save(tmp_path / "index")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["explain", "zzzqqq", "--index-dir", str(index), "--output", str(out), "--no-png"])
    assert r.exit_code == 1 and "no passage was retrieved for 'zzzqqq'" in str(r.exception)
    assert not (out / "explain.html").exists()


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium (Debian: apt-get install -y chromium)")
def test_screenshot_in_headless_chromium(explained, tmp_path):
    page = write_html(tmp_path / "explain.html", RERANK_QUERY, explained[1], model="tiny")
    shot = tmp_path / "shot.png"
    cmd = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--screenshot={shot}",
        "--window-size=1000,700",
        page.as_uri(),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000  # a rendered page, not an empty image


def test_png_of_no_explanations_is_one_line(tmp_path):
    pytest.importorskip("matplotlib", reason="needs the 'plot' extra")
    from attnrank.errors import InputError
    from attnrank.explain.render import write_png

    with pytest.raises(InputError, match="no explanations to draw"):
        write_png(tmp_path / "e.png", RERANK_QUERY, [])
    assert not list(tmp_path.iterdir())


def test_a_users_own_matplotlib_image_beside_an_explain_page_is_not_replaced(tmp_path, explained):
    """Any matplotlib PNG named explain.png beside attnrank's page passed for explain's image."""
    plt = pytest.importorskip("matplotlib.pyplot", reason="needs the 'plot' extra")
    from attnrank.cli.outputs import is_explain_png
    from attnrank.explain.render import write_png

    write_html(tmp_path / "explain.html", RERANK_QUERY, explained[1], model="tiny")
    fig = plt.figure()
    fig.savefig(tmp_path / "explain.png")  # the user's plot (matplotlib's own Software text)
    plt.close(fig)
    assert not is_explain_png(tmp_path / "explain.png")
    # and attnrank's own image is told as one (else a second explain into the folder refused it)
    assert is_explain_png(write_png(tmp_path / "ours.png", RERANK_QUERY, explained[1]))


def test_the_legend_says_fusion_only_where_the_ranking_fused(explained):
    """The page said the ranking fused attention with the first-stage signals whatever ranked it
    (an API caller who did not say how it was ranked, too: it is "may" then)."""
    ex = explained[1]
    assert "fuses it with the first-stage signals" in to_html("q", ex, model="tiny", fused=True)
    alone = to_html("q", ex, model="tiny", fused=False)
    assert "fuse" not in alone and "the passages are ranked by it." in alone
    unknown = to_html("q", ex, model="tiny")
    assert "fuses it" not in unknown and "whose score may fuse it with the first-stage signals" in unknown


def test_the_page_says_where_the_gate_set_attention_aside(explained):
    """Gated fused weights rank a query whose attention is not confident by the first-stage signals
    alone; the page still said the ranking fused attention with them."""
    ex = explained[1]
    page = to_html("q", ex, model="tiny", fused=True, set_aside=True)
    assert "attention was set aside for this query" in page and "fuses it" not in page
    unknown = to_html("q", ex, model="tiny", set_aside=True)  # (fused not given: the gate still speaks)
    assert "attention was set aside for this query" in unknown
