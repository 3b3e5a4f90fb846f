"""The reader's client (testkit/reader_client.py) in every wire format, JSON or streamed.

`run_in(name, url, workload, stream=...)` plays the client of one conversation against a gateway's
`url` in Chat Completions, Responses, Anthropic Messages or Gemini: it sends the conversation, reads
the answer (the whole JSON body, or the stream's events as a client's SDK folds them: text deltas,
tool calls, no final object taken on trust), runs the `read_file` calls from the workload's files,
and loops until a turn without calls. Every turn is kept (its text, its calls, the gateway's request
id), so a test can check that none came back empty and look up each run's record.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator

import httpx

from testkit.reader_client import READ_TOOL, Workload

SYSTEM = "You read files and report facts."
_PARAMETERS = READ_TOOL["function"]["parameters"]


@dataclass
class Turn:
    text: str
    calls: list[tuple[str, str, dict[str, Any]]]  # (id, name, arguments)
    request_id: str = ""

    @property
    def empty(self) -> bool:
        return not self.text.strip() and not self.calls


@dataclass
class FormatConversation:
    history: list[dict[str, Any]]
    turns: list[Turn] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    answer: str | None = None


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream's `data:` lines."""
    for line in response.iter_lines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            yield json.loads(line[5:])


class Chat:
    name = "chat"

    def start(self, task: str) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]

    def request(self, model: str, history: list[dict[str, Any]], stream: bool) -> tuple[str, dict[str, Any]]:
        return "/v1/chat/completions", {"model": model, "messages": history, "tools": [READ_TOOL], "stream": stream}

    def read(self, body: dict[str, Any]) -> Turn:
        message = body["choices"][0]["message"]
        calls = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in message.get("tool_calls") or []]
        return Turn(message.get("content") or "", calls)

    def read_stream(self, response: httpx.Response) -> Turn:
        text, calls = "", {}
        for chunk in _events(response):
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                text += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    slot = calls.setdefault(call.get("index", 0), {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.get("id") or slot["id"]
                    slot["name"] += (call.get("function") or {}).get("name") or ""
                    slot["arguments"] += (call.get("function") or {}).get("arguments") or ""
        return Turn(text, [(c["id"], c["name"], json.loads(c["arguments"] or "{}")) for _, c in sorted(calls.items())])

    def append(self, history: list[dict[str, Any]], turn: Turn, results: list[str]) -> None:
        calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                 for i, n, a in turn.calls]
        history.append({"role": "assistant", "content": turn.text or None, "tool_calls": calls})
        history += [{"role": "tool", "tool_call_id": i, "content": r} for (i, _, _), r in zip(turn.calls, results)]


class Responses:
    name = "responses"

    def start(self, task: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task}]

    def request(self, model: str, history: list[dict[str, Any]], stream: bool) -> tuple[str, dict[str, Any]]:
        tool = {"type": "function", "name": "read_file", "parameters": _PARAMETERS}
        return "/v1/responses", {"model": model, "instructions": SYSTEM, "input": history, "tools": [tool],
                                 "stream": stream}

    def read(self, body: dict[str, Any]) -> Turn:
        text = "".join(part.get("text") or "" for item in body["output"] if item.get("type") == "message"
                       for part in item.get("content") or [])
        return Turn(text, [(i["call_id"], i["name"], json.loads(i["arguments"])) for i in body["output"]
                           if i.get("type") == "function_call"])

    def read_stream(self, response: httpx.Response) -> Turn:
        text, calls = "", []
        for event in _events(response):
            if event["type"] == "response.output_text.delta":
                text += event["delta"]
            elif event["type"] == "response.output_item.done" and event["item"].get("type") == "function_call":
                item = event["item"]
                calls.append((item["call_id"], item["name"], json.loads(item["arguments"])))
        return Turn(text, calls)

    def append(self, history: list[dict[str, Any]], turn: Turn, results: list[str]) -> None:
        if turn.text:
            history.append({"type": "message", "role": "assistant",
                            "content": [{"type": "output_text", "text": turn.text}]})
        for (call_id, name, arguments), result in zip(turn.calls, results):
            history += [{"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)},
                        {"type": "function_call_output", "call_id": call_id, "output": result}]


class Messages:
    name = "anthropic"

    def start(self, task: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": task}]

    def request(self, model: str, history: list[dict[str, Any]], stream: bool) -> tuple[str, dict[str, Any]]:
        tool = {"name": "read_file", "description": "Read a file of the workspace", "input_schema": _PARAMETERS}
        return "/v1/messages", {"model": model, "max_tokens": 1024, "system": SYSTEM, "messages": history,
                                "tools": [tool], "stream": stream}

    def read(self, body: dict[str, Any]) -> Turn:
        blocks = body["content"]
        return Turn("".join(b.get("text") or "" for b in blocks if b["type"] == "text"),
                    [(b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"])

    def read_stream(self, response: httpx.Response) -> Turn:
        blocks: dict[int, dict[str, Any]] = {}
        for event in _events(response):
            if event["type"] == "content_block_start":
                blocks[event["index"]] = {**event["content_block"], "json": ""}
            elif event["type"] == "content_block_delta":
                block, delta = blocks[event["index"]], event["delta"]
                block["text"] = block.get("text", "") + delta.get("text", "")
                block["json"] += delta.get("partial_json", "")
        ordered = [blocks[i] for i in sorted(blocks)]
        return Turn("".join(b.get("text") or "" for b in ordered if b["type"] == "text"),
                    [(b["id"], b["name"], json.loads(b["json"] or "{}")) for b in ordered if b["type"] == "tool_use"])

    def append(self, history: list[dict[str, Any]], turn: Turn, results: list[str]) -> None:
        said = [{"type": "text", "text": turn.text}] if turn.text else []
        history.append({"role": "assistant", "content": said + [
            {"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in turn.calls]})
        history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": r}
                                                     for (i, _, _), r in zip(turn.calls, results)]})


class Gemini:
    name = "gemini"

    def start(self, task: str) -> list[dict[str, Any]]:
        return [{"role": "user", "parts": [{"text": task}]}]

    def request(self, model: str, history: list[dict[str, Any]], stream: bool) -> tuple[str, dict[str, Any]]:
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        tools = [{"functionDeclarations": [{"name": "read_file", "parametersJsonSchema": _PARAMETERS}]}]
        return f"/v1beta/models/{model}:{method}", {"contents": history, "tools": tools,
                                                     "systemInstruction": {"parts": [{"text": SYSTEM}]}}

    def _turn(self, parts: list[dict[str, Any]]) -> Turn:
        calls = [(f"g{n}", p["functionCall"]["name"], p["functionCall"].get("args") or {})
                 for n, p in enumerate(parts) if "functionCall" in p]
        return Turn("".join(p.get("text") or "" for p in parts if not p.get("thought")), calls)

    def read(self, body: dict[str, Any]) -> Turn:
        return self._turn(body["candidates"][0]["content"]["parts"])

    def read_stream(self, response: httpx.Response) -> Turn:
        return self._turn([p for chunk in _events(response) for c in chunk.get("candidates") or []
                           for p in (c.get("content") or {}).get("parts") or []])

    def append(self, history: list[dict[str, Any]], turn: Turn, results: list[str]) -> None:
        said = [{"text": turn.text}] if turn.text else []
        history.append({"role": "model", "parts": said + [{"functionCall": {"name": n, "args": a}}
                                                          for _, n, a in turn.calls]})
        history.append({"role": "user", "parts": [{"functionResponse": {"name": n, "response": {"output": r}}}
                                                  for (_, n, _), r in zip(turn.calls, results)]})


FORMATS = {f.name: f for f in (Chat(), Responses(), Messages(), Gemini())}
KEY_HEADERS = {"chat": "authorization", "responses": "authorization", "anthropic": "x-api-key",
               "gemini": "x-goog-api-key"}


def run_in(name: str, url: str, workload: Workload, *, stream: bool, key: str, model: str,
           max_turns: int = 16) -> FormatConversation:
    """Play the client of one conversation in format `name` against the gateway at `url`."""
    form = FORMATS[name]
    header = KEY_HEADERS[name]
    headers = {header: f"Bearer {key}" if header == "authorization" else key, "anthropic-version": "2023-06-01"}
    conversation = FormatConversation(history=form.start(workload.task))
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        for _ in range(max_turns):
            path, body = form.request(model, conversation.history, stream)
            if stream:
                with client.stream("POST", path, json=body) as response:
                    assert response.status_code == 200, response.read()
                    turn = form.read_stream(response)
            else:
                response = client.post(path, json=body)
                assert response.status_code == 200, response.text
                turn = form.read(response.json())
            turn.request_id = response.headers.get("x-gateway-request-id", "")
            conversation.turns.append(turn)
            if not turn.calls:
                conversation.answer = turn.text
                break
            form.append(conversation.history, turn, [_run(call, workload, conversation) for call in turn.calls])
    return conversation


def _run(call: tuple[str, str, dict[str, Any]], workload: Workload, conversation: FormatConversation) -> str:
    _, name, arguments = call
    if name != "read_file":
        return f"error: no tool {name!r}"
    conversation.reads.append(str(arguments.get("path")))
    return workload.files.get(str(arguments.get("path")), f"error: no file {arguments.get('path')!r}")
