"""The evaluation report: each signal per arm with its 95% interval, the difference between arms, a verdict.

Served by `GET /api/evaluation` and drawn by the dashboard's evaluation page from the same function, so the
two cannot disagree. The rows are storage's (`RecordStore.evaluation_conversations`: one per conversation,
arm and policy version); the statistics are gateway/evaluation/statistics.py's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from gateway.evaluation.arms import ARMS, HOLDOUT, PROJECTED
from gateway.evaluation.statistics import MIN_CONVERSATIONS, Estimate, difference, ratio, verdict, wilson


@dataclass(frozen=True)
class Signal:
    name: str
    numerator: str  # a row's field (a conversation's sum)
    denominator: str | None  # a row's field; None: per conversation
    lower_is_better: bool
    description: str


SIGNALS = (
    Signal("repeated_calls_per_request", "repeated_calls", "requests", True,
           "calls repeating an earlier call of the conversation (same tool, same arguments), per request"),
    Signal("rehydrations_per_request", "rehydrations", "requests", True,
           "artifacts the model asked back raw, per request"),
    Signal("tool_errors_per_call", "tool_errors", "tool_results", True, "tool results reporting an error, per result"),
    Signal("rounds_per_conversation", "requests", None, True, "model requests per conversation"),
    Signal("final_answer_share", "final", None, False, "conversations whose latest answer is a final answer"),
    Signal("tokens_sent_per_conversation", "tokens_sent", None, True, "tokens the client sent, per conversation"),
    Signal("tokens_forwarded_per_conversation", "tokens_forwarded", None, True,
           "tokens forwarded upstream, per conversation"),
    Signal("cached_share", "cached_tokens", "prompt_tokens", False,
           "share of the prompt tokens the provider read from its cache"),
    Signal("cost_per_conversation", "cost_usd", None, True, "what the upstream calls cost, USD per conversation"),
)


def _value(row: Mapping[str, Any], field: str | None) -> float:
    if field is None:
        return 1.0
    value = row[field]
    return float(value) if value is not None else 0.0


def _rounded(value: float | None, places: int = 6) -> float | None:
    return None if value is None else round(value, places)


def _interval(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [round(interval[0], 6), round(interval[1], 6)]


def _arm_view(estimate: Estimate) -> dict[str, Any]:
    return {"count": _rounded(estimate.count), "base": _rounded(estimate.base), "conversations": estimate.units,
            "rate": _rounded(estimate.rate), "interval": _interval(estimate.interval)}


def _signal_view(signal: Signal, by_arm: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    estimates = {arm: ratio([(_value(row, signal.numerator), _value(row, signal.denominator))
                             for row in by_arm[arm]]) for arm in ARMS}
    found = difference(estimates[PROJECTED], estimates[HOLDOUT])
    return {
        "name": signal.name,
        "description": signal.description,
        "better_when": "lower" if signal.lower_is_better else "higher",
        "arms": {arm: _arm_view(estimates[arm]) for arm in ARMS},
        "difference": None if found is None else {"value": _rounded(found[0]), "interval": _interval(found[1])},
        "verdict": verdict(estimates[PROJECTED], estimates[HOLDOUT], signal.lower_is_better),
    }


def _shadow_view(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    compared = sum(int(row["shadows"]) for row in rows)
    agreed = sum(int(row["shadows_agreed"]) for row in rows)
    similarity = sum(float(row["shadow_similarity"]) for row in rows)
    disagreement = wilson(compared - agreed, compared)
    if compared < MIN_CONVERSATIONS:
        judged = "insufficient_data"
    else:
        judged = "worse" if disagreement is not None and disagreement[0] > 0 else "no_difference"
    return {
        "compared": compared,
        "agreed": agreed,
        "agreement": _rounded(agreed / compared if compared else None),
        "interval": _interval(wilson(agreed, compared)),
        "disagreement_interval": _interval(disagreement),
        "mean_similarity": _rounded(similarity / compared if compared else None),
        "spend_usd": _rounded(sum(float(row["shadow_cost_usd"]) for row in rows)),
        "verdict": judged,
    }


def evaluation_report(rows: Iterable[Mapping[str, Any]], filters: Mapping[str, Any]) -> dict[str, Any]:
    by_arm: dict[str, list[Mapping[str, Any]]] = {arm: [] for arm in ARMS}
    versions: set[str] = set()
    for row in rows:
        if row["arm"] in by_arm:
            by_arm[row["arm"]].append(row)
            if row["policy_version"]:
                versions.add(row["policy_version"])
    arms = {arm: {"conversations": len(by_arm[arm]), "requests": sum(int(r["requests"]) for r in by_arm[arm])}
            for arm in ARMS}
    total = sum(view["conversations"] for view in arms.values())
    for view in arms.values():
        view["share"] = _rounded(view["conversations"] / total if total else None, 4)
    enough = min(view["conversations"] for view in arms.values()) >= MIN_CONVERSATIONS
    return {
        "object": "evaluation",
        "filters": dict(filters),
        "policy_versions": sorted(versions),
        "min_conversations": MIN_CONVERSATIONS,
        "enough_data": enough,
        "arms": arms,
        "signals": [_signal_view(signal, by_arm) for signal in SIGNALS],
        "shadow": _shadow_view(by_arm[PROJECTED]),
    }
