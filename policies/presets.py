"""The built-in policy presets a tenant may name instead of a policy file."""
from __future__ import annotations

from policies.policy import Policy, policy_from_mapping

_CODE_READERS = ["read_file", "view_file", "open", "open_file", "cat", "view", "str_replace_editor",
                 "edit", "edit_file", "create", "create_file", "write_file", "str_replace_based_edit_tool"]

_PRESETS: dict[str, dict] = {
    "passthrough": {
        "name": "passthrough",
        "version": 1,
        "description": "Forward the transcript unchanged; capture and record only.",
        "enabled": False,
    },
    "default": {
        "name": "default",
        "version": 1,
        "description": "General tool-using agents: old large tool results become memories in cache-stable epochs.",
        "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 500, "clear_at_least_tokens": 200,
                       "min_tokens": 200, "argument_min_tokens": 200, "head_chars": 100, "tail_chars": 60,
                       "salient_chars": 80, "horizon": 3.0},
    },
    "coding-agent": {
        "name": "coding-agent",
        "version": 1,
        "description": "Coding agents: file reads superseded by later reads of the same path, "
                       "command output compacted to head and tail.",
        # Measured with `gateway replay --policy coding-agent` on the shared traces: every
        # round is compacted once, as it stops being the latest, when that pays under
        # the cache price model (no minimum tail or saving: a move that pays is made at
        # once, since waiting only leaves more to re-send); results under 200 tokens stay
        # whole (their memory saves too little to pay for a re-send in a short session);
        # memories are short, a small result's shorter still (the raw bytes stay one call away);
        # the prose a turn wrote beside its calls goes with its round, as a note of its length.
        "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0, "clear_at_least_tokens": 0,
                       "min_tokens": 200, "argument_min_tokens": 120, "thought_min_tokens": 30, "head_chars": 100,
                       "tail_chars": 60, "salient_chars": 80, "excerpt_share": 0.05, "horizon": 3.0},
        "tools": [
            {"match": _CODE_READERS, "freshness": "session", "supersede_on": "arguments.path"},
            {"match": ["find", "find_file", "ls", "list_files", "search_dir", "search_file", "grep"],
             "freshness": "session", "extractor": "auto"},
        ],
    },
}

PRESET_NAMES = tuple(_PRESETS)


def preset(name: str) -> Policy:
    return policy_from_mapping(_PRESETS[name], f"preset:{name}")
