"""The documentation's links resolve: every relative link in README.md and docs/*.md names a file that exists and,
with a #anchor, a heading of the target page (GitHub's slugs); every benchmarks/*.json a page cites exists; the
README stays a short product page."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 320

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the text may hold one level of brackets or inline code.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
JSON_CITED = re.compile(r"benchmarks/[A-Za-z0-9_.{},/-]+?\.json")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lowercase, punctuation other than '-' and '_' removed,
    each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors GitHub gives the headings of a markdown page (a repeated slug gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in _prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(found)


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every markdown link outside code."""
    found = []
    for number, line in _prose_lines(page.read_text(encoding="utf-8")):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            found.append((number, match.group(1).strip("<>")))
    return found


def problem(page: Path, target: str) -> str | None:
    """Why a link target does not resolve, or None."""
    if SCHEME.match(target) or target.startswith("//"):
        return None  # an absolute URL: not checked here
    path, _, anchor = target.partition("#")
    dest = page if not path else (page.parent / path).resolve()
    if path and not dest.exists():
        return f"no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}"
    if anchor:
        if dest.suffix.lower() != ".md" or dest.is_dir():
            return f"#{anchor} on a file that is not a markdown page"
        if anchor not in anchors(dest):
            return f"no heading #{anchor} in {dest.relative_to(ROOT)}"
    return None


def _expand(cited: str) -> list[str]:
    """benchmarks/a_{x,y}_b.json → the two names (shell brace expansion, one level per brace)."""
    match = re.search(r"\{([^{}]*)\}", cited)
    if not match:
        return [cited]
    head, tail = cited[: match.start()], cited[match.end() :]
    return [name for part in match.group(1).split(",") for name in _expand(head + part + tail)]


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_the_pages_are_found():
    assert (ROOT / "README.md").exists()
    assert len(PAGES) > 1, "docs/*.md: no pages"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_relative_links_resolve(page):
    broken = [f"{page.name}:{n}: ({t}) {why}" for n, t in links(page) if (why := problem(page, t))]
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_cited_benchmark_files_exist(page):
    text = page.read_text(encoding="utf-8")
    missing = sorted(
        {name for cited in JSON_CITED.findall(text) for name in _expand(cited) if not (ROOT / name).is_file()}
    )
    assert not missing, f"{page.name} cites benchmark files that are not there: {missing}"


def test_the_readme_is_a_short_product_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}"


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Quick start on any Linux machine, CPU only", "quick-start-on-any-linux-machine-cpu-only"),
        ("The LLM engine (`tritontts/llm`)", "the-llm-engine-tritonttsllm"),
        (
            "CosyVoice2 with the DiT token2wav (Step-Audio-2-mini)",
            "cosyvoice2-with-the-dit-token2wav-step-audio-2-mini",
        ),
        ("`offline_inference.py` (stage 9)", "offline_inferencepy-stage-9"),
        (
            "GPU hosts without NVIDIA's container: the python backend stub",
            "gpu-hosts-without-nvidias-container-the-python-backend-stub",
        ),
        (
            "Past one GPU: concurrency, data parallel and **disaggregated** layouts",
            "past-one-gpu-concurrency-data-parallel-and-disaggregated-layouts",
        ),
        ("See [the docs](docs/x.md) -- twice", "see-the-docs----twice"),
    ],
)
def test_github_slugs(heading, slug):
    assert github_slug(heading) == slug


def test_a_repeated_heading_gets_a_numbered_anchor(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A\n\n## Figures\n\n```\n## Not a heading\n```\n\n## Figures\n", encoding="utf-8")
    assert anchors(page) == {"a", "figures", "figures-1"}


def test_links_in_code_are_not_links(tmp_path):
    page = tmp_path / "p.md"
    page.write_text('[a](x.md) `[b](y.md)`\n\n```\n[c](z.md)\n```\n[d](<w.md> "t")\n', encoding="utf-8")
    assert [t for _, t in links(page)] == ["x.md", "w.md"]
