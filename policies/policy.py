"""The policy schema: how a tenant's transcripts are projected.

A policy is data (YAML in a file, or a built-in preset) validated here. Its
`version` is the declared number plus a fingerprint of the whole content, so
any change, even one whose author forgot to bump the number, gives a new
version; the version goes into every assembly record.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from functools import cached_property
from typing import Any, Callable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from policies.redaction import BUILTINS, Redactor, pattern_problem
from policies.validation import field_path

SCHEMA_VERSION = 1
Freshness = Literal["volatile", "session", "bounded", "durable", "permanent"]
Extractor = Literal["auto", "text", "json", "error", "listing"]
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class PolicyError(Exception):
    """A policy that cannot be used, with its source and the field at fault."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source, self.field, self.problem = source, field, problem
        super().__init__(f"{source}: {field}: {problem}" if field else f"{source}: {problem}")


def parse_duration(value: Any) -> int | None:
    """Seconds from an int or a string like '15m', '2h', '30s', '7d'."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a duration is seconds or a string like '15m'")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("a duration must be positive")
        return value
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration (use seconds or e.g. '30s', '15m', '2h', '7d')")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _valid_patterns(patterns: list[str]) -> list[str]:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"{pattern!r} is not a regular expression: {error}") from None
    return patterns


class ToolRule(_Strict):
    """How results of the tools whose names match `match` are treated."""

    match: list[str] = Field(min_length=1)  # fnmatch globs on the tool name
    freshness: Freshness = "session"
    stale_after: int | None = None  # seconds; '15m' etc. accepted
    refresh_with: str | None = None  # the tool that refreshes it (default: the same tool)
    privacy: str = "internal"
    supersede_on: str | None = None  # e.g. "arguments.path": a later result with the same value replaces this one
    extractor: Extractor = "auto"
    min_tokens: int | None = Field(None, ge=0)
    compact: bool = True  # False: always forwarded exact
    # Who else sees a result: everyone in the conversation as usual; other
    # participants only as a memory; or only the participant that produced it.
    visibility: Literal["conversation", "memory", "participant"] = "conversation"
    promote_to_parent: bool = False  # a subagent's result of this tool may reach its parent
    salient: list[str] = Field(default_factory=list)  # regexes: lines worth keeping in this tool's memories
    # Which value of a result is its revision (e.g. "arguments.version" or "result.revision"): among
    # results with the same `supersede_on` key, the highest revision supersedes the others.
    revision_on: str | None = None

    @field_validator("match", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("stale_after", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> int | None:
        return parse_duration(value)

    @field_validator("supersede_on", mode="before")
    @classmethod
    def _supersede_path(cls, value: Any) -> str | None:
        if isinstance(value, list):  # several arguments identify the document together
            if not value or not all(isinstance(v, str) for v in value):
                raise ValueError("supersede_on is an argument path or a list of them")
            value = ",".join(value)
        if value is not None and not all(v == "arguments" or v.startswith("arguments.") for v in str(value).split(",")):
            raise ValueError("supersede_on names the call's arguments, e.g. 'arguments.path'")
        return value

    @field_validator("revision_on")
    @classmethod
    def _revision_path(cls, value: str | None) -> str | None:
        if value is not None and not (value.startswith("arguments.") or value.startswith("result.")):
            raise ValueError("revision_on names an argument or a field of a JSON result, "
                             "e.g. 'arguments.version' or 'result.revision'")
        return value

    @field_validator("salient")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return _valid_patterns(value)

    def matches(self, tool_name: str) -> bool:
        return any(fnmatch.fnmatchcase(tool_name, pattern) for pattern in self.match)


class Compaction(_Strict):
    keep_recent_rounds: int = Field(2, ge=1)  # tool rounds at the end that stay verbatim
    trigger_tokens: int = Field(8000, ge=0)  # un-compacted tail needed before an epoch advances
    clear_at_least_tokens: int = Field(2000, ge=0)  # each epoch must save at least this much
    min_tokens: int = Field(200, ge=0)  # smaller tool results stay verbatim
    argument_min_tokens: int = Field(300, ge=0)  # larger call arguments in old rounds are compacted
    # The prose a turn wrote beside its calls, in old rounds, becomes a note of its length when it has at
    # least this many tokens (policies/thoughts.py); None: kept as written.
    thought_min_tokens: int | None = Field(None, ge=1)
    # Cache-aware epochs: a move must pay for itself. It makes the provider read
    # `resent` tokens afresh once (write price instead of read price) and saves
    # `saving` tokens on each later turn (at read price). Later turns are taken
    # to number `horizon` times the rounds so far.
    cache_read_price: float = Field(0.1, ge=0)
    cache_write_price: float = Field(1.25, ge=0)
    horizon: float = Field(1.0, ge=0)
    head_chars: int = Field(480, ge=0)  # excerpt of a compacted result: its opening ...
    tail_chars: int = Field(240, ge=0)  # ... and its end
    max_line_chars: int = Field(160, ge=20)
    error_max_chars: int = Field(2000, ge=0)  # errors are kept whole up to this
    # Between the opening and the end, up to this many characters of the lines that carry a
    # decision (conditions, negations, errors, status fields, identifiers the conversation named).
    salient_chars: int = Field(160, ge=0)
    salient_patterns: list[str] = Field(default_factory=list)  # regexes adding to the built-in rules
    # Memories follow the conversation: a line naming what a user turn asked about (its identifiers,
    # numbers, quoted terms, paths) comes first, then one naming what a call's arguments named; as of
    # the round the memory renders at (policies/assembly_state.py `salience_terms`). Off: neither.
    follow_conversation: bool = True
    # A memory's opening and end take at most this share of its result's characters (the lines that
    # carry a decision keep `salient_chars`): a 250-token answer does not keep a 100-token memory.
    excerpt_share: float | None = Field(None, gt=0, le=1)

    @field_validator("salient_patterns")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return _valid_patterns(value)


class Budget(_Strict):
    max_prompt_tokens: int | None = Field(None, gt=0)


class Privacy(_Strict):
    """Which privacy classes each provider may receive raw (`*` globs on the provider name)."""

    providers: dict[str, list[str]] = Field(default_factory=lambda: {"*": ["public", "internal"]})

    def allows(self, provider: str, privacy_class: str) -> bool:
        """The most specific matching entry decides (an exact name, then the longest pattern)."""
        key = (provider, privacy_class)
        found = self._allowed.get(key)
        if found is None:
            found = self._allows(provider, privacy_class)
            if len(self._allowed) < 4096:
                self._allowed[key] = found
        return found

    @cached_property
    def _allowed(self) -> dict[tuple[str, str], bool]:
        return {}  # memoised: every request asks again for every result

    def _allows(self, provider: str, privacy_class: str) -> bool:
        matching = [p for p in self.providers if p == provider or fnmatch.fnmatchcase(provider, p)]
        if not matching:
            return False
        best = max(matching, key=lambda p: (p == provider, len(p.replace("*", "").replace("?", ""))))
        return privacy_class in self.providers[best]


class Rehydration(_Strict):
    tool_name: str = Field("gateway_rehydrate", pattern=r"^[A-Za-z0-9_\-]{1,64}$")
    max_bytes: int = Field(256 * 1024, gt=0)
    max_tokens: int = Field(16000, gt=0)
    max_rounds: int = Field(3, ge=0)
    # On Anthropic upstreams, add the tool mid-conversation where the first memory appears (a
    # `tool_addition`, gateway/pipeline/tool_additions.py) instead of declaring it in `tools` from the start.
    mid_conversation: bool = True


class RedactionPattern(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")  # shown in the marker: [REDACTED:<name>]
    regex: str  # a group named `secret` narrows what is replaced to that group

    @field_validator("regex")
    @classmethod
    def _usable(cls, value: str, info: ValidationInfo) -> str:
        if problem := pattern_problem(str(info.data.get("name", "")), value):
            raise ValueError(problem)
        return value


class Redaction(_Strict):
    """What is redacted from the text the gateway writes for the model (memories, excerpts,
    rehydration answers). On by default: a forwarded memory should never carry a credential. `stored`
    redacts the captured artifact too, before it is written (its original's sha256 is kept)."""

    builtins: list[Literal["api_keys", "bearer_tokens", "private_keys", "emails", "card_numbers"]] = Field(
        default_factory=lambda: list(BUILTINS))
    patterns: list[RedactionPattern] = Field(default_factory=list)
    stored: bool = False

    @cached_property
    def redactor(self) -> Redactor:
        return Redactor(self.builtins, [(p.name, p.regex) for p in self.patterns])

    @property
    def on_capture(self) -> Callable[[Any], tuple[Any, Mapping[str, int]]] | None:
        """What capture applies to a tool result's content before storing it (None: stored as sent)."""
        return self.redactor.redact_value if self.stored and self.redactor else None


class Evaluation(_Strict):
    """Whether the projection changes what the agents do (gateway/evaluation/).

    `holdout_share` of conversations, chosen by a stable hash of the conversation and kept for its whole
    life, are forwarded as the client sent them (captured and recorded as usual): the control arm.
    `shadow_share` of projected requests are sent again unprojected to the same deployment after the client
    has its answer, and the two next actions compared; a day's shadow spend stops at
    `shadow_budget_usd_per_day` (UTC days; 0 spends nothing, so no shadows)."""

    holdout_share: float = Field(0.0, ge=0, le=1)
    shadow_share: float = Field(0.0, ge=0, le=1)
    shadow_budget_usd_per_day: float = Field(1.0, ge=0)


class Policy(_Strict):
    schema_version: Literal[1] = 1
    name: str = Field(min_length=1)
    version: int = Field(1, ge=1)
    description: str = ""
    enabled: bool = True  # False: forward the transcript unchanged (still captured and recorded)
    # Formats with explicit prompt-cache markers (Anthropic's cache_control): the gateway places them
    # where its projection is byte-stable (gateway/pipeline/cache_markers.py); False leaves only the client's.
    cache_markers: bool = True
    compaction: Compaction = Compaction()
    budget: Budget = Budget()
    privacy: Privacy = Privacy()
    rehydration: Rehydration = Rehydration()
    redaction: Redaction = Redaction()
    tools: list[ToolRule] = Field(default_factory=list)
    evaluation: Evaluation = Evaluation()

    @cached_property
    def fingerprint(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    @cached_property
    def held_out(self) -> "Policy":
        """This policy with its projection turned off, for the evaluation's held-out arm: the transcript
        forwarded as sent, no gateway tool, no cache markers of the gateway's, no budget cut."""
        return Policy.model_validate({**self.model_dump(), "enabled": False, "cache_markers": False,
                                      "budget": {"max_prompt_tokens": None}})

    @property
    def version_label(self) -> str:
        """`v<version>-<fingerprint>`: changes with any change of the policy."""
        return f"v{self.version}-{self.fingerprint}"

    def rule_for(self, tool_name: str | None) -> ToolRule:
        """The first rule matching `tool_name` (memoised: every request asks again for every result)."""
        found = self._rules_by_tool.get(tool_name)
        if found is None:
            found = next((rule for rule in self.tools if tool_name is not None and rule.matches(tool_name)),
                         _DEFAULT_RULE)
            if len(self._rules_by_tool) < 4096:
                self._rules_by_tool[tool_name] = found
        return found

    @cached_property
    def _rules_by_tool(self) -> dict[str | None, ToolRule]:
        return {}


_DEFAULT_RULE = ToolRule(match=["*"])


def policy_from_mapping(raw: Mapping[str, Any], source: str) -> Policy:
    if not isinstance(raw, Mapping):
        raise PolicyError(source, "", "a policy is a mapping")
    try:
        return Policy.model_validate(dict(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "unknown field"
        elif first["type"] == "missing":
            message = "required field is missing"
        raise PolicyError(source, field_path(tuple(first["loc"])), message) from exc
