"""`gateway evaluate`: would the model have done the same under another policy?

Replays conversations (trace files, or a tenant's stored conversations) against a configured deployment
under two policies (`--policy A --against B`; `--against none`: the transcript as sent) and, at every
turn (each assistant message index i: the request is messages[:i]), asks the deployment for its next
action under each and compares them (gateway/evaluation/next_action.py): whether they agree, how alike
they are, and each against the message the conversation recorded next. Where a projection hid what the
model needed, the answers part: a repeated call, a rehydration, a different answer.

The requests go through the real gateway (gateway/commands/evaluate_gateway.py: the app in this process
with a tenant per policy), so each arm is exactly what a tenant under that policy would get: projection,
hidden rehydration rounds, routing. Prints a table per conversation (turns, agreed, agreement share,
mean similarity, tokens forwarded per policy); `--json FILE` keeps every turn's comparison.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.commands.evaluate_gateway import ARMS, Answer, EvaluateError, LocalGateway, arm_settings, policy_reference
from gateway.commands.evaluate_sources import Source, stored_sources, trace_source
from gateway.config import load_settings
from gateway.evaluation.next_action import NextAction, compare, next_action

_TEXT_KEPT = 500  # characters of an answer's text the JSON keeps


@dataclass
class SourceResult:
    source: Source
    turns: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        compared = [t for t in self.turns if t["agreement"] is not None]
        agreed = sum(1 for t in compared if t["agreement"]["same_action"])

        def forwarded(arm: str) -> int:
            return sum(t[arm]["tokens_forwarded"] or 0 for t in self.turns)

        def matches(arm: str) -> int:
            return sum(1 for t in compared if (t.get(f"{arm}_vs_recorded") or {}).get("same_action"))

        return {"source": self.source.name, "turns": len(compared), "agreed": agreed,
                "agreement": round(agreed / len(compared), 4) if compared else None,
                "mean_similarity": round(statistics.fmean(t["agreement"]["similarity"] for t in compared), 4)
                if compared else None,
                "tokens_forwarded_a": forwarded("a"), "tokens_forwarded_b": forwarded("b"),
                "a_matches_recorded": matches("a"), "b_matches_recorded": matches("b"),
                "disagreed_at": [t["index"] for t in compared if not t["agreement"]["same_action"]],
                "error": self.error}


def action_json(action: NextAction | None) -> dict[str, Any] | None:
    if action is None:
        return None
    return {"kind": action.kind, "calls": [list(call) for call in action.calls], "text": action.text[:_TEXT_KEPT]}


def _agreement(first: NextAction | None, second: NextAction | None) -> dict[str, Any] | None:
    if first is None or second is None:
        return None
    found = compare(first, second)
    return {"same_action": found.same_action, "similarity": found.similarity}


def _arm_json(answer: Answer, action: NextAction | None) -> dict[str, Any]:
    return {"action": action_json(action), "tokens_original": answer.tokens_original,
            "tokens_forwarded": answer.tokens_forwarded, "error": answer.error}


def compare_turn(gateway: LocalGateway, model: str, source: Source, index: int) -> dict[str, Any]:
    """Both arms' next action for the request messages[:index], compared with each other and the record."""
    request = source.messages[:index]
    answers = {arm: gateway.ask(arm, model, request, source.tools) for arm in ARMS}
    actions = {arm: next_action(a.message) if a.message is not None else None for arm, a in answers.items()}
    recorded = source.recorded(index)
    recorded_action = next_action(recorded) if recorded is not None else None
    return {"index": index, "recorded": action_json(recorded_action),
            "a": _arm_json(answers["a"], actions["a"]), "b": _arm_json(answers["b"], actions["b"]),
            "agreement": _agreement(actions["a"], actions["b"]),
            "a_vs_recorded": _agreement(actions["a"], recorded_action),
            "b_vs_recorded": _agreement(actions["b"], recorded_action)}


