"""Stage 3's typed actions: helm installs and upgrades carry their values and the digest of the values
file helm gets; they render as marked helm equivalents with ``-f``, never ``--set``; and the executor refuses to
run helm when the file it would hand helm is not the one the action (and so the dry run) names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from kvfleet.clients.helm import Helm
from kvfleet.errors import PermanentError
from kvfleet.fleet import actions as A
from kvfleet.fleet import curvine_values as cv
from kvfleet.fleet.inventory import load_inventory
from kvfleet.stages import executor
from kvfleet.stages.base import StageContext

REPO = "http://charts.example:8080"


def _install(example_fleet: Path) -> A.HelmInstall:
    inv = load_inventory(example_fleet)
    cluster = inv.clusters[0]
    return A.helm_install("curvine", "curvine", "curvine", repo=REPO, version="0.3.2-alpha",
                          values=cv.install_values(cluster), why="format flags true")


def test_helm_actions_render_a_values_file_named_by_its_digest_never_set(example_fleet: Path) -> None:
    install = _install(example_fleet)
    flip = A.helm_upgrade("curvine", "curvine", "curvine", repo=REPO, version="0.3.2-alpha", values=cv.safe_flags(),
                          why="format flags false", when="immediately, once every Curvine pod is Running")
    line = A.render(install)
    assert line.startswith(f"{A.EQUIVALENT_MARK} helm install curvine curvine --repo {REPO} --version 0.3.2-alpha "
                           f"-n curvine -f values-{install.values_digest}.yaml   # ")
    assert "cluster.formatMaster=true" in line and "--set" not in line
    flipped = flip.equivalent()
    assert flipped.startswith("helm upgrade curvine curvine ") and " --reuse-values -f values-" in flipped
    assert "cluster.formatMaster=false" in flipped and flipped.endswith("once every Curvine pod is Running")
    assert install.target() == "release curvine/curvine 0.3.2-alpha (format flags true)"
    assert flip.target() == "release curvine/curvine format flags false"


def test_a_different_value_is_a_different_digest_a_different_action_and_a_different_line(example_fleet: Path) -> None:
    install = _install(example_fleet)
    other = A.helm_install("curvine", "curvine", "curvine", repo=REPO, version="0.3.2-alpha",
                           values={**install.values_map(), "worker.replicas": 99}, why="format flags true")
    assert other.values_digest != install.values_digest
    assert other != install and A.render(other) != A.render(install)
    # the digest alone also decides equality: a dry run that listed another digest does not match the journal
    assert dataclasses.replace(install, values_digest="0" * 16) != install
    # dotted and nested spellings of the same values are the same file, the same digest
    assert A.values_digest({"cluster.formatMaster": False}) == A.values_digest({"cluster": {"formatMaster": False}})


def test_the_digest_is_that_of_the_file_kvfleet_writes_for_helm(example_fleet: Path) -> None:
    install = _install(example_fleet)
    helm = Helm(access=None)
    try:
        args = helm.install_args(install.release, install.chart, install.namespace, repo=install.repo,
                                 version=install.version, values=install.values_map())
        path = args[args.index("-f") + 1]
        assert "--set" not in args
        assert A.tree_digest(yaml.safe_load(helm.files[path])) == install.values_digest
        # the node selector key holds literal dots: still one key in the file
        assert "sagemaker.amazonaws.com/compute-type" in yaml.safe_load(helm.files[path])["master"]["nodeSelector"]
    finally:
        helm.close()


def test_the_executor_refuses_to_run_helm_with_values_other_than_the_actions(example_fleet: Path) -> None:
    inv = load_inventory(example_fleet)
    ctx = StageContext(inventory=inv, cluster=inv.clusters[0], aws_conn_id=None)
    helm = Helm(access=None)  # never reaches a cluster: the gate refuses before helm runs
    ctx.__dict__["helm"] = helm
    tampered = dataclasses.replace(_install(example_fleet), values_digest="0" * 16)
    try:
        with pytest.raises(PermanentError, match="refusing to run helm with values other than those planned"):
            executor.run(ctx, "curvine", [tampered])
        assert executor.journal(ctx) == []  # nothing applied, nothing journalled
    finally:
        helm.close()
