"""The fuzz suite's marker: ``fuzz_long`` runs 10× the cases and only when ``KVFLEET_FUZZ_LONG=1`` (``make fuzz``)."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fuzz_long: 10x fuzz cases; runs only with KVFLEET_FUZZ_LONG=1 (make fuzz)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KVFLEET_FUZZ_LONG") == "1":
        return
    skip = pytest.mark.skip(reason="long fuzz run: set KVFLEET_FUZZ_LONG=1 (make fuzz)")
    for item in items:
        if "fuzz_long" in item.keywords:
            item.add_marker(skip)
