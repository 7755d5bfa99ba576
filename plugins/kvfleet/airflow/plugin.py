"""kvfleet's Airflow plugin, registered through the `airflow.plugins` entry point in pyproject.toml.

It exists so Airflow knows the package (and lists it under Admin → Plugins). Operators, sensors and
triggers live in the installed package, which is where Airflow's triggerer must import them from.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class KvfleetPlugin(AirflowPlugin):
    name = "kvfleet"
