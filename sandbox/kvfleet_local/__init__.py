"""kvfleet on one machine, against the twin: the demo (``python -m kvfleet_local.demo``, what ``make demo`` runs) and
the environment of a local Airflow on the embedded PostgreSQL (``kvfleet_local.env``: the demo, ``make up``, the test
suite). Part of the kvfleet-sandbox distribution, never of the kvfleet wheel. It uses the product, and reaches the
twin only as a process (``python -m kvfleet_sandbox``), as a user would.
"""
