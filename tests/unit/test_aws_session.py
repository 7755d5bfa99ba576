"""kvfleet's AWS session factory (kvfleet.clients.aws_session): the AWS hook's boto3 sessions share one botocore
loader, and nothing else; the boto3 internal it relies on is pinned here."""

from __future__ import annotations

import boto3
import botocore
import botocore.loaders
import botocore.session
import pytest
from airflow.providers.amazon.aws.hooks import base_aws
from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from kvfleet.clients import aws_session
from kvfleet.clients.aws_session import SharedLoaderSessionFactory


@pytest.fixture(autouse=True)
def static_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_the_provider_resolves_kvfleets_factory_from_the_airflow_configuration() -> None:
    # kvfleet_local.env.airflow_env sets AIRFLOW__AWS__SESSION_FACTORY for the suite, the demo and `make up`
    assert base_aws.SessionFactory is SharedLoaderSessionFactory


def test_two_hooks_in_two_regions_share_one_loader_but_not_their_credentials_or_region(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    east = AwsBaseHook(aws_conn_id=None, client_type="sagemaker", region_name="us-east-1").get_session("us-east-1")
    east_keys = east.get_credentials()  # boto3 resolves a session's credentials when first asked
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "other")
    west = AwsBaseHook(aws_conn_id=None, client_type="sagemaker", region_name="us-west-2").get_session("us-west-2")
    assert east is not west
    assert east._session.get_component("data_loader") is west._session.get_component("data_loader")
    assert (east.region_name, west.region_name) == ("us-east-1", "us-west-2")
    assert east_keys.access_key == "testing" and west.get_credentials().access_key == "other"
    # a client built through the shared loader is a whole client: its model, its paginators, its endpoint
    sm = west.client("sagemaker")
    assert sm.meta.service_model.service_name == "sagemaker" and sm.meta.region_name == "us-west-2"
    assert sm.can_paginate("list_clusters") and "us-west-2" in sm.meta.endpoint_url


def test_the_loader_searches_as_a_fresh_sessions_does_and_a_new_data_path_gets_its_own(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fresh = boto3.session.Session()._session.get_component("data_loader")
    hooked = AwsBaseHook(aws_conn_id=None, client_type="sts", region_name="us-east-1").get_session("us-east-1")
    assert hooked._session.get_component("data_loader").search_paths == fresh.search_paths  # same order
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    custom = AwsBaseHook(aws_conn_id=None, client_type="sts", region_name="us-east-1").get_session("us-east-1")
    loader = custom._session.get_component("data_loader")
    assert loader is not hooked._session.get_component("data_loader")
    assert loader.search_paths[0] == str(tmp_path)  # a model under AWS_DATA_PATH still wins


def test_anything_but_a_boto3_session_is_left_alone() -> None:
    other = object()
    assert aws_session.share_loader(other) is other


def test_the_boto3_internal_is_where_the_factory_expects_it() -> None:
    """boto3 exposes a session's botocore session only as ``_session``; botocore's component registry is public.
    Pinned to the versions this was checked against (requirements/runtime.lock): a new boto3 is looked at again."""
    assert (boto3.__version__, botocore.__version__) == ("1.44.8", "1.44.8")
    session = boto3.session.Session()
    assert isinstance(session._session, botocore.session.Session)
    assert isinstance(session._session.get_component("data_loader"), botocore.loaders.Loader)
