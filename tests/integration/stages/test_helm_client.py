"""clients.helm with the real helm binary against the sandbox's Kubernetes API: a release that does not exist
is a state (None) for the reads that ask, and ``ReleaseNotFound`` for the commands that need it."""

from __future__ import annotations

import pytest

from kvfleet.clients.helm import ReleaseNotFound
from kvfleet.stages import curvine

pytestmark = pytest.mark.integration
MISSING = "kvfleet-no-such-release"


def test_a_missing_release_is_none_or_release_not_found(fleet_env, make_ctx) -> None:  # type: ignore[no-untyped-def]
    ctx = make_ctx()
    ns = ctx.cluster.curvine.namespace
    assert ctx.helm.status(MISSING, ns) is None
    assert ctx.helm.revisions(MISSING, ns) is None
    with pytest.raises(ReleaseNotFound):
        ctx.helm.values(MISSING, ns)
    with pytest.raises(ReleaseNotFound):
        ctx.helm.rollback(MISSING, ns, 1)
    spec = ctx.cluster.curvine
    assert not ctx.helm.chart_exists(spec.chart, curvine.repo_url(ctx), "0.0.0-no-such-version")
