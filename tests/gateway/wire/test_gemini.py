"""The Gemini wire format (gateway/wire/gemini.py): Gemini CLI's requests in, the projection out.

The request is Gemini CLI 0.61.0's own shape (recorded against a local server: parts with
`functionCall` ids and `thoughtSignature`s, results as `{"output": text}`); a round trip
through the neutral transcript gives back the same `contents`; a compacted result goes out
as a functionResponse holding the memory; calls and responses without ids pair by order.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.wire.gemini import GEMINI, error_body, from_neutral, run_usage
from policies.transcript import tool_result_bytes

SYSTEM = {"parts": [{"text": "You are a CLI agent."}], "role": "user"}
TOOLS = [{"functionDeclarations": [{"name": "read_file", "description": "Reads a file",
                                    "parametersJsonSchema": {"type": "object",
                                                             "properties": {"file_path": {"type": "string"}},
                                                             "required": ["file_path"]}}]}]


def cli_body() -> dict:
    return {
        "contents": [
            {"role": "user", "parts": [{"text": "<session_context>...</session_context>"}, {"text": "read the files"}]},
            {"role": "model", "parts": [{"functionCall": {"id": "read_file_1_0", "args": {"file_path": "/ws/a.txt"},
                                                          "name": "read_file"}, "thoughtSignature": "c2lnLW9uZQ=="}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "read_file",
                                                             "response": {"output": "Alpha file.\n"},
                                                             "id": "read_file_1_0"}}]},
            {"role": "model", "parts": [{"text": "I'll read both."},
                                        {"functionCall": {"id": "c1", "args": {"file_path": "/ws/b.py"},
                                                          "name": "read_file"},
                                         "thoughtSignature": "skip_thought_signature_validator"},
                                        {"functionCall": {"id": "c2", "args": {"file_path": "/ws/c.md"},
                                                          "name": "read_file"}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": "def b(): ..."},
                                                             "id": "c1"}},
                                       {"functionResponse": {"name": "read_file",
                                                             "response": {"error": "no such file"}, "id": "c2"}}]},
        ],
        "systemInstruction": SYSTEM,
        "tools": TOOLS,
        "generationConfig": {"temperature": 1, "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 8192}},
    }


def parse(body: dict, stream: bool = True):
    return GEMINI.call("gemini-2.5-flash", stream, True).parse(json.dumps(body).encode())


def test_the_cli_request_becomes_the_neutral_transcript() -> None:
    neutral = parse(cli_body())
    assert neutral.model == "gemini-2.5-flash" and neutral.stream
    roles = [m["role"] for m in neutral.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "tool"]
    assert neutral.messages[0]["content"] == "You are a CLI agent."
    assert neutral.messages[2]["tool_calls"] == [
        {"id": "read_file_1_0", "type": "function",
         "function": {"name": "read_file", "arguments": '{"file_path": "/ws/a.txt"}'}}]
    first, failed = neutral.messages[3], neutral.messages[6]
    assert first["tool_call_id"] == "read_file_1_0" and first["content"] == "Alpha file.\n"
    assert tool_result_bytes(first["content"])[0] == b"Alpha file.\n"  # the artifact: the tool's text, exactly
    assert failed["is_error"] is True and failed["content"] == "no such file"
    assert "contents" not in neutral.params and neutral.params["systemInstruction"] == SYSTEM
    assert neutral.tools == TOOLS


def test_an_unchanged_projection_renders_the_same_contents() -> None:
    body = cli_body()
    neutral = parse(body)
    out = GEMINI.upstream_body(neutral, neutral.messages)
    assert out["contents"] == body["contents"]  # thought signatures, ids, key order of the parts' data
    assert {k: v for k, v in out.items() if k != "contents"} == {k: v for k, v in body.items() if k != "contents"}


def test_a_compacted_result_and_compacted_arguments_go_out_in_gemini_shape() -> None:
    neutral = parse(cli_body())
    messages = [dict(m) for m in neutral.messages]
    messages[3] = {**messages[3], "content": "[memory of artifact:abc] a.txt: 1 line"}
    call = messages[4]["tool_calls"][0]
    messages[4] = {**messages[4], "tool_calls": [{**call, "function": {**call["function"],
                                                                        "arguments": '{"file_path": "[elided]"}'}},
                                                 messages[4]["tool_calls"][1]]}
    contents = GEMINI.upstream_body(neutral, messages)["contents"]
    assert contents[2]["parts"] == [{"functionResponse": {"name": "read_file",
                                                          "response": {"output": "[memory of artifact:abc] a.txt: 1 line"},
                                                          "id": "read_file_1_0"}}]
    changed = contents[3]["parts"][1]
    assert changed["functionCall"]["args"] == {"file_path": "[elided]"} and changed["functionCall"]["id"] == "c1"
    assert changed["thoughtSignature"] == "skip_thought_signature_validator"  # the part's other fields stay
    assert contents[3]["parts"][2] == cli_body()["contents"][3]["parts"][2]


def test_calls_without_ids_pair_by_order_and_go_back_without_ids() -> None:
    body = {"contents": [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {}}},
                                    {"functionCall": {"name": "cat", "args": {"p": "x"}}},
                                    {"functionCall": {"name": "ls", "args": {"d": "/"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {"output": "one"}}},
                                   {"functionResponse": {"name": "cat", "response": {"output": "two"}}},
                                   {"functionResponse": {"name": "ls", "response": {"output": "three"}}}]},
    ]}
    neutral = parse(body)
    calls = neutral.messages[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["gemini-call-1-0", "gemini-call-1-1", "gemini-call-1-2"]
    assert [(m["tool_call_id"], m["content"]) for m in neutral.messages[2:]] == [
        ("gemini-call-1-0", "one"), ("gemini-call-1-1", "two"), ("gemini-call-1-2", "three")]
    assert GEMINI.upstream_body(neutral, neutral.messages)["contents"] == body["contents"]


def test_a_response_of_another_shape_is_kept_as_its_json() -> None:
    response = {"name": "search", "response": {"hits": [1, 2], "more": False}, "id": "s1", "willContinue": False}
    body = {"contents": [{"role": "user", "parts": [{"text": "q"}]},
                         {"role": "model", "parts": [{"functionCall": {"name": "search", "id": "s1"}}]},
                         {"role": "user", "parts": [{"functionResponse": response}]}]}
    neutral = parse(body)
    assert json.loads(neutral.messages[2]["content"]) == {"response": {"hits": [1, 2], "more": False},
                                                          "willContinue": False}
    assert GEMINI.upstream_body(neutral, neutral.messages)["contents"][2]["parts"] == [{"functionResponse": response}]


@pytest.mark.parametrize(("body", "param"), [
    ({}, "contents"),
    ({"contents": []}, "contents"),
    ({"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}, "contents[0].role"),
    ({"contents": [{"role": "user", "parts": []}]}, "contents[0].parts"),
    ({"contents": [{"role": "user", "parts": [{"text": 3}]}]}, "contents[0].parts[0].text"),
    ({"contents": [{"role": "user", "parts": [{"text": "a", "inlineData": {}}]}]}, "contents[0].parts[0]"),
    ({"contents": [{"role": "user", "parts": [{"functionCall": {"name": "x"}}]}]}, "contents[0].parts[0]"),
    ({"contents": [{"role": "model", "parts": [{"functionCall": {"name": ""}}]}]}, "contents[0].parts[0].functionCall.name"),
    ({"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "id": "gemini-call-1"}}]}]},
     "contents[0].parts[0].functionCall.id"),
    ({"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}, "id": "nope"}}]}]},
     "contents[0].parts[0]"),
    ({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "generationConfig": []}, "generationConfig"),
    ({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "systemInstruction": {"parts": "x"}},
     "systemInstruction.parts"),
])
def test_bad_requests_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse(body)
    assert raised.value.param == param, raised.value.message


def test_errors_are_googles_shape() -> None:
    error = InvalidRequest("contents: a non-empty list", param="contents", code="invalid_value")
    assert error_body(error) == {"error": {"code": 400, "message": "contents: a non-empty list",
                                           "status": "INVALID_ARGUMENT",
                                           "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                                        "reason": "invalid_value", "domain": "context-gateway"},
                                                       {"@type": "type.googleapis.com/google.rpc.BadRequest",
                                                        "fieldViolations": [{"field": "contents",
                                                                             "description": "contents: a non-empty list"}]}]}}


def test_usage_is_recorded_in_chats_shape_with_the_cached_tokens() -> None:
    usage = {"promptTokenCount": 1000, "candidatesTokenCount": 20, "thoughtsTokenCount": 30, "totalTokenCount": 1050,
             "cachedContentTokenCount": 800}
    assert run_usage(usage) == {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050,
                                "prompt_tokens_details": {"cached_tokens": 800}}


def test_count_tokens_takes_a_whole_generate_content_request() -> None:
    wrapped = {"generateContentRequest": {"contents": cli_body()["contents"], "model": "models/x"}}
    neutral = GEMINI.call("m", False, True).parse_count(json.dumps(wrapped).encode())
    assert len(neutral.messages) == 6


_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
_part = st.one_of(st.builds(lambda t: {"text": t}, _text),
                  st.builds(lambda t, s: {"text": t, "thought": True, "thoughtSignature": s}, _text, _text),
                  st.builds(lambda d: {"inlineData": {"mimeType": "image/png", "data": d}}, _text))


@st.composite
def transcripts(draw: st.DrawFn) -> dict:
    contents = [{"role": "user", "parts": draw(st.lists(_part, min_size=1, max_size=3))}]
    for turn in range(draw(st.integers(0, 4))):
        names = draw(st.lists(st.sampled_from(["ls", "cat", "grep"]), min_size=0, max_size=3))
        with_ids = draw(st.booleans())
        calls = [{"functionCall": {"name": n, "args": {"n": i}, **({"id": f"t{turn}-{i}"} if with_ids else {})}}
                 for i, n in enumerate(names)]
        contents.append({"role": "model", "parts": draw(st.lists(_part, max_size=2)) + calls or [{"text": "ok"}]})
        if calls:
            contents.append({"role": "user", "parts": [
                {"functionResponse": {"name": n, "response": {"output": draw(_text)},
                                      **({"id": f"t{turn}-{i}"} if with_ids else {})}} for i, n in enumerate(names)]})
        contents.append({"role": "user", "parts": draw(st.lists(_part, min_size=1, max_size=2))})
    return {"contents": contents}


@settings(max_examples=150, deadline=None)
@given(transcripts())
def test_every_valid_transcript_renders_back_as_it_came(body: dict) -> None:
    """Parsing and rendering without a change gives the client's contents back (merging only a user turn
    that follows function responses into their turn, as Gemini itself reads them)."""
    neutral = parse(body)
    rendered = from_neutral(neutral.messages, top_system=False)
    merged: list[dict] = []
    for content in body["contents"]:
        responses_only = merged and merged[-1]["role"] == "user" and all(
            "functionResponse" in p for p in merged[-1]["parts"])
        if content["role"] == "user" and responses_only:
            merged[-1] = {"role": "user", "parts": merged[-1]["parts"] + content["parts"]}
        else:
            merged.append(content)
    assert rendered == merged
