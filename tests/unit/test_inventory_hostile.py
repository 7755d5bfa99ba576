"""Hostile inventories: YAML 1.1 coercion of names, non-ASCII digits, system namespaces, host paths outside their
prefixes, webhooks into the workers' own network, and a --fleet file whose content must not be echoed."""

from __future__ import annotations

import copy
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet.errors import InventoryError
from kvfleet.fleet.inventory import Inventory, parse_inventory

BASE: dict[str, Any] = {
    "lobs": [{"name": "retail", "notify": {}}],
    "clusters": [{"name": "c1", "region": "us-east-1", "gpu_nodes": {"count": 2, "instance_type": "ml.g5.4xlarge"}}],
    "endpoints": [{"name": "chat", "namespace": "retail", "lob": "retail", "cluster": "c1", "model": "qwen2-7b",
                   "instance_type": "ml.g5.4xlarge"}],
}


def _text(mutate: Any) -> str:
    doc = copy.deepcopy(BASE)
    mutate(doc)
    return yaml.safe_dump(doc, allow_unicode=True)


def _parse(text: str) -> Inventory:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_inventory(text, source="fleet.yaml")


def _problems(text: str) -> list[str]:
    with pytest.raises(InventoryError) as err:
        _parse(text)
    return err.value.problems


# ---- names are strings as written ------------------------------------------------------------------------------

MAPPING_FORM = """
lobs: {retail: {}}
clusters:
  %s: {region: us-east-1, gpu_nodes: {count: 2, instance_type: ml.g5.4xlarge}}
endpoints: []
"""


@pytest.mark.parametrize("key, read_as", [("on", "True"), ("yes", "True"), ("null", "None"), ("~", "None"),
                                          ("0x1F", "31"), ("017", "15"), ("1e3", None)])
def test_a_mapping_key_yaml_11_coerces_is_refused(key: str, read_as: str | None) -> None:
    try:
        inv = _parse(MAPPING_FORM % key)
    except InventoryError as exc:
        (msg,) = exc.problems
        assert ".name:" in msg and "a name is a string as written — quote it" in msg, msg
        return
    # `1e3` stays the string YAML 1.1 reads it as (PyYAML's float needs a dot): a legal, literal name
    assert read_as is None and [c.name for c in inv.clusters] == [key]


def test_a_quoted_key_is_the_name() -> None:
    inv = _parse(MAPPING_FORM % "'on'")
    assert [c.name for c in inv.clusters] == ["on"]


@pytest.mark.parametrize("where", ["clusters", "lobs"])
def test_an_empty_name_is_refused(where: str) -> None:
    problems = _problems(_text(lambda d: d[where][0].update(name="")))
    assert any(f"{where}[0].name: is empty; a name is required" in p for p in problems), problems


def test_an_integer_name_in_the_list_form_is_refused() -> None:
    problems = _problems(_text(lambda d: d["lobs"].append({"name": 7})))
    assert any("lobs[1].name: 7 is an integer, not a name" in p for p in problems), problems


# ---- ASCII only --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["clusters"][0].update(region="us-east-١"), "clusters.c1.region"),
    (lambda d: d["lobs"][0].update(notify={"sns_topic_arn": "arn:aws:sns:us-east-1:١٢٣٤٥٦٧٨٩٠١٢:t"}),
     "lobs.retail.notify.sns_topic_arn"),
    (lambda d: d["clusters"][0].update(curvine={"worker": {"size": "١٠٠Gi"}}), "clusters.c1.curvine.worker.size"),
    (lambda d: d["clusters"][0].update(curvine={"master": {"meta_size": "１０Gi"}}),
     "clusters.c1.curvine.master.meta_size"),
    (lambda d: d["clusters"][0].update(curvine={"repo_url": "https://charts.example.com:٤٤٣/x"}),
     "clusters.c1.curvine.repo_url"),
    (lambda d: d["endpoints"][0].update(image="registry.example.com:٥٠٠٠/vllm:v1"), "endpoints[0](chat).image"),
    (lambda d: d["endpoints"][0].update(image="lmcache/vllm-openai:vé"), "endpoints[0](chat).image"),
])
def test_non_ascii_digits_and_letters_are_refused(mutate: Any, field: str) -> None:
    problems = _problems(_text(mutate))
    assert any(p.startswith(f"fleet.yaml: {field}:") for p in problems), problems


