"""Redaction (policies/redaction.py): the built-in detectors, tenant patterns, the policy section, and
what the assembler forwards in place of a tool result."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.assembler import assemble
from policies.memories import compact_arguments
from policies.path_records import records_for_path
from policies.policy import Compaction, PolicyError, policy_from_mapping
from policies.redaction import _DIGIT_RUN, BUILTINS, DIGIT_RUN_PLAIN, Redactor, luhn_valid
from policies.transcript import message_path

OPENAI = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" * 2
ANTHROPIC = "sk-ant-api03-" + "Qw3rTy6uIo9pAs2dFg5hJk8lZx1cVb4nM7" * 2 + "-AA"
AWS_ID, AWS_SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GITHUB, GITHUB_PAT = "ghp_" + "a1B2c3D4e5" * 4, "github_pat_11ABCDEFG0" + "x" * 60
SLACK, GOOGLE = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "AIzaSyD" + "-a1_B2c3D4" * 3 + "e5"
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ.SflKxwRJSMeKKF2QT4fwpM"
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
       "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\nLxoS2tFczGkPLPgizskuemMghRniWaoLcyeh\n"
       "-----END RSA PRIVATE KEY-----")
VISA, AMEX = "4111 1111 1111 1111", "3782-822463-10005"

CASES = [
    ("api_key", f"export OPENAI_API_KEY={OPENAI}\n", OPENAI),
    ("api_key", f"anthropic key: {ANTHROPIC}", ANTHROPIC),
    ("api_key", f"[default]\naws_access_key_id = {AWS_ID}\n", AWS_ID),
    ("api_key", f"aws_secret_access_key = {AWS_SECRET}\n", AWS_SECRET),
    ("api_key", f"remote: https://{GITHUB}@github.com/acme/app.git", GITHUB),
    ("api_key", f"GH_TOKEN={GITHUB_PAT}", GITHUB_PAT),
    ("api_key", f"slack bot token {SLACK} in env", SLACK),
    ("api_key", f"maps?key={GOOGLE}&q=paris", GOOGLE),
    ("api_key", 'settings = {"api_key": "9f8e7d6c5b4a3210"}', "9f8e7d6c5b4a3210"),
    ("api_key", "X-Api-Key: q8w7e6r5t4y3", "q8w7e6r5t4y3"),
    ("bearer_token", "curl -H 'Authorization: Bearer abc.DEF-123'", "abc.DEF-123"),
    ("bearer_token", f"token is Bearer {JWT}", JWT),
    ("bearer_token", f"id_token={JWT[:-3]}", JWT[:-3]),
    ("private_key", f"id_rsa:\n{PEM}\nok", "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"),
    ("email", "contact Alice <alice.smith+billing@mail.example.co.uk> today", "alice.smith+billing@mail.example.co.uk"),
    ("card_number", f"paid with {VISA} (visa)", VISA),
    ("card_number", f"amex {AMEX}", AMEX),
    ("card_number", "raw 5555555555554444.", "5555555555554444"),
]


@pytest.mark.parametrize("kind,text,secret", CASES)
def test_each_builtin_redacts_its_kind(kind: str, text: str, secret: str) -> None:
    found = Redactor().redact(text)
    assert secret not in found.text
    assert f"[REDACTED:{kind}]" in found.text
    assert found.counts.get(kind, 0) >= 1
    assert Redactor([]).redact(text).text == text  # nothing on: nothing changes


def test_context_around_a_secret_stays_readable() -> None:
    assert Redactor().redact(f"aws_secret_access_key = {AWS_SECRET}").text == \
        "aws_secret_access_key = [REDACTED:api_key]"
    assert Redactor().redact("Authorization: Bearer abc.def").text == "Authorization: Bearer [REDACTED:bearer_token]"
    assert Redactor().redact(f"api_key={OPENAI}").text == "api_key=[REDACTED:api_key]"


@pytest.mark.parametrize("text", [
    "4111 1111 1111 1112",  # Luhn fails
    "5555555555554445",
    "created_at_ms=1700000000000 and 1234567812345670",  # Luhn-valid but does not start like a card
    "id 41111111111111111111 (twenty digits)",
    "4111 1111",  # too short
    "phone +1 415 555 2671, order 2024-01-15",
])
def test_numbers_that_are_not_cards_stay(text: str) -> None:
    assert Redactor().redact(text).text == text


def test_luhn() -> None:
    assert luhn_valid("4111111111111111") and luhn_valid("378282246310005") and luhn_valid("79927398713")
    assert not luhn_valid("4111111111111112") and not luhn_valid("79927398710")


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet="0123456789 -a\n", max_size=80)
       | st.lists(st.sampled_from(["4111", "1111", " ", "-", "--", "a", "  ", "0", "99999"]), max_size=20).map("".join))
def test_the_digit_runs_are_the_plain_patterns(text: str) -> None:
    """Without its look-behinds the search for runs of digits finds the same spans (about three times faster)."""
    assert [m.span() for m in _DIGIT_RUN.finditer(text)] == [m.span() for m in re.finditer(DIGIT_RUN_PLAIN, text)]


def test_a_card_inside_a_longer_run_of_numbers() -> None:
    assert Redactor().redact("order 1234 4111111111111111 shipped").text == "order 1234 [REDACTED:card_number] shipped"


def test_pem_private_keys_span_lines_and_keep_the_line_count() -> None:
    text = f"before\n{PEM}\nafter: done"
    out = Redactor().redact(text).text
    assert out == "before\n[REDACTED:private_key]" + "\n" * PEM.count("\n") + "\nafter: done"
    assert out.count("\n") == text.count("\n")
    assert "MII" not in out and "END RSA" not in out
    for header in ("OPENSSH PRIVATE KEY", "PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "EC PRIVATE KEY"):
        block = f"-----BEGIN {header}-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END {header}-----"
        assert Redactor().redact(block).text == "[REDACTED:private_key]\n\n"


def test_a_private_key_cut_off_before_its_end_is_redacted_to_where_it_stops() -> None:
    cut = "key:\n-----BEGIN PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7\n" \
          "That was the key.\nMore prose."
    out = Redactor().redact(cut).text
    assert out == "key:\n[REDACTED:private_key]\n\n\n\nThat was the key.\nMore prose."
    escaped = json.dumps({"file": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcw"})
    redacted = Redactor().redact(escaped).text
    assert "MIIE" not in redacted and json.loads(redacted) == {"file": "[REDACTED:private_key]"}


def test_the_same_input_gives_the_same_bytes() -> None:
    text = "\n".join(t for _, t, _ in CASES) * 3
    first = Redactor().redact(text)
    assert first == Redactor().redact(text) == Redactor(BUILTINS).redact(text)
    assert Redactor().redact(first.text).text == first.text
    assert sum(first.counts.values()) >= len(CASES) * 3


def test_builtins_are_chosen_one_by_one() -> None:
    text = f"mail bob@example.com key {OPENAI}"
    assert Redactor(["api_keys"]).redact(text).text == "mail bob@example.com key [REDACTED:api_key]"
    assert Redactor(["emails"]).redact(text).text == f"mail [REDACTED:email] key {OPENAI}"


def test_tenant_patterns_name_their_marker() -> None:
    policy = policy_from_mapping({"name": "p", "redaction": {"builtins": [], "patterns": [
        {"name": "employee_id", "regex": r"\bEMP-\d{6}\b"},
        {"name": "password", "regex": r"password=(?P<secret>\S+)"}]}}, "test")
    found = policy.redaction.redactor.redact("EMP-123456 logged in with password=hunter2! and EMP-12")
    assert found.text == "[REDACTED:employee_id] logged in with password=[REDACTED:password] and EMP-12"
    assert found.counts == {"employee_id": 1, "password": 1}


def test_redaction_is_on_by_default_and_not_stored() -> None:
    redaction = policy_from_mapping({"name": "p"}, "test").redaction
    assert redaction.builtins == list(BUILTINS) and not redaction.stored
    assert redaction.on_capture is None
    assert policy_from_mapping({"name": "p", "redaction": {"stored": True}}, "t").redaction.on_capture is not None
    assert policy_from_mapping({"name": "p", "redaction": {"stored": True, "builtins": []}}, "t").redaction.on_capture \
        is None  # nothing to redact


@pytest.mark.parametrize("section,field,problem", [
    ({"builtins": ["passwords"]}, "redaction.builtins[0]", "Input should be"),
    ({"patterns": [{"name": "x", "regex": "(unclosed"}]}, "redaction.patterns[0].regex", "not a regular expression"),
    ({"patterns": [{"name": "x", "regex": "a*"}]}, "redaction.patterns[0].regex", "matches the empty string"),
    ({"patterns": [{"name": "x", "regex": r"\[\w+:"}]}, "redaction.patterns[0].regex", "matches the marker"),
    ({"patterns": [{"name": "two words", "regex": "x"}]}, "redaction.patterns[0].name", "should match pattern"),
    ({"patterns": [{"name": "x"}]}, "redaction.patterns[0].regex", "required field is missing"),
    ({"stored": "sometimes"}, "redaction.stored", "valid boolean"),
    ({"store": True}, "redaction.store", "unknown field"),
])
def test_bad_redaction_sections_name_the_field(section: dict, field: str, problem: str) -> None:
    with pytest.raises(PolicyError) as caught:
        policy_from_mapping({"name": "p", "redaction": section}, "tenant.yaml")
    assert caught.value.field == field and problem in caught.value.problem


def test_pathological_inputs_finish() -> None:
    """Patterns that backtracked would take hours on these; every pattern here is linear."""
    redactor = Redactor(BUILTINS, [("ticket", r"TICKET-\d+")])
    for text in ("a" * 200_000 + "@", "a@" * 50_000, "1 " * 100_000, "4-" * 20_000 + "x",
                 "-----BEGIN PRIVATE KEY-----\n" * 5_000, "api_key=" * 20_000, "Bearer " * 30_000,
                 "sk-" * 50_000, "x@" + "a." * 50_000 + "1", " " * 100_000 + "\n" + "=" * 100_000):
        assert redactor.redact(text).text.count("REDACTED") >= 0


# -- properties -----------------------------------------------------------------------------------

PIECES = [OPENAI, ANTHROPIC, AWS_ID, GITHUB, SLACK, GOOGLE, JWT, PEM, VISA, AMEX, "bob@example.com",
          "sk-", "api_key=", "Authorization: Bearer ", "Bearer ", "@", "example.com", "4111", "1111 ",
          "-----BEGIN PRIVATE KEY-----", "-----END PRIVATE KEY-----", "MIIEvQIBADANBg", "[REDACTED:email]", "]",
          "TICKET-", "42", " ", "\n", "-", ".", "=", '"', "\\n", "eyJ"]
texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=30).map("".join)
REDACTOR = Redactor(BUILTINS, [("ticket", r"TICKET-\d+")])


@settings(max_examples=400, deadline=None)
@given(texts)
def test_output_holds_no_match_and_redacting_again_changes_nothing(text: str) -> None:
    once = REDACTOR.redact(text)
    assert REDACTOR.find(once.text) == []
    assert REDACTOR.redact(once.text).text == once.text
    assert once.text.count("\n") == text.count("\n")  # lines stay where they were


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([OPENAI, ANTHROPIC, GITHUB, JWT, VISA, "carol@example.org"]), min_size=1, max_size=4),
       st.lists(st.sampled_from([" ", "\n", ", ", " token: ", "\t", "; "]), min_size=5, max_size=5))
def test_separated_secrets_never_survive(secrets: list[str], separators: list[str]) -> None:
    text = "".join(f"{sep}{secret}" for sep, secret in zip(separators, secrets)) + " end"
    out = REDACTOR.redact(text).text
    assert not any(secret in out for secret in secrets)


# -- what the assembler forwards -------------------------------------------------------------------

POLICY = {"name": "redacting", "compaction": {"keep_recent_rounds": 1, "trigger_tokens": 0,
                                              "clear_at_least_tokens": 0, "min_tokens": 20, "horizon": 1000}}
LOG = "\n".join(f"line {i}: deploying service {i} to the staging cluster, all checks passed" for i in range(60))


def _conversation(secret_line: str) -> list[dict]:
    def call(call_id: str, name: str, **arguments: str) -> dict:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}
    return [{"role": "system", "content": "You deploy services."}, {"role": "user", "content": "Deploy."},
            call("c1", "bash", command="cat .env"), {"role": "tool", "tool_call_id": "c1",
                                                     "content": f"{secret_line}\n{LOG}\n{secret_line}"},
            call("c2", "bash", command="make deploy"), {"role": "tool", "tool_call_id": "c2", "content": LOG}]


def _forwarded(raw_policy: dict, messages: list[dict]) -> tuple[str, str]:
    policy = policy_from_mapping(raw_policy, "test")
    path = message_path("acme", messages)
    projection = assemble(policy, messages, records_for_path(path, 0.0), 0.0)
    memory = projection.decisions[3]
    assert memory.action == "compacted"
    return json.dumps(projection.messages[3]), memory.kept


def test_memories_carry_no_secret_and_say_what_was_redacted() -> None:
    messages = _conversation(f"OPENAI_API_KEY={OPENAI} owner=ops@example.com")
    memory, kept = _forwarded(POLICY, messages)
    assert OPENAI not in memory and "ops@example.com" not in memory
    assert "[REDACTED:api_key]" in memory and "[REDACTED:email]" in memory
    assert kept.endswith("redacted api_key x2, email x2")
    assert _forwarded(POLICY, messages)[0] == memory  # byte-stable between requests
    unredacted, kept = _forwarded({**POLICY, "redaction": {"builtins": []}}, messages)
    assert OPENAI in unredacted and "redacted" not in kept


def test_compacted_call_arguments_carry_no_secret_even_where_the_excerpt_cuts_it() -> None:
    c = Compaction()
    value = "echo " * 12 + OPENAI + "\n" + "more " * 200
    compacted = json.loads(compact_arguments(json.dumps({"script": value}), "args_1", c, 100,
                                             redactor=Redactor()))["script"]
    assert "sk-proj" not in compacted and "[REDACTED:api" in compacted
    plain = json.loads(compact_arguments(json.dumps({"script": value}), "args_1", c, 100))["script"]
    assert "sk-proj" in plain  # the cut alone would have let the key's first characters through
    head = json.loads(compact_arguments("not json " + OPENAI + " " * 400, "args_1", c, 100, redactor=Redactor()))
    assert "sk-proj" not in head["head"]


def test_a_result_the_user_names_comes_back_redacted() -> None:
    messages = _conversation(f"token {GITHUB}")
    policy = policy_from_mapping(POLICY, "test")
    first = assemble(policy, messages, records_for_path(message_path("acme", messages), 0.0), 0.0)
    artifact = first.decisions[3].artifact_id
    messages += [{"role": "assistant", "content": "done"}, {"role": "user", "content": f"show artifact:{artifact}"}]
    projection = assemble(policy, messages, records_for_path(message_path("acme", messages), 0.0), 0.0)
    assert projection.decisions[3].action == "rehydrated"
    assert projection.messages[3]["content"] == messages[3]["content"].replace(GITHUB, "[REDACTED:api_key]")


def test_structured_content_is_redacted_value_by_value() -> None:
    """What capture stores for a result sent as parts: every string redacted, the structure (and so
    its JSON) intact, keys untouched; the very same value back when nothing is found."""
    parts = [{"type": "text", "text": f"key {OPENAI}"}, {"type": "text", "text": "owner bob@example.com"},
             {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, {"bob@example.com": 7}]
    value, counts = Redactor().redact_value(parts)
    assert value == [{"type": "text", "text": "key [REDACTED:api_key]"}, {"type": "text", "text": "owner [REDACTED:email]"},
                     parts[2], {"bob@example.com": 7}]
    assert counts == {"api_key": 1, "email": 1}
    clean = [{"type": "text", "text": "nothing here"}]
    assert Redactor().redact_value(clean) == (clean, {}) and Redactor().redact_value(clean)[0] is clean
    assert Redactor().redact_bytes(b"plain \xff bytes") == (b"plain \xff bytes", {})
