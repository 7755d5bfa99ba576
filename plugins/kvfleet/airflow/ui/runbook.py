"""Where the kvfleet page sends an operator who needs the runbook, and the page's own copy of it.

``href(base, topic)`` is the link for a topic (a red drift finding, a failed gate or run): the runbook's section
at ``KVFLEET_RUNBOOK_URL`` when that is set (e.g. the repository's rendered ``docs/runbook.md``), else the
page's ``/runbook`` route, which renders ``docs/runbook.md`` (found at ``KVFLEET_RUNBOOK_PATH``, or in the
checkout the package runs from) with GitHub-style heading anchors, so the same ``#section`` links work in both.
"""

from __future__ import annotations

import re
from pathlib import Path

from markupsafe import Markup, escape

from kvfleet.airflow.gates import RUNBOOK_ANCHORS, Links
from kvfleet.settings import load_settings

HEADING = re.compile(r"<h([1-6])>(.*?)</h\1>", re.S)
TAG = re.compile(r"<[^>]+>")
# Where each red thing of the page is explained.
DRIFT_TOPIC = "drift"
TOPIC_OF_DAG = {"kvfleet_rollout": "rollout", "kvfleet_drift_check": "drift",
                "kvfleet_curvine_upgrade": "curvine_upgrade", "kvfleet_curvine_scale_out": "curvine_upgrade",
                "kvfleet_hit_verification": "verification"}


def external_url() -> str:
    return load_settings().runbook_url


def href(base: str, topic: str) -> str:
    url = external_url()
    if url:
        return Links(runbook=url).runbook_section(topic)
    anchor = RUNBOOK_ANCHORS.get(topic, "")
    return f"{base}/runbook" + (f"#{anchor}" if anchor else "")


def source() -> Path | None:
    """The runbook's markdown: ``KVFLEET_RUNBOOK_PATH``, or ``docs/runbook.md`` of the checkout."""
    configured = load_settings().runbook_path.strip()
    candidates = [Path(configured)] if configured else []
    candidates.append(Path(__file__).resolve().parents[4] / "docs" / "runbook.md")
    return next((p for p in candidates if p.is_file()), None)


def slug(heading_html: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = TAG.sub("", heading_html)
    text = re.sub(r"&[a-z]+;|&#\d+;", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def render(markdown_text: str) -> Markup:
    """Markdown (the runbook, a gate's body) as HTML: tables on, raw HTML off (shown as text, so the output is
    markup markdown-it made, every text in it escaped), headings with GitHub's anchors (``slug`` keeps word
    characters, hyphens and spaces only)."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:  # markdown-it-py comes with Airflow (through rich); without it, the text as it is
        return Markup("<pre>{}</pre>").format(markdown_text)
    html = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown_text)
    return Markup(HEADING.sub(lambda m: f'<h{m[1]} id="{escape(slug(m[2]))}">{m[2]}</h{m[1]}>', html))
