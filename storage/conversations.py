"""Conversation rows: their activity, a first run moved into the conversation its answer opens, and the
messages conversations are named by.

An unlabelled request before any answer is a conversation of its own (its request id; see
`policies.transcript.conversation_id_for`). When its run ends with an answer, `_adopt_first_run` moves
it, in the transaction that records the outcome, into the conversation that answer opens: the one its
client's next request lands in, however the two are ordered (the id is worked out from the transcript
and the answer alone, so a next request captured first has already made that conversation). Its node
memberships, its subagents' link and the conversation's row go along; nothing else names the own id.
"""
from __future__ import annotations

import json
import secrets
from datetime import datetime
from typing import Any, Iterable

from sqlalchemy import Connection, bindparam, delete, func, select, update

from storage.encryption import EnvelopeError, node_aad
from storage.schema import Conversation, ConversationNode, MessageNode, ModelRun
from storage.store_base import StoreBase

_CONVERSATIONS, _MEMBERS, _RUNS = Conversation.__table__, ConversationNode.__table__, ModelRun.__table__
_OPENING_OF = select(_CONVERSATIONS.c.opening_node_id).where(_CONVERSATIONS.c.id == bindparam("id"))
_MEMBERS_OF = select(_MEMBERS.c.node_id).where(_MEMBERS.c.conversation_id == bindparam("id"))
_READ_CHUNK = 500


class Conversations(StoreBase):
    def _touch_conversation(self, connection: Connection, tenant: str, conversation: str, now: datetime,
                            opening_node: str | None = None) -> None:
        """Record the conversation's activity, which retention counts from (storage/retention.py), and
        the node it is named by when it has none yet."""
        statement = self._ignoring_conflicts.get(Conversation)  # the cache of statements built once
        if statement is None:
            table = _CONVERSATIONS
            values = self._insert(table).values(id=bindparam("id"), tenant=bindparam("tenant"),
                                                created_at=bindparam("now"), last_active_at=bindparam("now"),
                                                collected=0, opening_node_id=bindparam("opening"),
                                                incarnation=bindparam("incarnation"))
            statement = self._ignoring_conflicts[Conversation] = values.on_conflict_do_update(
                index_elements=[table.c.id],
                set_={"last_active_at": values.excluded.last_active_at, "collected": 0,
                      "opening_node_id": func.coalesce(table.c.opening_node_id, values.excluded.opening_node_id)},
                where=table.c.last_active_at <= values.excluded.last_active_at,
            )
        self._execute(connection, statement, {"id": conversation, "tenant": tenant, "now": now, "opening": opening_node,
                                              "incarnation": secrets.randbits(62)})  # a row made anew: a new life

    def _adopt_first_run(self, connection: Connection, tenant: str, run_id: str, conversation: str) -> None:
        """Move run `run_id`, alone in the conversation of its own id, into `conversation`."""
        opening = connection.scalar(_OPENING_OF, {"id": run_id})
        self._touch_conversation(connection, tenant, conversation, self._now(), opening)  # its lock first
        nodes = list(connection.scalars(_MEMBERS_OF, {"id": run_id}))
        self._insert_ignoring_conflicts(connection, ConversationNode,
                                        [{"conversation_id": conversation, "node_id": n} for n in nodes])
        connection.execute(delete(_MEMBERS).where(_MEMBERS.c.conversation_id == run_id))
        # its tool results are counted again by the next capture (storage/artifact_members.py)
        connection.execute(update(_CONVERSATIONS).where(_CONVERSATIONS.c.id == conversation)
                           .values(artifact_members=None))
        connection.execute(update(_RUNS).where(_RUNS.c.id == run_id, _RUNS.c.tenant == tenant)
                           .values(conversation_id=conversation))
        connection.execute(update(_RUNS).where(_RUNS.c.parent_conversation_id == run_id, _RUNS.c.tenant == tenant)
                           .values(parent_conversation_id=conversation))
        connection.execute(delete(_CONVERSATIONS).where(_CONVERSATIONS.c.id == run_id,
                                                        _CONVERSATIONS.c.tenant == tenant))

    def conversation_openings(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        """The first user message of each conversation of `keys` ((tenant, conversation id) pairs) that is
        still there with its node, and readable (a message sealed under a key this process lacks is left
        out, as if gone): what the dashboard names it by."""
        wanted = set(keys)
        ids = sorted({conversation for _, conversation in wanted})
        nodes = MessageNode.__table__
        query = (select(_CONVERSATIONS.c.tenant, _CONVERSATIONS.c.id, nodes.c.id, nodes.c.message_json, nodes.c.key_id)
                 .join(nodes, (nodes.c.id == _CONVERSATIONS.c.opening_node_id)
                       & (nodes.c.tenant == _CONVERSATIONS.c.tenant))
                 .where(_CONVERSATIONS.c.id.in_(bindparam("ids", expanding=True))))
        found: dict[tuple[str, str], dict[str, Any]] = {}
        with self.engine.connect() as connection:
            for start in range(0, len(ids), _READ_CHUNK):
                for tenant, conversation, node, message_json, key_id in connection.execute(
                        query, {"ids": ids[start:start + _READ_CHUNK]}):
                    if (tenant, conversation) not in wanted:
                        continue
                    try:
                        text = self.encryption.open_text(message_json, node_aad(node), key_id)
                    except EnvelopeError:
                        continue
                    found[(tenant, conversation)] = json.loads(text or "{}")
        return found