# ---- system namespaces -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ns", ["kube-system", "kube-public", "kube-node-lease", "kube-anything"])
def test_a_system_namespace_is_refused_for_an_endpoint_and_for_curvine(ns: str) -> None:
    (msg,) = _problems(_text(lambda d: d["endpoints"][0].update(namespace=ns)))
    assert msg.startswith("fleet.yaml: endpoints[0](chat).namespace:") and "system namespace" in msg
    (msg,) = _problems(_text(lambda d: d["clusters"][0].update(curvine={"namespace": ns})))
    assert msg.startswith("fleet.yaml: clusters.c1.curvine.namespace:") and "system namespace" in msg


def test_ordinary_namespaces_are_fine() -> None:
    inv = _parse(_text(lambda d: d["endpoints"][0].update(namespace="kubeflow")))
    assert inv.endpoints[0].namespace == "kubeflow"


# ---- Curvine host paths ------------------------------------------------------------------------------------------


# A prefix itself (the node's whole /mnt) is refused too: formatWorker wipes a worker's directories on a first
# install; and a path has one spelling, so no "." or empty segment slips past the prefix check.
@pytest.mark.parametrize("path", ["/etc/curvine", "/var/lib/kubelet/x", "/", "/mntx/data", "/root", "/mnt", "/data/",
                                  "/mnt/.", "/mnt//x", "/opt/dlami/nvme"])
def test_a_host_path_outside_the_prefixes_is_refused(path: str) -> None:
    problems = _problems(_text(lambda d: d["clusters"][0].update(curvine={"worker": {"host_path": path}})))
    assert any(p.startswith("fleet.yaml: clusters.c1.curvine.worker.host_path:") for p in problems), problems


@pytest.mark.parametrize("path", ["/mnt/nvme/curvine", "/data/curvine", "/opt/dlami/nvme/curvine-data"])
def test_a_host_path_under_a_default_prefix_is_fine(path: str) -> None:
    inv = _parse(_text(lambda d: d["clusters"][0].update(curvine={"worker": {"host_path": path}})))
    assert inv.clusters[0].curvine.worker.host_path == path


def test_the_prefixes_are_an_inventory_setting() -> None:
    def custom(d: dict[str, Any]) -> None:
        d["settings"] = {"curvine_host_path_prefixes": ["/srv/nvme"]}
        d["clusters"][0]["curvine"] = {"worker": {"host_path": "/srv/nvme/curvine"}}

    assert _parse(_text(custom)).clusters[0].curvine.worker.host_path == "/srv/nvme/curvine"
    problems = _problems(_text(lambda d: (custom(d), d["clusters"][0]["curvine"]["worker"].update(
        host_path="/mnt/curvine"))))
    assert any("/srv/nvme" in p and "host_path" in p for p in problems), problems
    problems = _problems(_text(lambda d: d.update(settings={"curvine_host_path_prefixes": ["/srv/../etc"]})))
    assert any("settings.curvine_host_path_prefixes[0]" in p for p in problems), problems
    for prefix in ("//", "/", "/./", "/srv//nvme"):  # a prefix that would let every path through
        problems = _problems(_text(lambda d, prefix=prefix: d.update(settings={"curvine_host_path_prefixes": [prefix]})))
        assert any("settings.curvine_host_path_prefixes[0]" in p for p in problems), (prefix, problems)


def test_dotdot_is_refused_even_under_a_prefix() -> None:
    problems = _problems(_text(lambda d: d["clusters"][0].update(curvine={"worker": {"host_path": "/mnt/../etc"}})))
    assert any("'..'" in p for p in problems), problems


