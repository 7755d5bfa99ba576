"""Who kvfleet is in a cluster's account: one value (``Identity``), built once from the inventory and the run, and
passed to the client factory (``kvfleet.clients.factory``), the triggers (as JSON) and the account guard.

The resolution, the same for every DAG (the scheduled ones too), trigger and CLI command:

1. the base identity: an Airflow AWS connection (``aws_default``, or the one a run or ``--aws-conn-id`` names; an
   account's own ``aws_conn_id`` instead), else boto3's own chain (``--profile``, or IRSA / EKS Pod Identity on
   the Airflow pods);
2. then, where the cluster's account declares ``role_arn``, STS AssumeRole into that role from the base identity,
   with the account's external id and session duration, the session name ``kvfleet-<dag>-<run>`` and the session
   tags ``run`` and ``lob``, so that CloudTrail names the run behind each call (``kvfleet.clients.aws`` builds the
   refreshing credentials).

STS's rules for the values (botocore's ``sts`` service model, ``AssumeRoleRequest``; the AssumeRole API reference):
``RoleSessionName`` is 2 to 64 of ``[\\w+=,.@-]``; a tag key is 1 to 128 and a value 0 to 256 of
``[\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]``, at most 50 tags. Text outside them is replaced, and a name cut to length keeps a
digest of the whole, so two runs never share a session name by truncation.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from kvfleet.fleet.cluster_ref import DEFAULT_ACCOUNT

if TYPE_CHECKING:
    from kvfleet.fleet.inventory import Cluster, Inventory

SESSION_NAME_MAX: Final = 64
_SESSION_NAME_BAD = re.compile(r"[^\w+=,.@-]", re.ASCII)
TAG_VALUE_MAX: Final = 256
TAG_PUNCTUATION: Final = "_.:/=+-@"


def tag_char(ch: str) -> bool:
    r"""Whether STS takes ``ch`` in a tag: ``\p{L}\p{Z}\p{N}`` (a letter, a separator, a number: never a control
    character such as a tab or a newline) or one of ``_.:/=+-@``."""
    return ch in TAG_PUNCTUATION or unicodedata.category(ch)[0] in "LZN"


@dataclass(frozen=True)
class Identity:
    """The base identity (``conn_id``: an Airflow connection; None: boto3's chain, with ``profile`` when given), and
    the role assumed from it in the cluster's account (``role_arn`` None: the base identity acts itself).
    ``account``: the 12-digit id the inventory declares for the cluster, or ``default`` (the base identity's own,
    whatever it is): what the account guard expects."""

    account: str = DEFAULT_ACCOUNT
    conn_id: str | None = "aws_default"
    profile: str | None = None
    role_arn: str | None = None
    external_id: str | None = None
    duration_s: int = 3600
    session_name: str = "kvfleet"
    tags: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON for a trigger's kwargs (``from_dict`` reads it back)."""
        return {"account": self.account, "conn_id": self.conn_id, "profile": self.profile, "role_arn": self.role_arn,
                "external_id": self.external_id, "duration_s": self.duration_s, "session_name": self.session_name,
                "tags": [list(t) for t in self.tags]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Identity:
        return cls(account=str(raw.get("account") or DEFAULT_ACCOUNT), conn_id=raw.get("conn_id", "aws_default"),
                   profile=raw.get("profile"), role_arn=raw.get("role_arn"), external_id=raw.get("external_id"),
                   duration_s=int(raw.get("duration_s") or 3600),
                   session_name=str(raw.get("session_name") or "kvfleet"),
                   tags=tuple((str(k), str(v)) for k, v in raw.get("tags") or ()))

    def assume_role_args(self) -> dict[str, Any]:
        """The AssumeRole request (``role_arn`` set)."""
        args: dict[str, Any] = {"RoleArn": self.role_arn, "RoleSessionName": self.session_name,
                                "DurationSeconds": self.duration_s}
        if self.external_id:
            args["ExternalId"] = self.external_id
        if self.tags:
            args["Tags"] = [{"Key": k, "Value": v} for k, v in self.tags]
        return args

    def base(self) -> str:
        """The base identity, for messages."""
        return f"connection {self.conn_id}" if self.conn_id else (
            f"profile {self.profile}" if self.profile else "the environment's AWS credentials")

    def describe(self) -> str:
        """How the identity is reached, for messages."""
        if self.role_arn is None:
            return self.base()
        return f"role {self.role_arn} (session {self.session_name}), assumed from {self.base()}"


def session_name(dag_id: str, run_id: str) -> str:
    """``kvfleet-<dag>-<run>`` within STS's rules (the module docstring)."""
    dag = dag_id.removeprefix("kvfleet_")
    whole = f"kvfleet-{dag}-{run_id}"
    name = _SESSION_NAME_BAD.sub("-", whole)
    if len(name) > SESSION_NAME_MAX:
        digest = hashlib.sha256(whole.encode()).hexdigest()[:10]
        name = f"{name[:SESSION_NAME_MAX - len(digest) - 1]}-{digest}"
    return name


def tag_value(text: str) -> str:
    """``text`` as a session tag's value (the module docstring)."""
    value = "".join(ch if tag_char(ch) else "_" for ch in text)
    if len(value) > TAG_VALUE_MAX:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        value = f"{value[:TAG_VALUE_MAX - len(digest) - 1]}-{digest}"
    return value


def identity_for(inventory: Inventory, cluster: Cluster, *, conn_id: str | None = "aws_default",
                 profile: str | None = None, run: tuple[str, str] | None = None,
                 lobs: Iterable[str] | None = None) -> Identity:
    """The identity kvfleet acts as on ``cluster``: its account's connection or the base one (``conn_id``, or
    ``profile`` without a connection), and its account's role. ``run``: (dag id, run id), naming the session and
    its ``run`` tag; ``lobs``: the ``lob`` tag (by default the LOBs of the cluster's endpoints in ``inventory``)."""
    account = cluster.ref.account
    declared = next((a for a in inventory.accounts if a.id == account), None)
    if declared is None:
        return Identity(account=account, conn_id=conn_id, profile=profile)
    if lobs is None:
        lobs = {e.lob for e in inventory.endpoints if e.on(cluster)}
    tags: list[tuple[str, str]] = []
    if run is not None:
        tags.append(("run", tag_value(f"{run[0]}/{run[1]}")))
    if lob := "+".join(sorted(set(lobs))):
        tags.append(("lob", tag_value(lob)))
    return Identity(account=account, conn_id=declared.aws_conn_id or conn_id,
                    profile=None if declared.aws_conn_id else profile, role_arn=declared.role_arn,
                    external_id=declared.external_id, duration_s=declared.session_duration_s,
                    session_name=session_name(*run) if run is not None else "kvfleet", tags=tuple(tags))
