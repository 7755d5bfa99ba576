"""The kvfleet page inside the Airflow UI: a FastAPI app (``app``) with server-rendered views (``pages``), inline
SVG plots (``svg``) and the named-query catalog it reads the history through (``catalog``)."""
