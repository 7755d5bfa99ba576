-- Run once by the postgres image's entrypoint, on an empty data volume (docker-entrypoint-initdb.d), as the
-- superuser. Two databases, two roles, neither able to reach the other's data:
--   airflow  - Airflow's metadata database (scheduler, API server, workers, Celery result backend);
--   kvfleet  - kvfleet's history (runs, steps, audit log, drift findings, Curvine releases), migrated by
--              `kvfleet db upgrade` in the airflow-init service.
-- Passwords come from the container environment (docker-compose.yaml, from .env), read with psql's \getenv:
-- nothing secret is written in this file.
\set ON_ERROR_STOP on
\getenv airflow_password AIRFLOW_DB_PASSWORD
\getenv kvfleet_password KVFLEET_DB_PASSWORD

CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE ROLE kvfleet LOGIN PASSWORD :'kvfleet_password';

CREATE DATABASE airflow OWNER airflow;
CREATE DATABASE kvfleet OWNER kvfleet;

REVOKE ALL ON DATABASE airflow FROM PUBLIC;
REVOKE ALL ON DATABASE kvfleet FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE airflow TO airflow;
GRANT CONNECT, TEMPORARY ON DATABASE kvfleet TO kvfleet;

-- PostgreSQL 15+ no longer lets PUBLIC create in the public schema; each owner gets its own.
\connect airflow
ALTER SCHEMA public OWNER TO airflow;
\connect kvfleet
ALTER SCHEMA public OWNER TO kvfleet;
