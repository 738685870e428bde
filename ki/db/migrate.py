"""Programmatic Alembic: `ki migrate` and the tests call these instead of the alembic CLI.

The publication the migrations create is named by `settings.connect.publication_name` unless
`publication_name` is passed (alembic CLI: `-x publication=NAME`).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext

from ki.clients import make_engine
from ki.settings import Settings

#: The Alembic scripts: package data of `ki.migrations`, wherever the package is installed.
MIGRATIONS_DIR = Path(str(files("ki.migrations")))


def alembic_config(settings: Settings, publication_name: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["settings"] = settings
    cfg.attributes["publication_name"] = publication_name or settings.connect.publication_name
    return cfg


def upgrade(settings: Settings, revision: str = "head", *, publication_name: str | None = None) -> None:
    command.upgrade(alembic_config(settings, publication_name), revision)


def downgrade(settings: Settings, revision: str = "base", *, publication_name: str | None = None) -> None:
    command.downgrade(alembic_config(settings, publication_name), revision)


def current_revision(settings: Settings) -> str | None:
    """The revision the database is at (None: never migrated)."""
    engine = make_engine(settings, pooled=False)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
