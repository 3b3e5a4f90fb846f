"""Which arm a conversation is in: projected, or held out (forwarded as its client sent it).

The arm is a stable hash of the conversation against the policy's `evaluation.holdout_share`, so a
conversation stays in one arm for its whole life, on every replica, without a lookup. A conversation is
named here by what every request of it carries from the first on: its session label when it has one,
else its opening (the node of the last message before the model's first answer, which names the whole
transcript up to it). The held-out arm is projected under the same policy with the projection turned
off (`Policy.held_out`): captured and recorded as usual, forwarded as sent, no gateway tool, no cache
markers of the gateway's.

The same hash, salted otherwise, picks the requests that get a shadow comparison
(gateway/evaluation/shadows.py).
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from policies.policy import Policy
from policies.transcript import PathNode, label_conversation_id

PROJECTED, HOLDOUT = "projected", "holdout"
ARMS = (PROJECTED, HOLDOUT)
_CONTEXT_ROLES = ("system", "developer")


def share_point(salt: str, key: str) -> float:
    """Where `key` falls in [0, 1), uniformly and the same everywhere."""
    digest = hashlib.blake2b(f"{salt}\x00{key}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2 ** 64


def conversation_key(tenant: str, label: str | None, path: Sequence[PathNode], request_id: str) -> str:
    """What names a conversation from its first request on: its label, else its opening's node."""
    if label:
        return label_conversation_id(tenant, label)
    opened = False
    last = None
    for node in path:
        role = node.message.get("role")
        if opened and role == "assistant":
            break
        opened = opened or role not in _CONTEXT_ROLES
        last = node.id
    return last or request_id


def arm_for(policy: Policy, tenant: str, label: str | None, path: Sequence[PathNode], request_id: str) -> str:
    share = policy.evaluation.holdout_share
    if share <= 0:
        return PROJECTED
    key = conversation_key(tenant, label, path, request_id)
    return HOLDOUT if share_point(f"holdout:{tenant}", key) < share else PROJECTED


def shadowed(policy: Policy, request_id: str) -> bool:
    """Whether a projected request gets a shadow comparison."""
    share = policy.evaluation.shadow_share
    return share > 0 and share_point("shadow", request_id) < share


def arm_policy(policy: Policy, arm: str) -> Policy:
    """The policy a request of `arm` is projected under (the held-out arm's is `Policy.held_out`)."""
    return policy.held_out if arm == HOLDOUT else policy
