"""DAG tests use the root conftest's `airflow_db` and `dagbag` fixtures."""
