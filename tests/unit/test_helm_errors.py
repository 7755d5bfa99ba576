"""clients.helm: helm's stderr is read once, into typed errors, and its JSON into typed results, so no caller
parses "not found" out of a message again."""

from __future__ import annotations

import pytest

from kvfleet.clients.helm import HelmConflict, HelmPermanent, ReleaseNotFound, ReleaseStatus, Revision, classify
from kvfleet.errors import PermanentError, TemporaryError


@pytest.mark.parametrize("stderr", ["Error: release: not found",
                                    'Error: UPGRADE FAILED: "curvine" has no deployed releases'])
def test_a_missing_release_is_release_not_found(stderr: str) -> None:
    err = classify(stderr, f"helm status: {stderr}")
    assert isinstance(err, ReleaseNotFound) and isinstance(err, HelmPermanent) and isinstance(err, PermanentError)
    assert str(err) == f"helm status: {stderr}"


@pytest.mark.parametrize("stderr", [
    "Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress",
    'Error: UPGRADE FAILED: cannot patch "curvine-master" with kind StatefulSet: Operation cannot be fulfilled on '
    'statefulsets.apps "curvine-master": the object has been modified; please apply your changes to the latest '
    "version and try again"])
def test_a_conflict_is_temporary(stderr: str) -> None:
    err = classify(stderr, "helm upgrade")
    assert isinstance(err, HelmConflict) and isinstance(err, TemporaryError) and err.delay > 0


@pytest.mark.parametrize("stderr", [
    'Error: chart "curvine" version "9.9.9" not found in https://charts.example/curvine',
    "Error: values don't meet the specifications of the schema(s) in the following chart(s)",
    "Error: INSTALLATION FAILED: cannot re-use a name that is still in use",
    "Error: unknown flag: --frobnicate"])
def test_wrong_input_is_helm_permanent_but_not_release_not_found(stderr: str) -> None:
    err = classify(stderr, "helm")
    assert isinstance(err, HelmPermanent) and not isinstance(err, ReleaseNotFound)


def test_anything_else_is_temporary() -> None:
    err = classify("Error: Kubernetes cluster unreachable: Get \"https://10.0.0.1/version\": dial tcp: i/o timeout",
                   "helm status")
    assert type(err) is TemporaryError


def test_typed_results_parse_helm_json() -> None:
    status = ReleaseStatus.of({"name": "curvine", "namespace": "curvine", "version": 3,
                               "info": {"status": "deployed"}})
    assert status == ReleaseStatus("curvine", "curvine", 3, "deployed")
    row = Revision.of({"revision": "2", "status": "superseded", "chart": "curvine-0.3.3-alpha",
                       "updated": "2026-12-01T10:00:00Z", "app_version": "0.3.3", "description": "Upgrade complete"})
    assert (row.revision, row.status, row.chart, row.updated) == (2, "superseded", "curvine-0.3.3-alpha",
                                                                 "2026-12-01T10:00:00Z")
    with pytest.raises(AttributeError):
        row.revision = 3  # type: ignore[misc]
