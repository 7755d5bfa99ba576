"""The one rule for a helm chart repository URL, wherever it comes from: the inventory's ``curvine.repo_url``
(``fleet.inventory``) and the environment's mirror overrides ``KVFLEET_HELM_REPO_CURVINE`` /
``KVFLEET_HELM_REPO_KYVERNO`` (``kvfleet.settings``).

A URL is ``https://host[:port][/path]`` (no user name, query, fragment or spaces). Plain ``http://`` is refused
unless its source allows it explicitly (``allow_insecure_repo: true`` beside an inventory URL,
``KVFLEET_HELM_REPO_ALLOW_INSECURE=true`` for the overrides): charts fetched over it can be altered in transit.

Pure: no I/O and no kvfleet import, so both callers can use it without importing each other.
"""

from __future__ import annotations

import re

REPO_URL = re.compile(r"(https?)://([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)(:[0-9]{1,5})?(/[A-Za-z0-9._~%/+-]*)?",
                      re.ASCII)
EXAMPLE = "https://curvineio.github.io/helm-charts"


def repo_url_problem(value: str, *, allow_http: bool, shown: str, allowance: str) -> str | None:
    """What is wrong with ``value`` as a chart repository URL, or None when it is fine (empty is fine: unset).

    ``shown`` is how the message quotes the value; ``allowance`` is the fix that allows plain http at the source
    (e.g. ``set allow_insecure_repo: true beside it``)."""
    if not value:
        return None
    m = REPO_URL.fullmatch(value)
    if not m or not 0 < int((m.group(4) or ":443")[1:]) <= 65535:
        return (f"{shown} is not a chart repository URL (https://host[:port]/path with a port from 1 to 65535, no "
                f"user name, query or spaces); use e.g. {EXAMPLE}")
    if m.group(1) == "http" and not allow_http:
        return (f"{shown} is plain http: charts fetched over it can be altered in transit; use https://, or "
                f"{allowance} for a repository you trust on your network")
    return None
