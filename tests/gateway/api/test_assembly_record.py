"""A fresh assembly's record holds the assembler's decisions as they are (`AssemblyRecord.decided`) and makes
dicts of the notable ones only; what it stores, what its readers see and what the metrics count are what the
dict per message gave (the reference below is the computation it replaced). A trace replayed request by
request through the gateway's own code, on a real store, with rehydrations answered by the Rehydrator."""
from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

from prometheus_client.parser import text_string_to_metric_families

from gateway.commands.replay import trace_turns
from gateway.config import ModelSettings
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.tracing import OFF
from gateway.pipeline.assembly_bases import RecentAssemblies
from gateway.pipeline.rehydration import Rehydrator
from gateway.pipeline.request_path import _capture_and_project
from gateway.pipeline.run_recorder import RunRecorder
from gateway.wire.openai_chat import OpenAIChat
from policies.canonical import NodeIds
from policies.presets import preset
from storage.assembly_record import AssemblyRecord, _same_decision, stored_decisions
from storage.record_types import RunOutcome, RunStart
from testkit.gateway import load_trace, make_store

TRACE = Path(__file__).resolve().parents[2] / "data" / "traces" / "openhands_codeact_llama4-maverick_ponyc-4588.jsonl"
MODEL = ModelSettings(name="fake", litellm_params={"model": "openai/fake", "api_base": "http://127.0.0.1:9"})


class _Unused:
    def observe_run(self, *args: Any) -> None:
        raise AssertionError("the test observes the runs itself")


def reference_notable(decisions: list[dict[str, Any]], record: AssemblyRecord) -> dict[int, dict[str, Any]]:
    """`_notable` as it was, over one dict per message (then the rehydrations)."""
    base = record.base_decisions if record.base_request_id is not None else None
    out = {}
    for decision in decisions:
        index = decision.get("index")
        if index is None or decision.get("action") == "verbatim":
            continue
        if index in record.forwarded:
            decision = {**decision, "forwarded": record.forwarded[index][1]}
        if base is not None:
            held = base.get(index)
            if held is not None and held == decision:
                decision = held
        out[index] = decision
    return out


