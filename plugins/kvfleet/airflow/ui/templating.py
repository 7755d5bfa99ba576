"""The kvfleet page's Jinja2 environment: every view, table, form and SVG chart is a template under
``templates/`` (package data), rendered with autoescape on, so a value reaches the page only escaped.

Called by ``kvfleet.airflow.ui.pages`` (the views) and ``kvfleet.airflow.ui.svg`` (the charts). ``render`` returns a
``markupsafe.Markup``: a fragment one template gives another is inserted as it is, anything else (a ``str`` from
the history, a filter, the user's name) is escaped where it lands. Markup is only ever made here, from a template's
output, and by ``kvfleet.airflow.ui.runbook`` from markdown-it's (raw HTML off).

Attribute names that vary (``data-<key>``) go through Jinja's ``xmlattr`` filter, which escapes the values and
refuses a name with a space, ``/``, ``>`` or ``=`` in it.
"""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup


def _fmt(value: Any, spec: str) -> str:
    """``{{ x|fmt("{:.1f}") }}``: a number as Python's ``str.format`` writes it."""
    return spec.format(value)


ENV = Environment(loader=PackageLoader("kvfleet.airflow.ui", "templates"), autoescape=True,
                  undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, auto_reload=False)
ENV.filters["fmt"] = _fmt


def render(name: str, **context: Any) -> Markup:
    """The template ``name`` rendered with ``context`` (autoescaped): safe to insert into another template."""
    return Markup(ENV.get_template(name).render(**context))  # an autoescaped template's output
