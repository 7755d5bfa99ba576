"""A cluster's identity across the fleet: ``ClusterRef(account, region, name)``.

A HyperPod cluster's name is unique only within one AWS account and region, and a platform team that serves many
lines of business keeps them in separate accounts, so ``ml-prod`` may exist in several. The reference is the key:
``<account>/<region>/<name>``, where ``account`` is the 12-digit account id the inventory declares for the cluster
(``accounts``), or ``default`` for a cluster in the base identity's own account (a fleet that declares no account).

Text that names a cluster (a CLI argument, a DAG Param, an endpoint's ``cluster``) may be the key, the key with the
account's inventory name instead of its id, or a bare name that only one cluster has; ``resolve`` says which
cluster it is, or why it cannot tell (unknown, or ambiguous: the candidates' keys listed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

DEFAULT_ACCOUNT: Final = "default"  # the account segment of a cluster in the base identity's own account


@dataclass(frozen=True, order=True)
class ClusterRef:
    account: str  # the 12-digit account id, or DEFAULT_ACCOUNT
    region: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.account}/{self.region}/{self.name}"

    def __str__(self) -> str:
        return self.key


class Named(Protocol):
    """What ``resolve`` reads of a cluster: its reference, and the inventory name of its account (if any)."""

    @property
    def ref(self) -> ClusterRef: ...

    @property
    def account(self) -> str | None: ...


def matches(text: str, cluster: Named) -> bool:
    """Whether ``text`` names ``cluster``: its key, its key with the account's inventory name, or its bare name."""
    ref = cluster.ref
    parts = text.split("/")
    if len(parts) == 1:
        return text == ref.name
    if len(parts) != 3:
        return False
    account, region, name = parts
    return region == ref.region and name == ref.name and account in (ref.account, cluster.account or DEFAULT_ACCOUNT)


T = TypeVar("T", bound=Named)


def candidates(text: str, clusters: Iterable[T], *, account: str | None = None) -> list[T]:
    """The clusters ``text`` names (its key first, then its key with an account's name, or its bare name); several
    are narrowed to those in ``account`` (an inventory account name: a line of business's) when it has any."""
    pool = list(clusters)
    found = [c for c in pool if c.ref.key == text] or [c for c in pool if matches(text, c)]  # an id wins over a name
    if len(found) > 1 and account is not None:
        mine = [c for c in found if (c.account or DEFAULT_ACCOUNT) == account]
        return mine or found
    return found


def ambiguity(text: str, found: Iterable[Named]) -> str:
    keys = sorted(c.ref.key for c in found)
    return f"{text!r} names {len(keys)} clusters ({', '.join(keys)}); write the cluster's key account/region/name"
