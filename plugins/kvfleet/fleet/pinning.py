"""An inventory pinned to a run: the validated inventory as canonical JSON, its sha256, and the git revision of the
file it came from.

The first task of every DAG run (the rollout's ``plan``, the ``scope`` task of the drift check, the hit verification
and the Curvine DAGs) reads the inventory file once, validates it, and stores what it validated with the run
(``kvfleet.history.runs.Runs.start``). Every later task of the run, and its notifications, rebuild the inventory from
that snapshot (:func:`inventory_of`), never from the file: an edit merged while a rollout waits at a gate changes the
next run, not the waves left in this one. ``kvfleet audit runs`` shows the digest and the commit.

The snapshot is the validated model, every field with its value (defaults written out), keys sorted, no
whitespace: what was applied is readable without the kvfleet version that applied it. A field without a value
(``None``) is left out, as the file would leave it out. It is validated again when read, by the same model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from kvfleet.errors import InventoryError
from kvfleet.fleet.inventory import Inventory, InventoryWarning, read_inventory_text
from kvfleet.fleet.inventory.loader import validate_document, validate_text
from kvfleet.fleet.inventory.messages import FleetProblems

GIT_TIMEOUT_S = 5.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pinned:
    """What a run applies: the inventory's canonical JSON (``body``), its sha256, the name of the file it was read
    from, and, when git tracks that file, the commit checked out and whether the file differs from that commit's
    copy (``None``: not tracked in a git work tree, or git could not tell)."""

    body: str
    sha256: str
    source: str
    commit: str | None = None
    dirty: bool | None = None

    @property
    def revision(self) -> str:
        """How a person reads it: ``sha256:1a2b3c4d5e6f`` and the commit when there is one."""
        text = f"sha256:{self.sha256[:12]}"
        if self.commit:
            text += f" at {self.commit[:12]}" + (" (the file has uncommitted changes)" if self.dirty else "")
        return text


def _plain(model: BaseModel) -> dict[str, Any]:
    """A validated model as JSON values, keyed as the file spells its keys, fields without a value left out (the
    model refuses an explicit null where the file may only omit a key). A field's own mapping (an add-on's
    ``configuration``) is kept whole, nulls included."""
    out: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if value is None:
            continue
        key = info.alias or name
        if isinstance(value, BaseModel):
            out[key] = _plain(value)
        elif isinstance(value, list | tuple) and value and all(isinstance(v, BaseModel) for v in value):
            out[key] = [_plain(v) for v in value]
        else:
            out[key] = to_jsonable_python(value)
    return out


def canonical(inventory: Inventory) -> str:
    """The validated inventory as canonical JSON: sorted keys, no whitespace, ASCII (any other character escaped, so a
    lone surrogate YAML lets through is carried too, and the digest never depends on an encoding)."""
    return json.dumps(_plain(inventory), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


# Variables that would point git at another repository than the one holding the file (the worker's own).
_GIT_LOCATION = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR",
                 "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_CEILING_DIRECTORIES")


def _git(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if k not in _GIT_LOCATION},
           "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    return subprocess.run(["git", "-c", "core.fsmonitor=false", "-C", str(directory), *args], capture_output=True,
                          text=True, timeout=GIT_TIMEOUT_S, env=env, check=False, stdin=subprocess.DEVNULL)


def git_revision(path: str | Path) -> tuple[str | None, bool | None]:
    """(the commit checked out in the git work tree holding ``path``, whether the file differs from that commit's
    copy), or (None, None) when the file is not tracked in a work tree or git cannot tell (git missing, a
    repository git refuses to read because another user owns it, a timeout: logged).

    Only plumbing that reads objects and the index is used (``rev-parse``, ``ls-files``, ``hash-object
    --no-filters``): unlike ``git status``, none of it runs a clean filter, an fsmonitor or a hook that the
    repository's configuration or attributes name, so reading the revision runs nothing the repository configures.
    """
    p = Path(path).resolve()
    try:
        head = _git(p.parent, "rev-parse", "--verify", "HEAD")
        if head.returncode != 0:
            if "dubious ownership" in head.stderr:
                log.warning("kvfleet: no commit pinned for %s: git refuses the repository (%s)", p.name,
                            head.stderr.strip().splitlines()[0][:300])
            return None, None
        tracked = _git(p.parent, "ls-files", "--error-unmatch", "--", p.name)
        if tracked.returncode != 0:  # in a work tree, but not in git: no commit holds what was read
            return None, None
        committed = _git(p.parent, "rev-parse", "--verify", f"HEAD:./{p.name}")
        current = _git(p.parent, "hash-object", "--no-filters", "--", p.name)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("kvfleet: no commit pinned for %s: %s", p.name, exc)
        return None, None
    commit = head.stdout.strip() or None
    if committed.returncode != 0 or current.returncode != 0:  # added to the index, not committed yet
        return commit, True
    return commit, committed.stdout.strip() != current.stdout.strip()


def pin(path: str | Path) -> Pinned:
    """Read and validate the inventory at ``path`` and pin it. ``InventoryError`` lists every problem."""
    p = Path(path)
    source = p.name[:200]
    try:
        checked = validate_text(read_inventory_text(p), source)
    except FleetProblems as exc:
        raise InventoryError(exc.problems) from None
    for w in checked.warnings:
        warnings.warn(w, InventoryWarning, stacklevel=2)
    body = canonical(checked)
    try:
        again = canonical(validate_document(json.loads(body), source))
    except FleetProblems as exc:
        again = "; ".join(exc.problems)
    if again != body:  # what a later task would read is not what was validated: refuse the run, not its waves
        raise InventoryError([f"{source}: kvfleet cannot pin this inventory: its validated form does not read back "
                              f"the same ({again[:300]}); this is a kvfleet bug: report it with the file"])
    commit, dirty = git_revision(p)
    return Pinned(body=body, sha256=hashlib.sha256(body.encode()).hexdigest(), source=source, commit=commit,
                  dirty=dirty)


def inventory_of(pinned: Pinned) -> Inventory:
    """The inventory a pinned snapshot holds, validated again by today's model. A snapshot that no longer validates
    (stored by another kvfleet version, or changed in the database) is an ``InventoryError`` listing why."""
    if hashlib.sha256(pinned.body.encode()).hexdigest() != pinned.sha256:
        raise InventoryError([f"{pinned.source}: the pinned inventory does not match its digest "
                              f"sha256:{pinned.sha256[:12]}; the history store's copy was changed: plan a new run"])
    try:
        return validate_document(json.loads(pinned.body), pinned.source)
    except FleetProblems as exc:
        raise InventoryError([f"(pinned {pinned.revision}) {p}" for p in exc.problems]) from None
