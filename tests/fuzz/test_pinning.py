"""An inventory pinned to a run (kvfleet.fleet.pinning): what the snapshot holds reads back as the same inventory,
its digest follows the content and not the spelling, a changed snapshot is refused, and the git revision is read
without running anything the repository configures."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import yaml
from fuzzgen import inventory_case

from kvfleet.errors import InventoryError
from kvfleet.fleet.inventory import InventoryWarning, load_inventory, parse_inventory
from kvfleet.fleet.pinning import Pinned, git_revision, inventory_of, pin

SEEDS = range(3000)
ENOUGH = 30  # valid inventories the round trip is tried on


def _pin_text(tmp_path: Path, text: str, name: str = "fleet.yaml") -> Pinned:
    path = tmp_path / name
    path.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InventoryWarning)
        return pin(path)


def test_the_example_fleets_read_back_as_the_same_inventory(example_fleet: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    for path in (example_fleet, root / "fleet.example.yaml"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InventoryWarning)
            pinned, loaded = pin(path), load_inventory(path)
        assert inventory_of(pinned) == loaded
        assert pinned.sha256 == hashlib.sha256(pinned.body.encode()).hexdigest()
        assert pinned.source == path.name


def test_every_valid_generated_inventory_reads_back_the_same(tmp_path: Path) -> None:
    """The fuzz generator's cases that validate (hostile values that happen to be legal: unicode, huge numbers,
    empty mappings, both spellings of the named collections) read back from their snapshot unchanged."""
    valid = 0
    for seed in SEEDS:
        _case, text, _expect, _field = inventory_case(seed)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", InventoryWarning)
                expected = parse_inventory(text, "fleet.yaml")
        except InventoryError:
            continue
        valid += 1
        assert inventory_of(_pin_text(tmp_path, text)) == expected, f"seed {seed}"
        if valid == ENOUGH:
            break
    assert valid == ENOUGH  # the property was tried on enough inventories


def test_the_digest_follows_the_content_not_the_spelling(tmp_path: Path, example_fleet: Path) -> None:
    text = example_fleet.read_text()
    doc = yaml.safe_load(text)
    # the same inventory: keyed mappings instead of lists, keys reordered, defaults written out, comments gone
    doc["clusters"] = {c["name"]: {k: v for k, v in reversed(list(c.items())) if k != "name"}
                       for c in doc["clusters"]}
    doc["endpoints"] = [{**e, "l1": e.get("l1", True)} for e in doc["endpoints"]]
    respelled = json.dumps(doc)
    assert _pin_text(tmp_path, respelled, "a.yaml").sha256 == _pin_text(tmp_path, text, "b.yaml").sha256
    changed = yaml.safe_load(text)
    changed["endpoints"][0]["replicas"] += 1
    assert _pin_text(tmp_path, yaml.safe_dump(changed), "c.yaml").sha256 != _pin_text(tmp_path, text).sha256


def test_a_snapshot_that_was_changed_is_refused(tmp_path: Path, example_fleet: Path) -> None:
    pinned = _pin_text(tmp_path, example_fleet.read_text())
    edited = pinned.body.replace('"replicas":2', '"replicas":3', 1)
    assert edited != pinned.body
    with pytest.raises(InventoryError, match="does not match its digest"):
        inventory_of(Pinned(edited, pinned.sha256, pinned.source))
    # a snapshot that matches its digest but no longer validates names the pinned revision and the problem
    broken = pinned.body.replace('"replicas":2', '"replicas":-1', 1)
    with pytest.raises(InventoryError, match=r"pinned sha256:[0-9a-f]{12}.*replicas: -1") as info:
        inventory_of(Pinned(broken, hashlib.sha256(broken.encode()).hexdigest(), pinned.source))
    assert len(info.value.problems) == 1


def test_numbers_json_spells_differently_from_yaml_read_back(tmp_path: Path, example_fleet: Path) -> None:
    """json.dumps writes 1e-05 and 2.5e-07, which YAML 1.1 would read as text: the snapshot is read as JSON."""
    doc = yaml.safe_load(example_fleet.read_text())
    doc["prices"] = {"ml.g5.4xlarge": 0.00001, "ml.g6e.4xlarge": 2.5e-07}
    pinned = _pin_text(tmp_path, yaml.safe_dump(doc))
    assert "1e-05" in pinned.body and "2.5e-07" in pinned.body
    assert dict(inventory_of(pinned).prices) == doc["prices"]


def test_text_beyond_ascii_is_carried(tmp_path: Path, example_fleet: Path) -> None:
    """Any character YAML lets through (an emoji, a lone surrogate from a "\\ud800" escape) is pinned as an ASCII
    escape and reads back as written."""
    doc = yaml.safe_load(example_fleet.read_text())
    doc["lobs"][0]["description"] = "caf\u00e9 \U0001f600 \ud800"
    text = yaml.safe_dump(doc, allow_unicode=False)
    pinned = _pin_text(tmp_path, text)
    assert pinned.body.isascii()
    assert inventory_of(pinned).lobs[0].description == "caf\u00e9 \U0001f600 \ud800"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(repo),
                               "PATH": "/usr/bin:/bin"}).stdout.strip()


def test_the_commit_and_a_dirty_tree_are_pinned(tmp_path: Path, example_fleet: Path) -> None:
    repo = tmp_path / "gitops"
    (repo / "fleets").mkdir(parents=True)
    _git(repo, "init", "-q")
    fleet = repo / "fleets" / "fleet.yaml"
    fleet.write_text(example_fleet.read_text())
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "fleet")
    head = _git(repo, "rev-parse", "HEAD")
    assert git_revision(fleet) == (head, False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InventoryWarning)
        clean = pin(fleet)
        assert (clean.commit, clean.dirty) == (head, False)
        assert clean.revision == f"sha256:{clean.sha256[:12]} at {head[:12]}"
        doc = yaml.safe_load(example_fleet.read_text())
        doc["endpoints"][0]["replicas"] += 1
        fleet.write_text(yaml.safe_dump(doc))
        dirty = pin(fleet)
    assert (dirty.commit, dirty.dirty) == (head, True) and dirty.sha256 != clean.sha256
    assert dirty.revision.endswith("(the file has uncommitted changes)")


def test_outside_a_work_tree_there_is_no_commit(tmp_path: Path, example_fleet: Path) -> None:
    pinned = _pin_text(tmp_path, example_fleet.read_text())
    assert (pinned.commit, pinned.dirty) == (None, None)
    assert pinned.revision == f"sha256:{pinned.sha256[:12]}"


def _committed(tmp_path: Path, example_fleet: Path) -> tuple[Path, str]:
    repo = tmp_path / "gitops"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "fleet.yaml").write_text(example_fleet.read_text())
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "fleet")
    return repo, _git(repo, "rev-parse", "HEAD")


def test_reading_the_revision_runs_no_clean_filter(tmp_path: Path, example_fleet: Path) -> None:
    """`git status` re-hashes a file whose stat changed through the clean filter the repository's attributes name,
    running its command; the revision is read with plumbing that runs none."""
    repo, head = _committed(tmp_path, example_fleet)
    marker = tmp_path / "ran"
    (repo / ".gitattributes").write_text("*.yaml filter=evil\n")
    _git(repo, "config", "filter.evil.clean", f"sh -c 'touch {marker}; cat'")
    os.utime(repo / "fleet.yaml", (1577836800, 1577836800))  # 2020: the index's stat no longer matches
    assert git_revision(repo / "fleet.yaml") == (head, False)
    assert not marker.exists()


def test_a_file_git_does_not_track_names_no_commit(tmp_path: Path, example_fleet: Path) -> None:
    repo, head = _committed(tmp_path, example_fleet)
    (repo / "other.yaml").write_text(example_fleet.read_text())
    (repo / ".git" / "info" / "exclude").write_text("other.yaml\n")  # ignored: git status calls the tree clean
    assert git_revision(repo / "other.yaml") == (None, None)
    (repo / "new.yaml").write_text(example_fleet.read_text())
    _git(repo, "add", "new.yaml")  # staged, in no commit yet
    assert git_revision(repo / "new.yaml") == (head, True)


def test_an_inventory_that_would_not_read_back_is_refused_before_the_run(tmp_path: Path, example_fleet: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A validated form that does not validate back the same (a kvfleet bug) is refused by the first task, not
    met by a later one."""
    from kvfleet.fleet import pinning

    plain = pinning._plain
    monkeypatch.setattr(pinning, "_plain", lambda m: {**plain(m), "prices": {"ml.g5.4xlarge": -1}})
    with pytest.raises(InventoryError, match="kvfleet cannot pin this inventory: its validated form does not read "
                                             "back the same .*prices"):
        _pin_text(tmp_path, example_fleet.read_text())


def test_a_private_range_is_text_so_that_it_reads_back(tmp_path: Path, example_fleet: Path) -> None:
    """ip_network also takes an int; the inventory did, and pinned it as a string that did not validate back."""
    doc = yaml.safe_load(example_fleet.read_text())
    doc.setdefault("settings", {})["webhook_private_ranges"] = [167772160]
    with pytest.raises(InventoryError, match=r"webhook_private_ranges\[0\]: 167772160 is not an IP network"):
        parse_inventory(yaml.safe_dump(doc))


def test_reading_the_revision_runs_no_hook_of_the_repository(tmp_path: Path, example_fleet: Path) -> None:
    """A repository's own configuration (core.fsmonitor names a program git runs on status) runs nothing."""
    repo = tmp_path / "gitops"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "fleet.yaml").write_text(example_fleet.read_text())
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "fleet")
    marker = tmp_path / "ran"
    _git(repo, "config", "core.fsmonitor", f"touch {marker}; false")
    commit, dirty = git_revision(repo / "fleet.yaml")
    assert commit is not None and dirty is False
    assert not marker.exists()
