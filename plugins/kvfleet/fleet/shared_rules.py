"""The rules kvfleet's two readers of configuration share: the inventory (``kvfleet.fleet.inventory``) and the
environment's settings (``kvfleet.settings``). Each exists once.

- **A helm chart repository URL**, wherever it comes from: the inventory's ``curvine.repo_url`` and the
  environment's mirror overrides ``KVFLEET_HELM_REPO_CURVINE`` / ``KVFLEET_HELM_REPO_KYVERNO``. A URL is
  ``https://host[:port][/path]`` (no user name, query, fragment or spaces). Plain ``http://`` is refused unless
  its source allows it explicitly (``allow_insecure_repo: true`` beside an inventory URL,
  ``KVFLEET_HELM_REPO_ALLOW_INSECURE=true`` for the overrides): charts fetched over it can be altered in transit.
- **An SNS topic ARN** (a LOB's ``notify.sns_topic_arn``, ``KVFLEET_NOTIFY_SNS_TOPIC_ARN``).
- **How a URL is shown** in a message or a log line (:func:`redact_url`): its path, query or user name often is
  the secret (a webhook's token, a database password).

Pure: no I/O and no kvfleet import, so both readers (and notifications) can use it without importing each other.
Every pattern is used with ``fullmatch`` and ``re.ASCII``, and spells its classes out (``[0-9]``, not ``\\d``):
a Unicode digit such as '١' is not a digit of a region or an account id.
"""

from __future__ import annotations

import re

REPO_URL = re.compile(r"(https?)://([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)(:[0-9]{1,5})?(/[A-Za-z0-9._~%/+-]*)?",
                      re.ASCII)
EXAMPLE = "https://curvineio.github.io/helm-charts"
SNS_TOPIC_ARN = re.compile(r"arn:aws[a-z-]*:sns:[a-z]{2}(-[a-z]+)+-[0-9]:[0-9]{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?",
                           re.ASCII)
NOT_A_URL = "(a value that is not a URL; not shown)"  # what a caller shows when redact_url gives None
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,30}", re.ASCII)


def redact_url(url: str) -> str | None:
    """``scheme://host[:port]`` of ``url``, followed by ``/…`` when anything was left out (a user name and
    password, a path, a query, a fragment); None when it is not a URL whose host can be told for certain. String
    operations only: never raises, whatever the text.

    The host is what the authority (up to the first '/', '?' or '#', RFC 3986 §3.2) holds after its last '@'. An
    '@' after the authority but before the query is ambiguous (a password holding an unencoded '/', or an '@' in
    a path such as a Teams webhook's): nothing is shown rather than part of a secret."""
    scheme, sep, rest = url.strip().partition("://")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    _, at, host = authority.rpartition("@")
    path = tail.split("?", 1)[0].split("#", 1)[0]
    if not sep or not _SCHEME.fullmatch(scheme) or not host or len(host) > 261 or "@" in path \
            or any(c.isspace() or not c.isprintable() for c in host):
        return None
    return f"{scheme}://{host}" + ("/…" if at or tail not in ("", "/") else "")


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
