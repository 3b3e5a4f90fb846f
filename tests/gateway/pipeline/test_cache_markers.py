"""Cache markers go where the projection is stable, within Anthropic's four, on blocks that can hold them."""
from __future__ import annotations

from gateway.pipeline.cache_markers import MAX_MARKERS, place_markers
from gateway.pipeline.request_path import _stable_ends
from gateway.wire.anthropic_messages import from_neutral, to_neutral
from policies.assembly_types import Decision, Projection
from policies.presets import preset

THINKING = {"type": "thinking", "thinking": "hmm", "signature": "sig"}


def call(call_id: str) -> dict:
    return {"role": "assistant", "content": [THINKING, {"type": "tool_use", "id": call_id, "name": "Read",
                                                         "input": {"file_path": call_id}}]}


def result(call_id: str, text: str = "body", extra: list | None = None) -> dict:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text},
                                        *(extra or [])]}


MESSAGES = [{"role": "user", "content": "read them"}, call("a"), result("a"), call("b"),
            result("b", extra=[{"type": "text", "text": "and now?"}]), call("c"), result("c")]


def markers(body: dict) -> list[tuple]:
    out = [("system", i) for i, b in enumerate(body.get("system") or []) if b.get("cache_control")]
    for m, message in enumerate(body["messages"]):
        if isinstance(message["content"], list):
            out += [(m, b, block["type"]) for b, block in enumerate(message["content"]) if block.get("cache_control")]
    return out


def render(stable: list[int], system: list | None = None, tools: list | None = None) -> dict:
    neutral, _ = to_neutral(None, MESSAGES)
    rendered, spots = from_neutral(neutral, top_system=False)
    body = {"messages": rendered, **({"system": system} if system else {}), **({"tools": tools} if tools else {})}
    return place_markers(body, spots, stable)


def test_the_rendering_is_the_clients_transcript() -> None:
    neutral, _ = to_neutral(None, MESSAGES)
    rendered, _ = from_neutral(neutral, top_system=False)
    assert rendered == MESSAGES


def test_markers_after_the_stable_messages_most_needed_first() -> None:
    neutral, _ = to_neutral(None, MESSAGES)
    # neutral: user, asst(a), tool(a), asst(b), tool(b), user(text), asst(c), tool(c)
    end, previous, boundary = len(neutral) - 1, 5, 2
    body = render([end, previous, boundary])
    assert markers(body) == [(2, 0, "tool_result"), (4, 1, "text"), (6, 0, "tool_result")]


def test_the_clients_system_and_tool_markers_count_against_the_four() -> None:
    system = [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]
    tools = [{"name": "Read", "input_schema": {}, "cache_control": {"type": "ephemeral"}}]
    body = render([7, 5, 2], system=system, tools=tools)
    assert len(markers(body)) + 1 == MAX_MARKERS  # one tool marker, two system, one placed
    assert markers(body)[-1] == (6, 0, "tool_result")  # the end of the request first


def test_thinking_blocks_and_string_content() -> None:
    neutral, _ = to_neutral(None, MESSAGES)
    body = render([1, 0])  # the end of an assistant turn, then the opening user message
    # asst(a) ends with its tool_use (markable); the user's string became a marked text block
    assert markers(body) == [(0, 0, "text"), (1, 1, "tool_use")]
    assert body["messages"][0]["content"] == [{"type": "text", "text": "read them",
                                               "cache_control": {"type": "ephemeral"}}]
    only_thinking = [{"role": "user", "content": "q"}, {"role": "assistant", "content": [THINKING]}]
    neutral, _ = to_neutral(None, only_thinking)
    rendered, spots = from_neutral(neutral, top_system=False)
    body = place_markers({"messages": rendered}, spots, [1])
    assert markers(body) == [(0, 0, "text")]  # not on the thinking block: on the message before it


def _projection(messages: list[dict], next_move_from: int | None, due: bool) -> Projection:
    decisions = tuple(Decision(i, str(m["role"]), "verbatim", "kept") for i, m in enumerate(messages))
    return Projection(messages=messages, decisions=decisions, omissions={}, tokens_original=0, tokens_forwarded=0,
                      policy_name="t", policy_version="1", boundary_round=0, epoch_round=0,
                      next_move_from=next_move_from, next_move_due=due)


def test_a_due_move_leaves_what_it_rewrites_unmarked() -> None:
    """When the next request is expected to move from `next_move_from`, nothing after the message before it
    is marked (it would be written at the cache write price and never read), except the end of the
    previous request, which this request reads."""
    neutral, _ = to_neutral(None, MESSAGES)
    # neutral: user, asst(a), tool(a), asst(b), tool(b), user(text), asst(c), tool(c)
    policy = preset("coding-agent")
    end = len(neutral) - 1
    assert _stable_ends(policy, _projection(neutral, end, due=False), previous_end=5) == [end, end - 1, 5]
    assert _stable_ends(policy, _projection(neutral, end, due=True), previous_end=5) == [end - 1, 5]
    # a move foreseen further back: the previous request's end stays marked, the rest after the move goes
    assert _stable_ends(policy, _projection(neutral, 2, due=True), previous_end=5) == [1, 5]
    assert _stable_ends(policy, _projection(neutral, 2, due=False), previous_end=5) == [end, 1, end - 1, 5]
