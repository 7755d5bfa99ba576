"""The rules the inventory and the settings share (kvfleet.fleet.shared_rules) behave the same in both readers:
one SNS topic ARN pattern (a Unicode digit is no digit in either), and one way of showing a URL (never its user,
password, path or query)."""

from __future__ import annotations

import pytest

from kvfleet.errors import InventoryError
from kvfleet.fleet.inventory import parse_inventory
from kvfleet.fleet.shared_rules import SNS_TOPIC_ARN, redact_url
from kvfleet.settings import ConfigError, load_settings

FLEET = """
lobs:
  - name: retail
    notify: {{{notify}}}
clusters:
  - {{name: c1, region: us-east-1, gpu_nodes: {{count: 2, instance_type: ml.g5.4xlarge}}}}
"""


@pytest.mark.parametrize(("url", "shown"), [
    ("https://user:s3cret@hooks.example.com", "https://hooks.example.com/…"),
    ("https://hooks.example.com:8443/t/s3cret?token=s3cret", "https://hooks.example.com:8443/…"),
    ("https://u:p/s3cret@hooks.example.com/x", None),  # a password with a '/', or an '@' in a path: ambiguous
    ("https://hooks.example.com/hook?user=a@S3CRET", "https://hooks.example.com/…"),  # an '@' in the query
    ("https://h.example.com/#a@S3CRET", "https://h.example.com/…"),  # ... or in the fragment
    ("https://x.webhook.office.com/webhookb2/guid@tenant/IncomingWebhook/s3cret", None),
    ("https://hooks.exämple.com/s3cret", "https://hooks.exämple.com/…"),  # a host that is not ASCII is shown
    ("https://hooks.example.com", "https://hooks.example.com"),
    ("https://hooks.example.com/", "https://hooks.example.com"),
    ("not a url s3cret", None),
])
def test_a_url_is_shown_by_scheme_host_and_port_only(url: str, shown: str | None) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("url", ["http://user:s3cret@10.0.0.1", "https://10.0.0.1/x?u=a@s3cret"])
def test_the_inventory_never_quotes_a_webhooks_password_or_token(url: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory(FLEET.format(notify=f"webhook_url: '{url}'"))
    text = str(info.value)
    shown = url.split("://")[0] + "://10.0.0.1/…"
    assert "s3cret" not in text and f"'{shown}' points at a private or reserved address" in text, text


@pytest.mark.parametrize("arn", ["arn:aws:sns:us-east-1:12345678901١:t", "arn:aws:sns:us-east-١:123456789012:t"])
def test_a_unicode_digit_is_no_digit_of_an_arn_in_either_reader(arn: str) -> None:
    assert SNS_TOPIC_ARN.fullmatch(arn) is None
    with pytest.raises(ConfigError):
        load_settings({"KVFLEET_NOTIFY_SNS_TOPIC_ARN": arn})
    with pytest.raises(InventoryError, match="is not an SNS topic ARN"):
        parse_inventory(FLEET.format(notify=f"sns_topic_arn: '{arn}'"))


def test_a_valid_arn_passes_both_readers() -> None:
    arn = "arn:aws:sns:us-east-1:123456789012:kvfleet-retail"
    assert load_settings({"KVFLEET_NOTIFY_SNS_TOPIC_ARN": arn}).notify_sns_topic_arn == arn
    assert parse_inventory(FLEET.format(notify=f"sns_topic_arn: '{arn}'")).lob("retail").notify.sns_topic_arn == arn


def test_a_chart_repository_port_out_of_range_is_refused_by_both_readers() -> None:
    """One rule for a chart repository URL: the inventory took port 99999, which the settings refused."""
    url = "https://charts.example.com:99999/curvine"
    fleet = ("clusters:\n  - {name: c1, region: us-east-1, gpu_nodes: {count: 2, instance_type: ml.g5.4xlarge}, "
             f"curvine: {{repo_url: '{url}'}}}}\n")
    with pytest.raises(InventoryError, match="with a port from 1 to 65535"):
        parse_inventory(fleet)
    with pytest.raises(ConfigError, match="with a port from 1 to 65535"):
        load_settings({"KVFLEET_HELM_REPO_CURVINE": url})
