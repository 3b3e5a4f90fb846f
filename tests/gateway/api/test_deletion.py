"""Deleting a conversation removes everything captured from it, and nothing of anyone else's."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from testkit.gateway import ADMIN_KEY, OTHER_TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

BIG = "build log line with some words in it\n" * 400  # over the 1 KiB inline bound below: a blob


@pytest.fixture
def gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    settings = settings_for(fake.api_base, storage_url, tmp_path, storage={
        "url": storage_url, "blob_dir": str(tmp_path / "blobs"), "inline_max_bytes": 1024})
    running, server = start_gateway(settings, fake)
    yield running
    server.stop()


def conversation(opening: str) -> list[dict]:
    return [{"role": "user", "content": opening},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "build", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": BIG}]


def send(gateway: RunningGateway, messages: list[dict], key: str = "sk-acme-1", label: str | None = None) -> dict:
    with gateway.client(key=key) as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": messages},
                             headers={"x-gateway-session": label} if label else {})
        assert response.status_code == 200
        return http.get(f"/api/requests/{response.headers['x-gateway-request-id']}").json()


def test_delete_a_labelled_session(gateway: RunningGateway, tmp_path: Path) -> None:
    mine = send(gateway, conversation("Build project A."), label="ticket-1")
    kept = send(gateway, conversation("Build project B."), label="ticket-2")
    theirs = send(gateway, conversation("Build project A."), key=OTHER_TENANT_KEY)  # same bytes, other tenant
    blob = next(p for p in (tmp_path / "blobs").rglob("*") if p.is_file())
    with gateway.client() as http:
        response = http.delete("/api/sessions/ticket-1")
        assert response.status_code == 200
        deleted = response.json()["deleted"]
        assert deleted["model_runs"] == 1 and deleted["tool_artifacts"] == 1 and deleted["message_nodes"] == 3
        assert deleted["blobs"] == 0  # the same content is still another tenant's artifact
        assert http.get(f"/api/requests/{mine['id']}").status_code == 404
        assert http.get(f"/api/artifacts/{mine['captured_artifact_ids'][0]}").status_code == 404
        assert http.get(f"/api/requests/{kept['id']}").json()["status"] == "ok"
        assert {s["session"] for s in http.get("/api/savings").json()["by_session"]} == {"ticket-2"}
        assert http.delete("/api/sessions/ticket-1").status_code == 404
    with gateway.client(key=OTHER_TENANT_KEY) as http:
        artifact = theirs["captured_artifact_ids"][0]
        assert http.get(f"/api/artifacts/{artifact}").content == BIG.encode()
        assert http.delete("/api/sessions/ticket-2").status_code == 404  # not theirs to delete
    with gateway.client(key=ADMIN_KEY) as http:
        assert http.delete("/api/sessions/ticket-2").status_code == 400  # admin names the tenant
        assert http.delete(f"/api/sessions/{theirs['conversation_id']}", params={"tenant": "globex"}).status_code == 200
    assert blob.exists()  # acme's ticket-2 holds the same output
    with gateway.client() as http:
        assert http.delete("/api/sessions/ticket-2").json()["deleted"]["blobs"] == 1
    assert not blob.exists()  # no artifact names it any more


def test_delete_by_conversation_id_removes_every_request_of_it(gateway: RunningGateway) -> None:
    first = send(gateway, conversation("Build project A."))
    branch = conversation("Build project A.") + [{"role": "assistant", "content": "done"},
                                                 {"role": "user", "content": "again"}]
    second = send(gateway, branch)
    assert first["conversation_id"] == second["conversation_id"]  # the same first exchange
    with gateway.client() as http:
        deleted = http.delete(f"/api/sessions/{first['conversation_id']}").json()["deleted"]
        assert deleted["model_runs"] == 2 and deleted["message_nodes"] == 5
        assert http.get(f"/api/requests/{second['id']}").status_code == 404


def test_tampered_blob_is_reported_not_served(gateway: RunningGateway, tmp_path: Path) -> None:
    record = send(gateway, conversation("Build project C."))
    blob = next(p for p in (tmp_path / "blobs").rglob("*") if p.is_file())
    blob.write_bytes(blob.read_bytes().replace(b"build", b"BUILD", 1))
    with gateway.client() as http:
        response = http.get(f"/api/artifacts/{record['captured_artifact_ids'][0]}")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "artifact_corrupted"


SYSTEM = {"role": "system", "content": "You are the build agent. Run the tools you need."}


def ledger_sessions(gateway: RunningGateway) -> dict[str, int]:
    with gateway.client() as http:
        return {s["session"]: s["requests"] for s in http.get("/api/savings").json()["by_session"]}


@pytest.mark.parametrize("by", ["label", "ledger id"])
def test_deleting_one_of_two_conversations_sharing_a_system_prompt_leaves_the_other(
        gateway: RunningGateway, by: str) -> None:
    labels = ("ticket-1", "ticket-2") if by == "label" else (None, None)
    one = send(gateway, [SYSTEM, *conversation("Build project A.")], label=labels[0])
    two = send(gateway, [SYSTEM, *conversation("Build project B.")], label=labels[1])
    two_again = send(gateway, [SYSTEM, *conversation("Build project B."), {"role": "assistant", "content": "built"},
                               {"role": "user", "content": "thanks"}], label=labels[1])
    assert one["tree_id"] == two["tree_id"]  # one tree: the same system prompt
    assert one["session_id"] == one["tree_id"]  # the tree's former name, still given
    sessions = ledger_sessions(gateway)
    key = labels[0] or one["conversation_id"]
    other = labels[1] or two["conversation_id"]
    assert sessions == {key: 1, other: 2}
    with gateway.client() as http:
        deleted = http.delete(f"/api/sessions/{key}").json()["deleted"]
        # its run, its user/assistant/tool nodes and its artifact; the shared system prompt stays
        assert deleted["model_runs"] == 1 and deleted["message_nodes"] == 3 and deleted["tool_artifacts"] == 1
        assert http.get(f"/api/requests/{one['id']}").status_code == 404
        for record in (two, two_again):
            assert http.get(f"/api/requests/{record['id']}").json()["status"] == "ok"
        for artifact in two_again["path_artifact_ids"]:
            assert http.get(f"/api/artifacts/{artifact}").content == BIG.encode()
        assert http.get(f"/api/requests/{two_again['id']}/projection").status_code == 200
    assert ledger_sessions(gateway) == {other: 2}
    # The survivor goes on as before: its next request maps onto its stored nodes.
    three = send(gateway, [SYSTEM, *conversation("Build project B."), {"role": "assistant", "content": "built"},
                           {"role": "user", "content": "thanks"}, {"role": "assistant", "content": "welcome"},
                           {"role": "user", "content": "bye"}], label=labels[1])
    assert three["conversation_id"] == two["conversation_id"]
    assert gateway.store.count_artifacts("acme") == 1


def test_conversations_that_share_their_opening_share_their_artifacts_until_the_last_goes(
        gateway: RunningGateway) -> None:
    opening = [SYSTEM, *conversation("Build project A.")]
    first = send(gateway, opening, label="run-1")
    second = send(gateway, [*opening, {"role": "assistant", "content": "built"}, {"role": "user", "content": "again"}],
                  label="run-2")
    artifact = first["captured_artifact_ids"][0]
    assert second["path_artifact_ids"] == [artifact]  # stored once
    with gateway.client() as http:
        deleted = http.delete("/api/sessions/run-1").json()["deleted"]
        assert deleted["model_runs"] == 1 and deleted["tool_artifacts"] == 0 and deleted["message_nodes"] == 0
        assert http.get(f"/api/artifacts/{artifact}").content == BIG.encode()  # run-2 still uses it
        deleted = http.delete("/api/sessions/run-2").json()["deleted"]
        assert deleted["tool_artifacts"] == 1 and deleted["message_nodes"] == 6 and deleted["blobs"] == 1
        assert http.get(f"/api/artifacts/{artifact}").status_code == 404
