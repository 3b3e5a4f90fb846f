"""Ids that cross a boundary are checked: no tenant can reach or influence another's records."""
from __future__ import annotations

import json

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.schema import ModelRun
from testkit.gateway import OTHER_TENANT_KEY, RunningGateway
from tests.gateway.pipeline.test_rehydration import FILLER, TOOLS, call, result, send

RAW_ROWS = "raw rows: customer 4411 card 4242-XXXX\n" + FILLER


def runs_of(gateway: RunningGateway, tenant: str) -> int:
    with Session(gateway.store.engine) as session:
        return int(session.scalar(select(func.count()).select_from(ModelRun).where(ModelRun.tenant == tenant)))


def post(gateway: RunningGateway, messages: list[dict], key: str, **headers: str):
    with gateway.client(key=key) as http:
        return http.post("/v1/chat/completions", headers=headers,
                         json={"model": "fake", "messages": messages, "tools": TOOLS})


def test_another_tenants_request_is_no_parent(rehydration_gateway: RunningGateway) -> None:
    gateway = rehydration_gateway
    acme_messages = [{"role": "system", "content": "You are a data agent."}, {"role": "user", "content": "Query it."},
                     call("k1", "run_query", sql="select *"), result("k1", RAW_ROWS)]
    acme = send(gateway, acme_messages)
    # globex names acme's request as its parent and carries the same result bytes:
    # were it accepted, acme's own result would be withheld from acme as a "subagent's".
    response = post(gateway, [{"role": "user", "content": "hi"}, call("k9", "run_query", sql="x"),
                              result("k9", RAW_ROWS)], OTHER_TENANT_KEY, **{"x-gateway-parent-request": acme["id"]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error", "x-gateway-parent-request", "invalid_header")
    assert acme["id"] not in error["message"] or "no request" in error["message"]
    unknown = post(gateway, [{"role": "user", "content": "hi"}], OTHER_TENANT_KEY,
                   **{"x-gateway-parent-request": "req_" + "0" * 32})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "x-gateway-parent-request"
    assert runs_of(gateway, "globex") == 0  # refused before anything was stored
    gateway.fake.reset()
    again = send(gateway, acme_messages + [{"role": "assistant", "content": "found it"},
                                           {"role": "user", "content": "and the card?"}])
    assert "subagent_private" not in again["assembly"]["omissions"]
    assert "4242" in json.dumps(gateway.fake.last_body()["messages"])  # acme still sees its own result


def test_a_parent_of_the_same_tenant_is_linked(rehydration_gateway: RunningGateway) -> None:
    gateway = rehydration_gateway
    parent = send(gateway, [{"role": "user", "content": "Delegate it."}])
    child = send(gateway, [{"role": "user", "content": "Sub task."}], **{"x-gateway-parent-request": parent["id"]})
    assert child["parent_request_id"] == parent["id"]


def test_a_user_cannot_name_another_participants_memory_only_result_back_raw(
        rehydration_gateway: RunningGateway) -> None:
    gateway = rehydration_gateway
    secret = f"private notes\n{FILLER}\nthe password is hunter2-SECRET\n{FILLER}"  # deep inside: no excerpt holds it
    messages = [{"role": "system", "content": "Two agents share this transcript."},
                {"role": "user", "content": "Read the notes."},
                call("n1", "notes_read", author="agent-a", id=1), result("n1", secret),
                call("f1", "fetch_invoice", author="agent-b", id=2), result("f1", "invoice ok\n" + FILLER)]
    record = send(gateway, messages, **{"x-gateway-participant": "agent-b"})
    notes = next(d for d in record["assembly"]["decisions"] if d["index"] == 3)
    assert (notes["action"], notes["reason"]) == ("compacted", "other_participant")
    messages += [{"role": "assistant", "content": "done"},
                 {"role": "user", "content": f"Show me artifact:{notes['artifact_id']} exactly."}]
    record = send(gateway, messages, **{"x-gateway-participant": "agent-b"})
    assert "hunter2-SECRET" not in json.dumps(gateway.fake.last_body()["messages"])
    notes = next(d for d in record["assembly"]["decisions"] if d["index"] == 3)
    assert (notes["action"], notes["reason"]) == ("compacted", "other_participant")
    # The owner naming it gets it back raw.
    send(gateway, messages, **{"x-gateway-participant": "agent-a"})
    assert "hunter2-SECRET" in json.dumps(gateway.fake.last_body()["messages"])
