"""kvfleet's Airflow plugin, registered through the `airflow.plugins` entry point in pyproject.toml.

It lists kvfleet under Admin → Plugins and adds the kvfleet page to Airflow's UI (Airflow 3.1+ plugin interface):

- ``fastapi_apps``: the page's FastAPI app (``kvfleet.airflow.ui.app``), mounted by the API server at ``/kvfleet``
  (HTML views, and JSON under ``/kvfleet/api/…``);
- ``external_views``: a "kvfleet" entry in the navigation that opens the page inside the UI (``url_route``
  makes the UI show ``href`` in its own frame, at ``/plugin/kvfleet``).

Operators, sensors and triggers live in the installed package, which is where Airflow's triggerer must import
them from. Building the app imports FastAPI only; Airflow's auth and the history database are reached per request.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from kvfleet.airflow.ui.app import create_app

URL_PREFIX = "/kvfleet"


class KvfleetPlugin(AirflowPlugin):
    name = "kvfleet"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "kvfleet"}]
    external_views = [{
        "name": "kvfleet",
        "href": "kvfleet/fleet",  # relative to the UI's base URL, so it works under a sub-path too
        "url_route": "kvfleet",
        "destination": "nav",
        "category": "browse",
    }]
