"""What a conversation is called wherever it is shown: the session label its client sent, else its first
user message (`policies.transcript.first_user_node`: the first that says something of its own, without
the tagged context blocks agents add), shortened, as text; its id when neither is left (an id whose
transcript retention removed).

The savings ledger's sessions (`GET /api/savings`, the dashboard's table), a request's record
(`GET /api/requests/{id}`, its dashboard page) and the recent requests all name a conversation here, so
each says the same. The name is plain text: pages escape it like any other string.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from gateway.threads import aside
from policies.transcript import user_text
from storage.records import RecordStore

NAME_CHARS = 60


def shortened(text: str, limit: int = NAME_CHARS) -> str:
    """`text` cut at a word within `limit` characters, with an ellipsis when cut."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip() + "…"


def conversation_name(label: str | None, opening: Mapping[str, Any] | None, conversation_id: str) -> str:
    """The name of a conversation: its label, else its first user message (shortened), else its id."""
    if label:
        return label
    text = user_text(opening) if opening is not None else ""
    return shortened(text) if text else conversation_id


async def _openings(store: RecordStore, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    wanted = {key for key in keys if key[1]}
    return await aside(store.conversation_openings, wanted) if wanted else {}


async def name_sessions(store: RecordStore, sessions: list[dict[str, Any]]) -> None:
    """Give each ledger session (`tenant`, `session`: its label or its conversation's id) its `name`.
    A session that is no conversation of its tenant is a label, and is named by itself."""
    openings = await _openings(store, ((s["tenant"], s["session"]) for s in sessions))
    for session in sessions:
        session["name"] = conversation_name(None, openings.get((session["tenant"], session["session"])),
                                            session["session"])


async def name_runs(store: RecordStore, runs: list[dict[str, Any]]) -> None:
    """Give each run record its `conversation_name`."""
    openings = await _openings(store, ((r["tenant"], r["conversation_id"] or "") for r in runs
                                       if not r.get("session_label")))
    for run in runs:
        conversation = run.get("conversation_id") or run["id"]
        run["conversation_name"] = conversation_name(run.get("session_label"),
                                                     openings.get((run["tenant"], conversation)), conversation)
