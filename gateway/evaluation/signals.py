"""A run's outcome signals, read from the traffic itself (no model is asked).

From the request: the tool results it brings (the tool messages after its last assistant message, the
answers to the previous answer's calls) and how many of them report an error
(`policies.tool_status.message_status`). From the answer as its client receives it (the gateway's hidden
rounds are not in it): how many calls it makes, how many of them repeat a call the conversation made
before (the same tool with the same arguments: the model asking again for something it could not see),
and whether it is a final answer (text, no calls). From the run: the artifacts put back raw in hidden
rounds. `gateway/evaluation/report.py` sums them per conversation and arm.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from gateway.evaluation.next_action import call_key, message_text, next_action
from policies.tool_status import message_status


def request_signals(messages: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The tool results the request brings, and how many report an error."""
    results = errors = 0
    for message in reversed(messages):
        role = message.get("role")
        if role == "assistant":
            break
        if role == "tool":
            results += 1
            errors += message_status(dict(message), message_text(message)) == "error"
    return {"tool_results": results, "tool_errors": errors}


def answer_signals(messages: Sequence[Mapping[str, Any]], answer: Mapping[str, Any] | None) -> dict[str, Any]:
    """The answer's calls, how many repeat an earlier call of the conversation, whether it is final."""
    action = next_action(answer)
    repeated = 0
    if action.calls:
        names = {name for name, _ in action.calls}
        earlier = {call_key(function.get("name"), function.get("arguments"))
                   for message in messages if message.get("role") == "assistant"
                   for call in message.get("tool_calls") or () if isinstance(call, Mapping)
                   for function in (call.get("function"),)
                   if isinstance(function, Mapping) and function.get("name") in names}
        repeated = sum(1 for key in action.calls if key in earlier)
    return {"answer_calls": len(action.calls), "repeated_calls": repeated, "final_answer": action.kind == "answer"}


def run_signals(messages: Sequence[Mapping[str, Any]], answer: Mapping[str, Any] | None,
                rehydrations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every signal of one answered run."""
    put_back = sum(1 for decision in rehydrations if decision.get("action") == "rehydrated")
    return {**request_signals(messages), **answer_signals(messages, answer), "rehydrations": put_back}
