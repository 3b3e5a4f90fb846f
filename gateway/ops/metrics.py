"""Prometheus metrics, one registry per app (tests and replicas never share counters).

Token counters count finished (ok) runs only, as the savings ledger does, so
the two agree for the runs this process served. No `*_created` series: each
counter would be exposed twice, once with its creation time, which no
dashboard reads.
"""
from __future__ import annotations

from typing import Iterator, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from storage.assembly_record import AssemblyRecord
from storage.record_types import RunOutcome

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_ASSEMBLY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
disable_created_metrics()  # process-wide in prometheus_client: no metric of this process wants them


def surface_of(path: str) -> str:
    """Which part of the gateway a path is: model requests, the records and admin APIs, the dashboard."""
    if path.startswith(("/v1/", "/v1beta/")):
        return "model"
    if path.startswith("/api/"):
        return "api"
    if path.startswith("/dashboard"):
        return "dashboard"
    return "other"


class Gate(Protocol):
    """What the metrics read of gateway/edge/connections.py's ConnectionGate."""

    @property
    def open(self) -> int: ...

    timed_out: int
    evicted: int
    refused: int


class Budget(Protocol):
    held: int


class _ConnectionsClosed:
    """A counter the gate keeps itself, read when scraped."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("gateway_connections_closed", "Connections the gateway closed itself, by "
                                     "reason: headers not in time, the longest idle at the cap, refused at the cap",
                                     labels=["reason"])
        family.add_metric(["header_timeout"], self.gate.timed_out)
        family.add_metric(["evicted"], self.gate.evicted)
        family.add_metric(["refused"], self.gate.refused)
        yield family


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gateway_requests", "Model requests finished (every wire format, embeddings and completions too), "
            "by tenant, model and final status", ["tenant", "model", "status"], registry=r)
        self.tokens_sent = Counter("gateway_tokens_sent", "Prompt tokens as the clients sent them (ok runs)",
                                   ["tenant", "model"], registry=r)
        self.tokens_forwarded = Counter("gateway_tokens_forwarded", "Prompt tokens as forwarded upstream (ok runs)",
                                        ["tenant", "model"], registry=r)
        self.cached_tokens = Counter("gateway_cached_tokens", "Prompt tokens the provider reported as cached "
                                     "(ok runs; the provider's tokenizer)", ["tenant", "model"], registry=r)
        self.cost = Counter("gateway_cost_usd", "Cost as forwarded, USD (ok runs)", ["tenant", "model"], registry=r)
        self.cost_original = Counter("gateway_cost_original_usd", "Cost the client's transcript would have had, "
                                     "USD (ok runs)", ["tenant", "model"], registry=r)
        self.rehydrations = Counter("gateway_rehydrations", "Artifacts put back raw, by outcome: answers to the "
                                    "rehydration tool and artifacts a user message names", ["tenant", "outcome"],
                                    registry=r)
        self.errors = Counter("gateway_errors", "Error answers, by surface (model requests, the api, the "
                              "dashboard) and error code", ["surface", "type"], registry=r)
        self.assembly_seconds = Histogram("gateway_assembly_seconds", "Time to assemble a projection",
                                          buckets=_ASSEMBLY_BUCKETS, registry=r)
        self.upstream_seconds = Histogram("gateway_upstream_seconds", "Upstream latency, all rounds",
                                          ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.evaluation_runs = Counter("gateway_evaluation_runs", "Answered runs by evaluation arm (projected, "
                                       "holdout)", ["tenant", "arm"], registry=r)
        self.repeated_calls = Counter("gateway_repeated_calls", "Calls in answers repeating an earlier call of "
                                      "the conversation (same tool, same arguments), by arm", ["tenant", "arm"],
                                      registry=r)
        self.shadows = Counter("gateway_shadows", "Shadow comparisons by how they ended (ok, error, over_budget, "
                               "busy) and whether the next actions agreed", ["tenant", "status", "agreed"], registry=r)
        self.evaluation_cost = Counter("gateway_evaluation_cost_usd", "What shadow comparisons cost, USD",
                                       ["tenant"], registry=r)
        self.redis_up: Gauge | None = None  # made when Redis is configured (observe_redis)
        self.redis_outages = Counter("gateway_redis_outages", "Times Redis stopped answering", registry=r)

    def observe_run(self, tenant: str, model: str, outcome: RunOutcome, assembly: AssemblyRecord | None,
                    arm: str | None = None) -> None:
        self.requests.labels(tenant, model, outcome.status).inc()
        self.upstream_seconds.labels(model).observe(outcome.latency_ms / 1000)
        if assembly is not None:
            self.assembly_seconds.observe(assembly.timings_ms.get("assemble", 0.0) / 1000)
            # the Rehydrator's answers, and the messages the assembler rehydrated (named by the user)
            for decision in (*assembly.notable.values(), *assembly.rehydrations):
                if decision["action"] in ("rehydrated", "rehydration_refused"):
                    self.rehydrations.labels(tenant, decision["action"]).inc()
        if outcome.status != "ok":
            return
        self.tokens_sent.labels(tenant, model).inc(outcome.tokens_original or 0)
        self.tokens_forwarded.labels(tenant, model).inc(outcome.tokens_forwarded or 0)
        self.cached_tokens.labels(tenant, model).inc(outcome.cached_tokens or 0)
        self.cost.labels(tenant, model).inc(outcome.cost_usd or 0.0)
        self.cost_original.labels(tenant, model).inc(outcome.cost_original_usd or 0.0)
        if arm is not None:
            self.evaluation_runs.labels(tenant, arm).inc()
            repeated = (outcome.signals or {}).get("repeated_calls")
            if repeated:
                self.repeated_calls.labels(tenant, arm).inc(repeated)

    def observe_shadow(self, tenant: str, status: str, same_action: bool | None, cost_usd: float | None) -> None:
        self.shadows.labels(tenant, status, "" if same_action is None else str(same_action).lower()).inc()
        if cost_usd:
            self.evaluation_cost.labels(tenant).inc(cost_usd)

    def observe_redis(self, up: bool) -> None:
        if self.redis_up is None:
            self.redis_up = Gauge("gateway_redis_up", "1 while Redis answers; 0 while limits and spend are "
                                  "counted per process (or refused)", registry=self.registry)
        self.redis_up.set(1 if up else 0)
        if not up:
            self.redis_outages.inc()

    def observe_edge(self, gate: Gate, budget: Budget) -> None:
        """The process's open connections and request bytes held, and the connections it closed."""
        Gauge("gateway_open_connections", "Client connections open in this process",
              registry=self.registry).set_function(lambda: gate.open)
        Gauge("gateway_request_bytes_held", "Bytes of request bodies this process holds (being read and handled)",
              registry=self.registry).set_function(lambda: budget.held)
        self.registry.register(_ConnectionsClosed(gate))

    def observe_error(self, error_type: str, path: str) -> None:
        self.errors.labels(surface_of(path), error_type).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
