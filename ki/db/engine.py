"""Engines and sessions for the structured layer, built from the one settings object."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from ki.settings import Settings

# Our statements are short and run often; PostgreSQL's JIT spends more compiling them (tens of ms) than
# it ever saves, so it is off for our sessions whatever the server default is.
_SESSION_OPTIONS = {"options": "-c jit=off"}


def make_engine(settings: Settings, *, pooled: bool = True, **kwargs: Any) -> Engine:
    """A synchronous engine (psycopg 3). `pooled=False` for one-shot tools such as migrations."""
    db = settings.database
    kwargs.setdefault("connect_args", _SESSION_OPTIONS)
    if pooled:
        kwargs.setdefault("pool_size", db.pool_size)
        kwargs.setdefault("pool_pre_ping", True)
    else:
        kwargs.setdefault("poolclass", NullPool)
    return create_engine(db.url, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def make_async_engine(settings: Settings, **kwargs: Any) -> AsyncEngine:
    """An asyncio engine on the same URL (psycopg 3 serves both), for the aiohttp API."""
    kwargs.setdefault("pool_size", settings.database.pool_size)
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("connect_args", _SESSION_OPTIONS)
    return create_async_engine(settings.database.url, **kwargs)


def make_async_session_factory(engine: AsyncEngine) -> async_sessionmaker[Any]:
    return async_sessionmaker(engine, expire_on_commit=False)
