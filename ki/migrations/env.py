"""Alembic environment of the reference schema.

Run through `ki migrate` (ki.db.migrate), or the alembic CLI: `alembic -c ki/migrations/alembic.ini
upgrade head [-x publication=NAME]`. The database comes from the settings (config.json + KI_* env).
"""

from __future__ import annotations

from alembic import context

from ki.clients import make_engine
from ki.db.models import Base
from ki.settings import load_settings

# Serialises concurrent `ki migrate` runs (e.g. several workers starting at once).
_MIGRATION_LOCK_KEY = 0x6B692D6D6967  # "ki-mig"

config = context.config
settings = config.attributes.get("settings") or load_settings()
publication = (
    context.get_x_argument(as_dictionary=True).get("publication")
    or config.attributes.get("publication_name")
    or settings.connect.publication_name
)
# Read by the revision scripts (context.config.attributes["publication_name"]).
config.attributes["publication_name"] = publication
target_metadata = Base.metadata


def run_offline() -> None:
    context.configure(
        url=settings.database.url,
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    engine = make_engine(settings, pooled=False)
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, target_metadata=target_metadata)
            with context.begin_transaction():
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK_KEY})")
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
