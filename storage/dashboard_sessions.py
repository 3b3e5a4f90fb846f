"""Dashboard sessions: one row per signed-in browser, read on every page it loads.

A session lives while its row does. Signing out deletes it, revoking a made
key deletes its sessions in the same transaction (`storage/api_keys.py`),
removing a config key on reload deletes that key's, and expired rows are swept
by housekeeping. Every replica reads the same table, so an ended session is
refused by all of them at its next page. The row holds the sha256 of the
session id, never the id itself.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

from sqlalchemy import delete, select

from storage.api_keys import ApiKeyRecord, api_key_record
from storage.record_types import as_utc
from storage.schema import ApiKey, DashboardSession
from storage.store_base import StoreBase

_SESSIONS = DashboardSession.__table__
_KEYS = ApiKey.__table__


def session_digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


@dataclass(frozen=True)
class DashboardSessionRecord:
    key_id: str
    tenant: str | None
    created_at: datetime
    expires_at: datetime
    api_key: ApiKeyRecord | None  # the made key that signed in, as it is now (None: a config key, or gone)


class DashboardSessions(StoreBase):
    def start_dashboard_session(self, session_id: str, key_id: str, tenant: str | None,
                                expires_at: datetime) -> None:
        row = {"id": session_digest(session_id), "key_id": key_id, "tenant": tenant,
               "created_at": self._now(), "expires_at": expires_at}
        with self._writing, self.engine.begin() as connection:
            connection.execute(_SESSIONS.insert(), [row])

    def dashboard_session(self, session_id: str) -> DashboardSessionRecord | None:
        """The live session (with its made key, in the same read), or None if it ended or expired."""
        query = (select(_SESSIONS, *(c.label(f"k_{c.name}") for c in _KEYS.c))
                 .select_from(_SESSIONS.outerjoin(_KEYS, _KEYS.c.id == _SESSIONS.c.key_id))
                 .where(_SESSIONS.c.id == session_digest(session_id), _SESSIONS.c.expires_at > self._now()))
        with self.engine.connect() as connection:
            row = connection.execute(query).mappings().first()
        if row is None:
            return None
        key = api_key_record({c.name: row[f"k_{c.name}"] for c in _KEYS.c}) if row["k_id"] is not None else None
        return DashboardSessionRecord(key_id=row["key_id"], tenant=row["tenant"],
                                      created_at=as_utc(row["created_at"]), expires_at=as_utc(row["expires_at"]),
                                      api_key=key)

    def end_dashboard_session(self, session_id: str) -> bool:
        """Sign-out: whether there was such a session."""
        with self._writing, self.engine.begin() as connection:
            return bool(connection.execute(
                delete(_SESSIONS).where(_SESSIONS.c.id == session_digest(session_id))).rowcount)

    def end_dashboard_sessions_of_keys(self, key_ids: Iterable[str]) -> int:
        """Every session the keys signed in (a key removed from the config); how many ended."""
        ids = list(key_ids)
        if not ids:
            return 0
        with self._writing, self.engine.begin() as connection:
            return connection.execute(delete(_SESSIONS).where(_SESSIONS.c.key_id.in_(ids))).rowcount

    def sweep_dashboard_sessions(self) -> int:
        """Delete the expired sessions (no page is served for them already); how many."""
        with self._writing, self.engine.begin() as connection:
            return connection.execute(delete(_SESSIONS).where(_SESSIONS.c.expires_at <= self._now())).rowcount