def reference_stored(decisions: list[dict[str, Any]], notable: Mapping[int, dict[str, Any]],
                     record: AssemblyRecord) -> list[dict[str, Any]]:
    """`stored_decisions` as it was, over one dict per message (then the rehydrations)."""
    base = record.base_decisions if record.base_request_id is not None else None
    if base is None:
        out = list(notable.values())
    else:
        out = [d for i, d in notable.items() if not _same_decision(base.get(i), d)]
        out += [{"index": i, "role": d.get("role"), "action": "verbatim", "reason": "kept", "artifact_id": None}
                for i, d in base.items() if i not in notable]
    return sorted(out, key=lambda d: d["index"]) + [d for d in decisions if d.get("index") is None]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": "gw_1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_fresh_records_read_store_and_count_as_one_dict_per_message_did(tmp_path: Path) -> None:
    store = make_store(f"sqlite:///{tmp_path}/gateway.db", tmp_path / "blobs")
    policy = preset("coding-agent")
    services = SimpleNamespace(node_ids=NodeIds(), tracing=OFF, clock=time.time)
    recent, metrics, wire = RecentAssemblies(), GatewayMetrics(), OpenAIChat()
    trace = load_trace(TRACE)
    messages, turns = trace_turns(trace)
    bodies = [messages[:end] for end in turns]
    counted: Counter[str] = Counter()  # the rehydrations the metrics counted before: a walk of every decision
    seen = {"based": 0, "rehydrated": 0, "refused": 0, "named_by_user": 0}
    named = None
    for number in range(len(bodies) + 1):
        if number == len(bodies):  # at last the user names a compacted result: the assembler brings it back
            assert named is not None
            body = bodies[-1] + [messages[turns[-1]], {"role": "user", "content": f"Show artifact:{named} again."}]
        else:
            body = bodies[number]
        neutral = wire.parse(json.dumps({"model": "fake", "messages": body, "tools": trace["tools"]}).encode())
        run = RunStart(request_id=f"req_{number:04d}", tenant="acme", participant="agent", model="fake",
                       upstream_model="openai/fake", stream=False, redact=policy.redaction.on_capture)
        recorder = RunRecorder(store, _Unused(), run, {}, recent)  # type: ignore[arg-type]
        prepared = _capture_and_project(services, recorder, policy, MODEL, "acme", neutral, wire)  # type: ignore[arg-type]
        ingest, projection, records, record = prepared.ingest, prepared.projection, prepared.records, prepared.record
        assembly = recent.based(record, ingest.previous_request_id)
        seen["based"] += assembly.base_request_id is not None
        compacted = [d.artifact_id for d in projection.decisions if d.action == "compacted"]
        named = compacted[0] if compacted else named
        answers: list[dict[str, Any]] = []
        if compacted and number % 4 == 0:  # the model asks for a memory's bytes, and for one that is not there
            rehydrator = Rehydrator(policy=policy, records=records, store=store, tenant="acme", participant="agent",
                                    provider="openai", rehydrations=assembly.rehydrations)
            rehydrator.rounds = 1
            rehydrator.answer(call(rehydrator.name, artifact_id=compacted[-1], lines="1-2"))
            rehydrator.rounds = 2
            rehydrator.answer(call(rehydrator.name, artifact_id="art_0123456789abcdef"))
            given = assembly.rehydrations[0]["tokens_after"]
            answers = [{"index": None, "role": "tool", "action": "rehydrated", "reason": "model_request",
                        "artifact_id": compacted[-1], "round": 1, "tokens_after": given, "lines": [1, 2]},
                       {"index": None, "role": "tool", "action": "rehydration_refused", "reason": "not_found",
                        "artifact_id": "art_0123456789abcdef", "round": 2}]
            seen["rehydrated"] += 1
            seen["refused"] += 1
        seen["named_by_user"] += any(d.reason == "named_by_user" for d in projection.decisions)

        # (a) its readers see one dict per message, then the rehydrations, as before
        old = [d.as_dict() for d in projection.decisions] + answers
        assert assembly.decisions == old
        assert assembly.rehydrations == answers
        assert assembly.as_dict()["decisions"] == old
        assert assembly.as_dict()["rehydrations"] == sum(d["action"] == "rehydrated" for d in old)
        # (b) what it stores is what the dicts gave, byte for byte
        notable = reference_notable(old, assembly)
        assert json.dumps(list(assembly.notable.items())) == json.dumps(list(notable.items()))
        assert all(assembly.notable[i] is d for i, d in notable.items() if d is (assembly.base_decisions or {}).get(i))
        stored = json.dumps(stored_decisions(assembly), separators=(",", ":"))
        assert stored == json.dumps(reference_stored(old, notable, assembly), separators=(",", ":"))

        outcome = RunOutcome(status="ok", latency_ms=1.0, http_status=200, tokens_original=1, tokens_forwarded=1)
        store.finish_run(run.request_id, outcome, assembly)
        metrics.observe_run("acme", "fake", outcome, assembly)
        recent.remember(run.request_id, assembly)
        counted.update(d["action"] for d in old if d["action"] in ("rehydrated", "rehydration_refused"))

        with sqlite3.connect(tmp_path / "gateway.db") as connection:
            (row,) = connection.execute("SELECT decisions_json FROM context_assemblies WHERE request_id = ?",
                                        (run.request_id,)).fetchone()
        assert row == stored
        # (c) the Rehydrator's answers are stored, after the per-message decisions, and read back
        assert [d for d in json.loads(row) if d["index"] is None] == answers
        read_back = store.get_run(run.request_id, "acme")
        assert read_back is not None and read_back.assembly is not None
        assert read_back.assembly.rehydrations == answers
        assert read_back.assembly.notable == assembly.notable  # from its row and its bases'
        assert [(d["index"], d["action"], d["reason"]) for d in read_back.assembly.decisions] == [
            (d["index"], d["action"], d["reason"]) for d in old]
    store.engine.dispose()

    assert seen["based"] > len(bodies) // 2 and seen["rehydrated"] >= 5 and seen["named_by_user"] == 1
    # (c) and the metrics count them (and the message the user named) as the walk of every decision did
    samples = {sample.labels["outcome"]: sample.value
               for family in text_string_to_metric_families(metrics.render().decode())
               for sample in family.samples if sample.name == "gateway_rehydrations_total"}
    assert samples == {action: float(n) for action, n in counted.items()}
    assert counted == {"rehydrated": seen["rehydrated"] + seen["named_by_user"], "rehydration_refused": seen["refused"]}
