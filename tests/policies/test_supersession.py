"""Which later result supersedes or retries an earlier one, worked out by extending the scan of an
earlier request's results (`supersession.extend`) instead of scanning every result again: the answer is
the whole scan's, whatever the results and wherever the earlier request ended."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.memories import ArtifactView
from policies.policy import ToolRule
from policies.supersession import extend, later_results, scan

RULES = {
    "read_file": ToolRule(match=["read_file"], supersede_on="arguments.path"),
    "open_doc": ToolRule(match=["open_doc"], supersede_on="arguments.path", revision_on="result.version"),
    "edit": ToolRule(match=["edit"], supersede_on="arguments.path"),
    "run": ToolRule(match=["run"]),
}

# A call is its tool and arguments, a key its path: calls of one key differ by their `limit`.
views = st.builds(
    lambda tool, path, limit, status: ArtifactView(
        artifact_id=f"art_{tool}_{path}", tool_name=tool,
        arguments=json.dumps({**({"path": path} if path != "none" else {}), "limit": limit}), status=status,
        content="x", sha256="0" * 64, tokens=1, observed_at=0.0),
    st.sampled_from(sorted(RULES)), st.sampled_from(["a", "b", "none"]), st.integers(0, 1),
    st.sampled_from(["ok", "ok", "error", "error", "pending"]))


def _rule_of(artifacts: dict[int, ArtifactView]):
    return lambda index: RULES[artifacts[index].tool_name]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), views), max_size=24), st.data())
def test_extending_an_earlier_scan_gives_the_whole_scan(spaced: list, data: st.DataObject) -> None:
    artifacts, index = {}, 0
    for gap, view in spaced:  # results at increasing message positions, with other messages between
        index += gap + 1
        artifacts[index] = view
    whole = scan(artifacts, _rule_of(artifacts))
    cuts = sorted(data.draw(st.lists(st.integers(0, index + 2), max_size=3)))
    found = None
    for cut in cuts:  # requests of a growing conversation, each extending the one before
        earlier = {i: v for i, v in artifacts.items() if i < cut}
        found = scan(earlier, _rule_of(earlier)) if found is None else extend(found, earlier, _rule_of(earlier))
        alone = scan(earlier, _rule_of(earlier))
        assert (found.superseder, found.retried_at) == (alone.superseder, alone.retried_at)
    extended = whole if found is None else extend(found, artifacts, _rule_of(artifacts))
    assert extended.superseder == whole.superseder and extended.retried_at == whole.retried_at
    assert extended.open_keys == whole.open_keys and extended.open_errors == whole.open_errors
    assert extended.first_by_key == whole.first_by_key and extended.first_by_call == whole.first_by_call
    superseder, retried_at, _ = later_results(artifacts, _rule_of(artifacts))
    assert retried_at == whole.retried_at
    assert all(superseder[i] == later for i, later in whole.superseder.items())  # revisions add, never change


def test_a_later_result_of_the_same_path_supersedes_and_a_retry_of_another_tool_does_not() -> None:
    def view(tool: str, path: str, status: str = "ok") -> ArtifactView:
        return ArtifactView(f"art_{tool}_{path}", tool, json.dumps({"path": path}), status, "x", "0" * 64, 1, 0.0)

    earlier = {1: view("read_file", "a"), 3: view("read_file", "b", "error"), 5: view("edit", "b")}
    first = scan(earlier, _rule_of(earlier))
    # the edit of b supersedes the failed read of b (one key across tools), but retries it not (another tool)
    assert first.superseder == {3: 5} and first.retried_at == {}
    assert first.open_errors == {3: ((("read_file", json.dumps({"path": "b"}))), None)}  # its key came (edit)
    later = {**earlier, 7: view("read_file", "a"), 9: view("read_file", "b")}
    extended = extend(first, later, _rule_of(later))
    assert extended.superseder == {1: 7, 3: 5, 5: 9}
    assert extended.retried_at == {3: 9}  # the same call, later
    assert (extended.superseder, extended.retried_at) == (scan(later, _rule_of(later)).superseder,
                                                          scan(later, _rule_of(later)).retried_at)