def evaluate_source(gateway: LocalGateway, model: str, source: Source, max_turns: int) -> SourceResult:
    """The first `max_turns` turns of `source`, in order (as the agent sent them); a failed request ends it."""
    result = SourceResult(source)
    for index in source.turns[:max_turns]:
        turn = compare_turn(gateway, model, source, index)
        result.turns.append(turn)
        errors = [f"{arm}: {turn[arm]['error']}" for arm in ARMS if turn[arm]["error"]]
        if errors:
            result.error = f"turn at message {index}: " + "; ".join(errors)
            break
    return result


def format_table(rows: list[dict[str, Any]], labels: dict[str, str]) -> str:
    header = (f"{'conversation':<48} {'turns':>5} {'agreed':>6} {'share':>6} {'sim':>5} "
              f"{'fwd A':>9} {'fwd B':>9} {'A=rec':>5} {'B=rec':>5}")
    lines = [f"A: {labels['a']}   B: {labels['b']}", header, "-" * len(header)]
    for r in rows:
        share = f"{r['agreement']:.0%}" if r["agreement"] is not None else "-"
        similarity = f"{r['mean_similarity']:.2f}" if r["mean_similarity"] is not None else "-"
        lines.append(f"{r['source'][:48]:<48} {r['turns']:>5} {r['agreed']:>6} {share:>6} {similarity:>5} "
                     f"{r['tokens_forwarded_a']:>9} {r['tokens_forwarded_b']:>9} "
                     f"{r['a_matches_recorded']:>5} {r['b_matches_recorded']:>5}")
        if r["disagreed_at"]:
            lines.append(f"  disagreed at messages {', '.join(map(str, r['disagreed_at']))}")
        if r["error"]:
            lines.append(f"  stopped: {r['error']}")
    turns = sum(r["turns"] for r in rows)
    agreed = sum(r["agreed"] for r in rows)
    lines.append("-" * len(header))
    lines.append(f"{'TOTAL':<48} {turns:>5} {agreed:>6} {(f'{agreed / turns:.0%}' if turns else '-'):>6}")
    return "\n".join(lines)


def _sources(args: argparse.Namespace) -> list[Source]:
    sources = [trace_source(path) for path in args.traces]
    if args.conversation and not args.tenant:
        raise EvaluateError("--conversation names a stored conversation of the --tenant given")
    if args.tenant:
        sources += stored_sources(load_settings(args.config), args.tenant, args.conversation, args.max_conversations)
    if not sources:
        raise EvaluateError("nothing to evaluate: give trace files, or --tenant for stored conversations")
    return sources


def run_evaluate(args: argparse.Namespace) -> int:
    """The command: 0 when every turn was compared, 1 when a request failed, 2 for a usage error."""
    try:
        references = {"a": policy_reference(args.policy, "--policy"),
                      "b": policy_reference(args.against, "--against")}
        if not Path(args.config).is_file():
            raise EvaluateError(f"--config {args.config}: no such file")
        if args.json and not Path(args.json).resolve().parent.is_dir():
            raise EvaluateError(f"--json {args.json}: its folder does not exist")
        sources = _sources(args)
        settings = load_settings(args.config)
        with tempfile.TemporaryDirectory(prefix="gateway-evaluate-") as workdir:
            local = arm_settings(settings, args.model, references, Path(workdir))
            with LocalGateway(local) as gateway:
                results = [evaluate_source(gateway, args.model, source, args.max_turns) for source in sources]
    except EvaluateError as error:
        print(f"gateway evaluate: {error}", file=sys.stderr)
        return 2
    labels = {"a": args.policy, "b": args.against}
    rows = [result.summary() for result in results]
    print(f"model {args.model}; turns per conversation at most {args.max_turns}")
    print(format_table(rows, labels))
    if args.json:
        _write_json(Path(args.json), args, labels, results, rows)
    return 1 if any(r["error"] for r in rows) else 0


def _write_json(path: Path, args: argparse.Namespace, labels: dict[str, str], results: list[SourceResult],
                rows: list[dict[str, Any]]) -> None:
    document = {"model": args.model, "policy": labels["a"], "against": labels["b"], "max_turns": args.max_turns,
                "conversations": [{**row, "turn_comparisons": result.turns} for row, result in zip(rows, results)]}
    path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
