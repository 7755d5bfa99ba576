"""Issue 22's inventory fields: per-LOB notify targets, instance prices, and the sources' defaults and checks."""

from __future__ import annotations

import warnings

import pytest
import yaml

from kvfleet.errors import InventoryError
from kvfleet.fleet.inventory import parse_inventory

BASE = {
    "lobs": [{"name": "retail"}],
    "clusters": [{"name": "c1", "region": "us-east-1", "gpu_nodes": {"count": 2, "instance_type": "ml.g5.4xlarge"}}],
    "endpoints": [{"name": "chat", "namespace": "retail", "lob": "retail", "cluster": "c1", "model": "qwen2-7b",
                   "instance_type": "ml.g5.4xlarge"}],
}
TOPIC = "arn:aws:sns:us-east-1:123456789012:kvfleet-retail"


def _with(mutate) -> str:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    mutate(doc)
    return yaml.safe_dump(doc)


def _problems(text: str) -> list[str]:
    with pytest.raises(InventoryError) as err:
        parse_inventory(text, source="fleet.yaml")
    return err.value.problems


def _parse(text: str):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_inventory(text, source="fleet.yaml")


# --- notify (per LOB) ----------------------------------------------------------------------------------------

def test_notify_is_optional_and_parsed() -> None:
    assert _parse(yaml.safe_dump(BASE)).lob("retail").notify_sns_topic_arn is None
    inv = _parse(_with(lambda d: d["lobs"][0].update(
        notify={"sns_topic_arn": TOPIC, "webhook_url": "https://hooks.example.com/kvfleet"})))
    lob = inv.lob("retail")
    assert (lob.notify_sns_topic_arn, lob.notify_webhook_url) == (TOPIC, "https://hooks.example.com/kvfleet")
    only_hook = _parse(_with(lambda d: d["lobs"][0].update(notify={"webhook_url": "http://10.0.0.5:8080/h"})))
    assert only_hook.lob("retail").notify_sns_topic_arn is None
    assert only_hook.lob("retail").notify_webhook_url == "http://10.0.0.5:8080/h"


@pytest.mark.parametrize("arn", ["arn:aws:sqs:us-east-1:123456789012:q", "arn:aws:sns:us-east-1:1234:t",
                                 "kvfleet-retail", "arn:aws:sns:us-east-1:123456789012:bad name"])
def test_notify_topic_must_be_an_sns_topic_arn(arn: str) -> None:
    (msg,) = _problems(_with(lambda d: d["lobs"][0].update(notify={"sns_topic_arn": arn})))
    assert msg.startswith("fleet.yaml: lobs.retail.notify.sns_topic_arn:")
    assert "not an SNS topic ARN" in msg and "arn:aws:sns:" in msg


@pytest.mark.parametrize("url", ["ftp://files.example.com/hook", "hooks.example.com/x", "https:///nohost",
                                 "https://h:99999/x", "https://h/x y"])
def test_notify_webhook_must_be_http_or_https(url: str) -> None:
    (msg,) = _problems(_with(lambda d: d["lobs"][0].update(notify={"webhook_url": url})))
    assert msg.startswith("fleet.yaml: lobs.retail.notify.webhook_url:") and "http(s) URL" in msg
    assert "https://hooks.example.com/kvfleet" in msg  # the fix


def test_notify_webhook_path_is_not_echoed() -> None:
    """A webhook's path is often its secret (a token): the message shows scheme and host only."""
    (msg,) = _problems(_with(lambda d: d["lobs"][0].update(notify={"webhook_url": "gopher://h/T0KEN-SECRET"})))
    assert "T0KEN-SECRET" not in msg and "gopher://h/" in msg


def test_notify_unknown_key_and_wrong_type() -> None:
    (msg,) = _problems(_with(lambda d: d["lobs"][0].update(notify={"email": "a@b"})))
    assert "lobs.retail.notify.email: unknown field" in msg and "sns_topic_arn, webhook_url" in msg
    (msg,) = _problems(_with(lambda d: d["lobs"][0].update(notify=["x"])))
    assert "lobs.retail.notify: expected a mapping" in msg


# --- prices (top level) --------------------------------------------------------------------------------------

def test_prices_optional_and_parsed() -> None:
    assert dict(_parse(yaml.safe_dump(BASE)).prices) == {}
    inv = _parse(_with(lambda d: d.update(prices={"ml.g6e.4xlarge": 1.861, "ml.g5.4xlarge": 2})))
    assert dict(inv.prices) == {"ml.g6e.4xlarge": 1.861, "ml.g5.4xlarge": 2.0}
    assert isinstance(inv.prices["ml.g5.4xlarge"], float)
    assert dict(inv.select(clusters=["c1"]).prices) == dict(inv.prices)  # narrowing keeps them


@pytest.mark.parametrize("key, value, words", [
    ("g6e.4xlarge", 1.0, "not a SageMaker instance type"),
    ("ml.g6e.4xlarge", 0, "above 0"),
    ("ml.g6e.4xlarge", -2.5, "above 0"),
    ("ml.g6e.4xlarge", "1.86", "not a price"),
    ("ml.g6e.4xlarge", True, "not a price"),
    ("ml.g6e.4xlarge", float("inf"), "above 0 and at most"),
    ("ml.g6e.4xlarge", 1e9, "at most 10000"),
])
def test_prices_refused(key: str, value: object, words: str) -> None:
    (msg,) = _problems(_with(lambda d: d.update(prices={key: value})))
    assert msg.startswith(f"fleet.yaml: prices.{key}:") and words in msg


def test_prices_must_be_a_mapping() -> None:
    (msg,) = _problems(_with(lambda d: d.update(prices=[1.0])))
    assert msg.startswith("fleet.yaml: prices: expected a mapping")
