"""The project cites only what ships with it: no ``FACTS.md``, ``DOMAIN.md``, ``ARCHITECTURE.md``, ``../shared`` or
issue number ("issue 19", "#19") in code, comments or docs, and every ``docs/reference/<page>.md#<anchor>`` cited
anywhere in the repository names a page and a heading that exist.

A reader of the project has neither the files outside it nor the tracker the numbers pointed into: an upstream fact
is cited from its page in ``docs/reference/`` (which names the upstream source), a design rule from
``docs/architecture.md``. Anchors follow GitHub's heading slugs, so a citation works as a link on GitHub too.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = [ROOT / "plugins", ROOT / "dags", ROOT / "docs", ROOT / "sandbox", ROOT / "tests", ROOT / "bench",
           ROOT / "sql", ROOT / "k8s", ROOT / "tools", ROOT / "deploy", ROOT / "README.md", ROOT / "fleet.example.yaml",
           ROOT / "Makefile", ROOT / "Dockerfile", ROOT / "docker-compose.yaml"]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".tpl", ".sql", ".toml", ".txt", ".json", ".cfg", ".ini", ".sh"}
SELF = Path(__file__).resolve()
# Upstream copies kept verbatim (their own text is not kvfleet's to rewrite).
VERBATIM = {ROOT / "sandbox" / "kvfleet_sandbox" / "data"
            / "inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml"}

OUTSIDE = re.compile(
    r"FACTS(?:\.md| ?§)"              # the old facts file, by name or by section
    r"|DOMAIN\.md|ARCHITECTURE\.md"
    r"|\.\./shared|/work/shared|shared/(?:seeds|reference)"
    r"|\b[Ii]ssues? ?#?[0-9]+"        # "issue 19", "Issue 22's", "issue #7"; an upstream ".../issues/431" URL is fine
    r"|(?:^|[\s(\[,;])#[0-9]{1,4}\b(?!-)",  # "#19", "(#19)"; not an anchor such as "run-for-real.md#4-..."
    re.MULTILINE)

def _files() -> list[Path]:
    out: list[Path] = []
    for base in SCANNED:
        paths = [base] if base.is_file() else sorted(base.rglob("*"))
        out += [p for p in paths if p.is_file() and (p.suffix in TEXT_SUFFIXES or base.is_file()) and p.resolve() != SELF
                and p not in VERBATIM and "__pycache__" not in p.parts]
    return out


FILES = _files()


def _citations(path: Path) -> list[str]:
    text = path.read_text(errors="replace")
    return [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0).strip()!r}"
            for m in OUTSIDE.finditer(text)]


def test_no_outside_citations() -> None:
    found = [c for p in FILES for c in _citations(p)]
    assert found == [], "cite docs/reference/*.md or docs/architecture.md instead:\n" + "\n".join(found)


def test_the_pattern_catches_what_it_must_and_spares_anchors_and_colours() -> None:
    caught = ["(issue 19)", "Issue 22's fields", "issue #7", "see #19", "(#19)", "FACTS.md §3.3", "FACTS §7.5",
              "DOMAIN.md stage 4", "ARCHITECTURE.md", "../shared/seeds"]
    spared = ["docs/run-for-real.md#4-connections", "color:#444", 'stroke="#999"', "PKCS#8",
              "https://github.com/aws/sagemaker-hyperpod-cli/issues/431", "FACTS = yaml.safe_load(...)",
              "docs/reference/lmcache.md#log-formats"]
    assert [s for s in caught if not OUTSIDE.search(s)] == []
    assert [s for s in spared if OUTSIDE.search(s)] == []


# ---- cited anchors exist ------------------------------------------------------------------------------------------

REFERENCE = ROOT / "docs" / "reference"
CITE = re.compile(r"docs/reference/([a-z0-9_-]+)\.md(?:#([A-Za-z0-9_-]+))?")
LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#([^)\s]+))?\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, every character but letters, digits, spaces, hyphens and
    underscores dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif (m := re.match(r"#{1,6} (.+)", line)) and not in_code:
            base = slug(m.group(1))
            seen[base] = seen.get(base, 0) + 1
            if seen[base] > 1:
                seen[f"{base}-{seen[base] - 1}"] = 1
    return set(seen)


def _cited() -> list[tuple[str, Path, str | None]]:
    """(where, page, anchor) for every ``docs/reference/<page>.md[#anchor]`` in the scanned files and k8s/, and every
    markdown link from docs/ into docs/reference/."""
    cites = []
    for path in [*FILES, *sorted((ROOT / "k8s").rglob("*.yaml"))]:
        text = path.read_text(errors="replace")
        for m in CITE.finditer(text):
            cites.append((f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}",
                          REFERENCE / f"{m.group(1)}.md", m.group(2)))
        if path.suffix == ".md" and path.is_relative_to(ROOT / "docs"):
            for m in LINK.finditer(text):
                target = (path.parent / m.group(1)).resolve()
                if target.parent == REFERENCE:
                    cites.append((f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}", target,
                                  m.group(2)))
    return cites


def test_every_cited_reference_page_and_anchor_exists() -> None:
    pages = {p: anchors(p) for p in REFERENCE.glob("*.md")}
    cites = _cited()
    assert len(cites) > 50  # the scan sees the code's citations
    missing = [f"{where}: {page.relative_to(ROOT)}" + (f"#{anchor}" if anchor else "")
               for where, page, anchor in cites
               if page not in pages or (anchor is not None and anchor not in pages[page])]
    assert missing == [], "cited but not in docs/reference:\n" + "\n".join(missing)


def test_the_reference_pages_the_project_names_exist() -> None:
    names = {"README", "hyperpod", "lmcache", "vllm", "curvine", "kyverno", "aws", "kubernetes", "airflow"}
    assert names <= {p.stem for p in REFERENCE.glob("*.md")}


def test_links_inside_the_docs_resolve() -> None:
    """Relative links in docs/ (to the facts files, to code, between pages) name files that exist."""
    bad = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}")
    assert bad == []


def test_slug_follows_github() -> None:
    assert slug("Cluster shapes (UpdateCluster, DescribeCluster)") == "cluster-shapes-updatecluster-describecluster"
    assert slug("Operator releases after 3.2") == "operator-releases-after-32"
    assert slug("`--set` parsing") == "--set-parsing"
    assert slug("Watch errors (410)") == "watch-errors-410"
    assert slug("InferenceEndpointConfig CRD") == "inferenceendpointconfig-crd"
