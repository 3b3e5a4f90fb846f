"""`gateway evaluate`: each turn of a conversation asked under two policies through the real gateway, the
next actions compared. With the plain fake both policies agree on the shared traces; with the reader fake
(gateway/fake_upstream/reader.py) a lossy policy disagrees with the unprojected transcript exactly at the
turn where the file that held the fact had become a memory that lost it; stored conversations are read
from the configured store; bad inputs are refused in one line with exit code 2."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from gateway.cli import main
from gateway.fake_upstream.reader import Reader
from testkit.fake_upstream import FakeUpstream
from testkit.gateway import TENANT_KEY, TRACES_DIR, settings_for, start_gateway
from testkit.reader_client import READ_TOOL, reader_workload, run_conversation
from tests.gateway.fake_upstream.test_reader import LOSSY

SMALL_TRACES = [TRACES_DIR / "sweagent_demo_ctf_forensics_flash.jsonl",
                TRACES_DIR / "minisweagent_testdata_github_issue.jsonl"]


def write_config(tmp_path: Path, api_base: str) -> Path:
    config = {"models": [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": api_base,
                                                              "api_key": "sk-upstream"}}],
              "tenants": [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "default"}],
              "storage": {"url": f"sqlite:///{tmp_path / 'gateway.db'}", "blob_dir": str(tmp_path / "blobs")},
              "router": {"num_retries": 0}}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def evaluate(config: Path, *args: str) -> int:
    return main(["evaluate", "--config", str(config), "--model", "fake", *args])


@pytest.fixture(scope="module")
def reader_fake() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        Reader().drive(fake.state)
        yield fake


def test_with_the_plain_fake_both_policies_agree_on_the_shared_traces(fake: FakeUpstream, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "turns.json"
    code = evaluate(write_config(tmp_path, fake.api_base), *map(str, SMALL_TRACES), "--policy", "coding-agent",
                    "--against", "none", "--max-turns", "3", "--json", str(out))
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "A: coding-agent   B: none" in printed and SMALL_TRACES[0].name in printed
    document = json.loads(out.read_text())
    assert (document["model"], document["policy"], document["against"]) == ("fake", "coding-agent", "none")
    assert [c["source"] for c in document["conversations"]] == [p.name for p in SMALL_TRACES]
    trace = json.loads(SMALL_TRACES[0].read_text().splitlines()[0])
    first = document["conversations"][0]
    assert (first["turns"], first["agreed"], first["agreement"], first["mean_similarity"]) == (3, 3, 1.0, 1.0)
    turn = first["turn_comparisons"][0]
    assert turn["index"] == 2 and trace["messages"][2]["role"] == "assistant"
    recorded_call = trace["messages"][2]["tool_calls"][0]["function"]
    assert turn["recorded"]["calls"][0][0] == recorded_call["name"] == "bash"
    assert turn["a"]["action"] == turn["b"]["action"] == {"kind": "answer", "calls": [], "text": "ok"}
    assert turn["a_vs_recorded"] == {"same_action": False, "similarity": 0.0}
    assert turn["a"]["tokens_forwarded"] > 0 and turn["b"]["tokens_forwarded"] == turn["b"]["tokens_original"]
    assert len(fake.requests) == 2 * 3 * len(SMALL_TRACES)  # one request per turn and arm


def reader_trace(tmp_path: Path, fake: FakeUpstream, where: str) -> Path:
    """A READ/NEED conversation as a model that saw everything had it (straight at the reader fake)."""
    workload = reader_workload(files=2, where=where)
    conversation = run_conversation(fake.api_base, workload)
    assert conversation.answer == workload.answer
    path = tmp_path / f"reader-{where}.jsonl"
    path.write_text(json.dumps({"messages": conversation.messages, "tools": [READ_TOOL]}) + "\n")
    return path


def test_a_lossy_policy_disagrees_where_the_fact_was_compacted(reader_fake: FakeUpstream, tmp_path: Path) -> None:
    trace = reader_trace(tmp_path, reader_fake, "middle")
    reader_fake.reset()
    # the policy's own evaluation is left out of the arm: no conversation held out, no shadow sent
    lossy = {**LOSSY, "evaluation": {"holdout_share": 1.0, "shadow_share": 1.0, "shadow_budget_usd_per_day": 100}}
    (tmp_path / "lossy.yaml").write_text(yaml.safe_dump(lossy))
    out = tmp_path / "turns.json"
    code = evaluate(write_config(tmp_path, reader_fake.api_base), str(trace), "--policy",
                    str(tmp_path / "lossy.yaml"), "--against", "none", "--json", str(out))
    assert code == 0
    assert len(reader_fake.requests) == 3 * 2  # one request per turn and arm, none on the side
    (conversation,) = json.loads(out.read_text())["conversations"]
    assert conversation["agreement"] < 1 and conversation["disagreed_at"] == [6]
    turns = {t["index"]: t for t in conversation["turn_comparisons"]}
    assert sorted(turns) == [2, 4, 6]
    # before every file is read the policies forward the same transcript, and the model does the same
    for index in (2, 4):
        assert turns[index]["agreement"]["same_action"]
        assert turns[index]["a"]["tokens_forwarded"] == turns[index]["b"]["tokens_forwarded"]
    at = turns[6]
    assert at["a"]["tokens_forwarded"] < at["b"]["tokens_forwarded"]  # file0 is a memory under the lossy policy
    assert at["a"]["action"]["calls"] == [["read_file", '{"path":"docs/file0.txt"}']]  # it reads it again
    assert at["b"]["action"]["text"] == "FACTS: CODE=v0-code-q7z0" and at["b_vs_recorded"]["same_action"]
    assert not at["a_vs_recorded"]["same_action"]


@pytest.mark.parametrize("where", ["first", "middle"])
def test_coding_agent_agrees_whether_its_memory_keeps_the_fact_or_the_model_rehydrates_it(
        reader_fake: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    trace = reader_trace(tmp_path, reader_fake, where)
    reader_fake.reset()
    out = tmp_path / "turns.json"
    assert evaluate(write_config(tmp_path, reader_fake.api_base), str(trace), "--json", str(out)) == 0
    (conversation,) = json.loads(out.read_text())["conversations"]
    assert conversation["agreement"] == 1.0 and conversation["a_matches_recorded"] == 3
    assert conversation["tokens_forwarded_a"] < conversation["tokens_forwarded_b"]  # and it compacted
    rehydrated = [r for r in reader_fake.requests if "gateway_rehydrate" in json.dumps(r["body"]["messages"])]
    assert bool(rehydrated) == (where == "middle")  # the middle's fact came back in a hidden round
    assert "TOTAL" in capsys.readouterr().out


def test_stored_conversations_are_read_from_the_configured_store(reader_fake: FakeUpstream, tmp_path: Path) -> None:
    config = write_config(tmp_path, reader_fake.api_base)
    settings = settings_for(reader_fake.api_base, f"sqlite:///{tmp_path / 'gateway.db'}", tmp_path)
    running, server = start_gateway(settings, reader_fake)
    try:
        workload = reader_workload(files=2, where="middle")
        conversation = run_conversation(running.api_base, workload, key=TENANT_KEY)
    finally:
        server.stop()
    out = tmp_path / "turns.json"
    assert evaluate(config, "--tenant", "acme", "--policy", "default", "--json", str(out)) == 0
    (stored,) = json.loads(out.read_text())["conversations"]
    turns = stored["turn_comparisons"]
    assert [t["index"] for t in turns] == [2, 4, 6]  # the latest run's request, its answer recorded
    assert turns[-1]["recorded"]["text"] == conversation.answer == workload.answer
    assert stored["agreement"] == 1.0
    assert evaluate(config, "--tenant", "acme", "--conversation", "conv_nothing") == 2


@pytest.mark.parametrize(("args", "said"), [
    (["missing.jsonl"], "missing.jsonl: no such file"),
    (["TRACE", "--policy", "nonsense"], "--policy 'nonsense' is neither a preset"),
    (["TRACE", "--against", "also-nonsense"], "--against 'also-nonsense' is neither a preset"),
    (["TRACE", "--policy", "BAD_POLICY"], "bad.yaml"),
    (["TRACE", "--model", "gpt-9"], "--model 'gpt-9' is no model of"),
    (["TRACE", "--json", "no/such/folder/out.json"], "its folder does not exist"),
    ([], "nothing to evaluate"),
    (["--conversation", "c1"], "--conversation names a stored conversation of the --tenant given"),
])
def test_bad_inputs_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                            said: str) -> None:
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"name": "bad", "compaction": {"head_chars": -1}}))
    values: dict[str, Any] = {"TRACE": str(SMALL_TRACES[0]), "BAD_POLICY": str(tmp_path / "bad.yaml")}
    argv = [values.get(a, a) for a in args]
    model = [] if "--model" in argv else ["--model", "fake"]
    code = main(["evaluate", "--config", str(write_config(tmp_path, "http://127.0.0.1:9/v1")), *model, *argv])
    err = capsys.readouterr().err
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err


def test_a_failing_deployment_stops_the_conversation_and_exits_1(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "turns.json"
    code = evaluate(write_config(tmp_path, "http://127.0.0.1:9/v1"), str(SMALL_TRACES[0]), "--json", str(out))
    assert code == 1 and "stopped: turn at message 2: a: HTTP 5" in capsys.readouterr().out
    (conversation,) = json.loads(out.read_text())["conversations"]
    assert conversation["turns"] == 0 and len(conversation["turn_comparisons"]) == 1
    assert conversation["turn_comparisons"][0]["a"]["error"].startswith("HTTP 5")


def test_a_missing_config_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", str(SMALL_TRACES[0]), "--config", str(tmp_path / "none.yaml"), "--model", "fake"]) == 2
    assert "no such file" in capsys.readouterr().err
