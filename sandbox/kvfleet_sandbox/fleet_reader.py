"""The sandbox's reader of a fleet YAML: the fleet a platform team already has, read through kvfleet's own model.

Called by :func:`kvfleet_sandbox.runtime.start_sandbox` (given a path) and by ``kvfleet sandbox up`` (to refuse a
file it cannot read before starting the detached child). The file is validated by the inventory model
(``kvfleet.fleet.inventory``: the same keys, both spellings of ``clusters:``/``endpoints:``, the same checks
and messages as ``kvfleet validate``), the only part of the product the sandbox imports besides
``kvfleet.fleet.constants``, and what it gives is the product's own value, :class:`kvfleet.fleet.inventory.Inventory`
(so tests that already hold one pass it to ``start_sandbox`` directly). The twin reads of it

- per cluster: ``name``, ``region``, ``gpu_nodes`` (``count``, ``instance_type``), ``node_recovery`` (the emulated
  service's default when the inventory declares none), ``l2_injection`` (``auto`` resolved with ``production``),
  ``ebs_storage_class``, ``curvine.namespace`` and ``curvine.master.storage_class``, and the add-ons'
  ``configuration`` (the operator's execution role and TLS bucket, which :mod:`kvfleet_sandbox.aws_prereqs`
  creates);
- per endpoint: ``name``, ``namespace`` and ``cluster`` (the namespaces the RBAC bootstrap binds).

A file the model refuses is :class:`FleetReadError`, one line per problem naming the file, the field path, the
value and the fix.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from kvfleet.fleet.inventory import Inventory
from kvfleet.fleet.inventory.loader import validate_text
from kvfleet.fleet.inventory.messages import FleetProblems
from kvfleet.fleet.inventory.vocabulary import MAX_INVENTORY_BYTES

MAX_FLEET_BYTES = MAX_INVENTORY_BYTES


class FleetReadError(ValueError):
    """A fleet file the sandbox cannot read; ``problems`` holds one message per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def parse_fleet(text: str, source: str = "fleet.yaml") -> Inventory:
    """Read a fleet YAML text; :class:`FleetReadError` lists every problem found."""
    try:
        return validate_text(text, source)
    except FleetProblems as exc:
        raise FleetReadError(exc.problems) from None


def read_fleet(path: str | Path) -> Inventory:
    """Read a fleet file (a regular file of at most 4 MiB, UTF-8); :class:`FleetReadError` otherwise."""
    p = Path(path)
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise FleetReadError([f"{p}: not a regular file; --fleet takes the fleet's YAML file"])
        if st.st_size > MAX_FLEET_BYTES:
            raise FleetReadError([f"{p}: more than {MAX_FLEET_BYTES} bytes; split the fleet into several files"])
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetReadError([f"{p}: cannot read the fleet file: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise FleetReadError([f"{p}: is not UTF-8 text (byte {exc.start}); save it as UTF-8"]) from None
    return parse_fleet(text, source=p.name)
