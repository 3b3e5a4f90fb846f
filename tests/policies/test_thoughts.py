"""The prose an old assistant turn wrote beside its calls, cut to a note (policies/thoughts.py), in
every shape the formats carry it, and in the assembly: only in compacted rounds, counted, stable."""
from __future__ import annotations

import copy
import json

from policies.assembler import assemble
from policies.path_records import records_for_path
from policies.presets import preset
from policies.thoughts import compact_thought, thought_note, thought_text
from policies.tokens import DEFAULT_ENCODING
from policies.transcript import message_path
from tests.policies.test_assembler import BIG, policy, project, tool_round

THOUGHT = ("Now I need to look at the parser to see where the trailing comma is rejected, then check "
           "whether the test fixture covers nested arrays before I change anything in the grammar.")
THINKING = {"type": "thinking", "thinking": "private chain of thought", "signature": "EqQBCkYIBRgCsig=="}


def cut(content, min_tokens: int = 5):
    return compact_thought(content, min_tokens, DEFAULT_ENCODING)


def test_a_string_becomes_a_note_of_its_length() -> None:
    assert cut(THOUGHT) == (thought_note(len(THOUGHT)), len(THOUGHT))
    assert thought_note(len(THOUGHT)) == f"[earlier reasoning omitted: {len(THOUGHT)} chars]"


def test_short_blank_or_absent_prose_is_kept() -> None:
    assert cut("Let me look.", min_tokens=30) is None  # under the policy's threshold
    assert cut("ok", min_tokens=1) is None  # shorter than its own note
    assert cut("   \n  ", min_tokens=1) is None
    assert cut(None) is None and cut([]) is None
    assert cut([THINKING, {"type": "tool_use", "id": "t", "name": "Read", "input": {}}]) is None


def test_anthropic_blocks_keep_thinking_and_calls_byte_exact() -> None:
    call = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a.py"}}
    cited = {"type": "text", "text": "as the docs say", "citations": [{"type": "char_location"}]}
    marked = {"type": "text", "text": THOUGHT, "cache_control": {"type": "ephemeral"}}
    content = [THINKING, {"type": "text", "text": THOUGHT}, cited, marked, call]
    original = copy.deepcopy(content)
    out, chars = cut(content)
    assert chars == len(THOUGHT)  # only the plain block counts: cited and marked text is not plain
    assert out == [THINKING, {"type": "text", "text": thought_note(len(THOUGHT))}, cited, marked, call]
    assert content == original  # the client's blocks are not touched


def test_responses_message_items_keep_their_ids_and_reasoning_items_stay() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB..."}
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": THOUGHT[:90], "annotations": [{"type": "url_citation"}]},
                           {"type": "output_text", "text": THOUGHT[90:], "annotations": []}]}
    call = {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": "{}"}
    refusal = {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}
    out, chars = cut([reasoning, message, refusal, call])
    assert chars == len(THOUGHT)
    assert out[0] is reasoning and out[2] is refusal and out[3] is call
    assert out[1] == {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": thought_note(len(THOUGHT)), "annotations": []}]}


def test_gemini_parts_with_a_signature_are_not_plain_text() -> None:
    signed = {"type": "gemini_part", "part": {"text": THOUGHT, "thoughtSignature": "c2ln"}}
    call = {"type": "gemini_part", "part": {"functionCall": {"name": "read", "args": {}}}, "call_id": "c1"}
    assert cut([signed, call]) is None
    out, _ = cut([{"type": "text", "text": THOUGHT}, signed, call])
    assert out[1:] == [signed, call]


def test_thought_text_reads_every_shape() -> None:
    assert thought_text(THOUGHT) == THOUGHT
    assert thought_text([{"type": "text", "text": "a"}, THINKING, {"type": "text", "text": "b"}]) == "ab"
    assert thought_text([{"type": "message", "content": [{"type": "output_text", "text": "c"}]}]) == "c"


def thinking_round(call_id: str, thought: str | None) -> list[dict]:
    first, result = tool_round(call_id, "bash", f"run {call_id}\n{BIG}", command=f"make {call_id}")
    return [{**first, "content": thought}, result]


def test_old_rounds_lose_their_prose_and_the_latest_keeps_it() -> None:
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix it."}]
    for number in range(4):
        messages += thinking_round(f"c{number}", f"{THOUGHT} (step {number})")
    messages += [{"role": "assistant", "content": THOUGHT}, {"role": "user", "content": "go on"}]
    messages += thinking_round("c4", THOUGHT)
    projection, _ = project(messages, policy(compaction={"thought_min_tokens": 10}))
    old = [i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("tool_calls")][:-1]
    for index in old:
        chars = len(messages[index]["content"])
        assert projection.messages[index]["content"] == thought_note(chars)
        assert projection.messages[index]["tool_calls"] == messages[index]["tool_calls"]
        decision = projection.decisions[index]
        assert (decision.action, decision.artifact_id, decision.kept) == \
            ("thought_compacted", None, f"reasoning: {chars} chars omitted")
        assert decision.tokens_after < decision.tokens_before
    assert projection.omissions["assistant_thought"] == len(old)
    assert projection.messages[10] == messages[10]  # an answer without calls is not touched
    assert projection.messages[-2] == messages[-2]  # the latest round keeps its prose


def test_off_by_default_and_with_arguments_compacted_the_decision_names_the_arguments() -> None:
    long_file = "\n".join(f"def f{i}(): return {i}" for i in range(300))
    write = tool_round("w", "write_file", "written", path="m.py", content=long_file)
    write[0]["content"] = THOUGHT
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, *write,
                *thinking_round("c1", None), *thinking_round("c2", None)]
    plain, _ = project(messages, policy())
    assert plain.messages[2]["content"] == THOUGHT and "assistant_thought" not in plain.omissions
    both, _ = project(messages, policy(compaction={"thought_min_tokens": 10}))
    decision = both.decisions[2]
    assert decision.action == "arguments_compacted" and decision.artifact_id.startswith("args_")
    assert decision.kept == f"reasoning: {len(THOUGHT)} chars omitted"
    assert both.messages[2]["content"] == thought_note(len(THOUGHT))


def test_coding_agent_cuts_old_prose_and_each_request_renders_it_the_same() -> None:
    """Through the preset, request after request: a turn's note, once forwarded, is forwarded again
    byte for byte, and node ids (the decision reuse across requests) give the bytes the plain pass gives."""
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix it."}]
    pol, now, seen = preset("coding-agent"), 1000.0, {}
    for number in range(8):
        messages += thinking_round(f"c{number}", f"{THOUGHT} (step {number})")
        path = message_path("t", messages)
        records = records_for_path(path, now)
        reused = assemble(pol, messages, records, now, node_ids=[n.id for n in path])
        fresh = assemble(pol, copy.deepcopy(messages), records, now)
        assert json.dumps(reused.messages) == json.dumps(fresh.messages)
        for index, message in enumerate(reused.messages):
            if message["role"] == "assistant" and index in seen:
                assert seen[index] == message or seen[index]["content"] == messages[index]["content"]
            seen[index] = message
    cut_turns = [d for d in reused.decisions if d.action == "thought_compacted"]
    assert cut_turns and reused.omissions["assistant_thought"] == len(cut_turns)