# ---- webhook targets ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/", "http://127.0.0.1:8080/hook",
    "http://localhost/hook", "http://hooks.localhost/x", "https://10.1.2.3/x", "https://192.168.0.9/x",
    "https://172.16.5.5/x", "http://[::1]/x", "http://[fe80::1]/x", "http://2130706433/x", "http://0x7f.1/x",
    "http://[::ffff:169.254.169.254]/x", "http://0.0.0.0/x", "http://100.64.0.1/x",
])
def test_a_webhook_into_the_workers_network_is_refused(url: str) -> None:
    (msg,) = _problems(_text(lambda d: d["lobs"][0].update(notify={"webhook_url": url})))
    assert msg.startswith("fleet.yaml: lobs.retail.notify.webhook_url:") and "webhook_private_ranges" in msg
    assert "meta-data" not in msg  # the path is never quoted


def test_a_private_webhook_is_allowed_by_an_explicit_range() -> None:
    def allowed(d: dict[str, Any]) -> None:
        d["settings"] = {"webhook_private_ranges": ["10.1.0.0/16"]}
        d["lobs"][0]["notify"] = {"webhook_url": "https://10.1.2.3/x"}

    assert _parse(_text(allowed)).lob("retail").notify.webhook_url == "https://10.1.2.3/x"
    problems = _problems(_text(lambda d: (allowed(d), d["lobs"][0]["notify"].update(
        webhook_url="http://169.254.169.254/"))))
    assert any("instance metadata service" in p for p in problems), problems
    problems = _problems(_text(lambda d: d.update(settings={"webhook_private_ranges": ["ten/8"]})))
    assert any("settings.webhook_private_ranges[0]" in p for p in problems), problems


def test_a_public_webhook_is_fine() -> None:
    inv = _parse(_text(lambda d: d["lobs"][0].update(notify={"webhook_url": "https://hooks.example.com/k"})))
    assert inv.lob("retail").notify.webhook_url == "https://hooks.example.com/k"


# ---- --fleet given a file that is not an inventory ---------------------------------------------------------------

SECRET = "s3cr3t-T0KEN-value"


@pytest.mark.parametrize("content", [
    f"root:x:0:0:{SECRET}:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin\n",  # a string at the top level
    f"password: {SECRET}\nuser: admin\n",  # a mapping with none of the inventory's keys
    f"- {SECRET}\n- two\n",  # a list
    f"key: [{SECRET}\n",  # not YAML
    f"a: b: {SECRET}\n",  # not YAML either
    f"export TOKEN='{SECRET}'\n\tx: {SECRET}\n",  # a tab where YAML refuses it
    f"{SECRET}: !!python/object/apply:os.system ['{SECRET}']\n",  # a tag the safe loader refuses
])
def test_a_file_that_is_not_an_inventory_is_refused_without_its_content(tmp_path: Path, content: str) -> None:
    path = tmp_path / "notes.txt"
    path.write_text(content)
    proc = subprocess.run([sys.executable, "-m", "kvfleet.cli", "validate", "--fleet", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    out = proc.stdout + proc.stderr
    assert "notes.txt" in out and "Traceback" not in out
    assert not any(content[i:i + 6] in out for i in range(len(content) - 5) if content[i:i + 6].strip()), out


@pytest.mark.parametrize("url", [
    "http://[::169.254.169.254]/", "http://[64:ff9b::a9fe:a9fe]/", "http://[2002:a9fe:a9fe::]/",  # IPv4 in IPv6
    "http://１２７.０.０.１/", "http://127。0。0。1/", "http://①②⑦.0.0.1/",  # folded to 127.0.0.1 by resolvers
])
def test_a_webhook_spelled_to_slip_past_the_address_check_is_refused(url: str) -> None:
    problems = _problems(_text(lambda d: d["lobs"][0].update(notify={"webhook_url": url})))
    assert any("notify.webhook_url" in p and ("169.254.169.254" in p or "not ASCII" in p) for p in problems), problems
