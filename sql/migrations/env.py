"""Alembic environment for kvfleet's history database.

The URL comes from the caller (``kvfleet.history.db.upgrade``) through ``config.attributes['connection']``
or the ``sqlalchemy.url`` option; kvfleet never reads alembic.ini from the current directory.
"""

from alembic import context
from sqlalchemy import create_engine

config = context.config
connection = config.attributes.get("connection")
if connection is not None:
    context.configure(connection=connection, version_table="kvfleet_alembic_version")
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as conn:
        context.configure(connection=conn, version_table="kvfleet_alembic_version")
        with context.begin_transaction():
            context.run_migrations()
