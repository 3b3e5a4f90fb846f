"""OpenTelemetry traces of model requests (gateway/ops/tracing.py, tracing_middleware.py, upstream_tracing.py).

The gateway runs on a real socket against the fake upstream with an in-memory
exporter, so each test reads the spans one request left: the server span, its
ingest and assembly spans, one gen_ai client span per upstream call, and the
rehydration rounds. The last test points `telemetry.otlp_endpoint` at a small
HTTP server and reads the OTLP protobuf it receives.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.app import create_app
from gateway.config import ConfigError
from gateway.ops.tracing import traces_url
from testkit.gateway import TENANT_KEY, RunningGateway, settings_for
from testkit.fake_upstream import FakeUpstream, ServerThread
from tests.gateway.pipeline.test_rehydration import POLICY, TOOLS, compacted_invoice_id, invoice_conversation, rehydrate

SECRET = "the launch code is 0000"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def _settings(fake: FakeUpstream, sqlite_url: str, tmp_path: Path, **overrides: Any) -> Any:
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    models = [{"name": "fake", "litellm_params": {"model": "openai/fake", "api_base": fake.api_base,
                                                   "api_key": "sk-upstream"}},
              {"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_base": fake.url,
                                                       "api_key": "sk-ant-upstream"}}]
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "policy.yaml"}]
    return settings_for(fake.api_base, sqlite_url, tmp_path, models=models, tenants=tenants, **overrides)


@pytest.fixture
def gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path,
            exporter: InMemorySpanExporter) -> Iterator[RunningGateway]:
    settings = _settings(fake, sqlite_url, tmp_path)
    app = create_app(settings, span_exporter=exporter)
    server = ServerThread(app).start()
    yield RunningGateway(url=server.url, settings=settings, app=app, fake=fake)
    server.stop()


def trace_of(exporter: InMemorySpanExporter, request_id: str) -> list[ReadableSpan]:
    """The spans of the trace whose server span names `request_id`, once that span has ended (it ends
    after the last byte is sent, so a moment after the client has its answer)."""
    deadline = time.monotonic() + 10
    while True:
        spans = exporter.get_finished_spans()
        server = [s for s in spans if s.kind == SpanKind.SERVER and s.attributes.get("gateway.request_id") == request_id]
        if server:
            return [s for s in spans if s.context.trace_id == server[0].context.trace_id]
        assert time.monotonic() < deadline, f"no server span for {request_id}: {[s.name for s in spans]}"
        time.sleep(0.02)


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def assert_request_tree(spans: list[ReadableSpan], route: str) -> ReadableSpan:
    server = one(spans, f"POST {route}")
    assert server.kind == SpanKind.SERVER and server.parent is None
    assert server.attributes["http.route"] == route and server.attributes["http.response.status_code"] == 200
    assert server.attributes["gateway.tenant"] == "acme" and server.attributes["gateway.run_status"] == "ok"
    for span in spans:
        if span is not server:
            assert span.parent is not None and span.parent.span_id == server.context.span_id, span.name
    return server


def chat(gateway: RunningGateway, headers: dict[str, str] | None = None) -> httpx.Response:
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", headers=headers, json={
            "model": "fake", "messages": [{"role": "user", "content": SECRET}], "max_tokens": 50, "temperature": 0.2})
    assert response.status_code == 200, response.text
    return response


def test_a_chat_request_is_one_trace_with_ingest_assembly_and_a_gen_ai_client_span(
        gateway: RunningGateway, exporter: InMemorySpanExporter) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "hello"},
                                usage={"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14})
    response = chat(gateway)
    spans = trace_of(exporter, response.headers["x-gateway-request-id"])
    server = assert_request_tree(spans, "/v1/chat/completions")
    assert server.attributes["gateway.model"] == "fake" and server.attributes["gateway.deployment"] == "fake#1"
    assert server.attributes["gateway.wire_format"] == "openai.chat"
    ingest = one(spans, "gateway.ingest")
    assert ingest.attributes["gateway.ingest.messages_captured"] == 1
    assert ingest.attributes["gateway.ingest.artifacts_captured"] == 0
    assembly = one(spans, "gateway.assembly")
    assert assembly.attributes["gateway.policy.name"] == "rehydration-test"
    assert assembly.attributes["gateway.assembly.messages_in"] == 1
    assert assembly.attributes["gateway.assembly.messages_out"] == 1
    assert assembly.attributes["gateway.tokens.sent"] == int(response.headers["x-gateway-tokens-original"])
    assert assembly.attributes["gateway.tokens.forwarded"] == int(response.headers["x-gateway-tokens-forwarded"])
    upstream = one(spans, "chat fake")
    assert upstream.kind == SpanKind.CLIENT and upstream.status.status_code == StatusCode.UNSET
    body = response.json()
    assert {
        k: upstream.attributes.get(k) for k in (
            "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.system", "gen_ai.request.model",
            "gen_ai.request.max_tokens", "gen_ai.request.temperature", "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens", "gen_ai.response.id", "gen_ai.response.model", "server.address")
    } == {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.system": "openai",
          "gen_ai.request.model": "fake", "gen_ai.request.max_tokens": 50, "gen_ai.request.temperature": 0.2,
          "gen_ai.usage.input_tokens": 11, "gen_ai.usage.output_tokens": 3, "gen_ai.response.id": body["id"],
          "gen_ai.response.model": body["model"], "server.address": "127.0.0.1"}
    assert tuple(upstream.attributes["gen_ai.response.finish_reasons"]) == ("stop",)
    # The provider is asked under the upstream span, so its own spans join the trace.
    sent = gateway.fake.requests[-1]["headers"]["traceparent"]
    assert sent.startswith(f"00-{upstream.context.trace_id:032x}-{upstream.context.span_id:016x}-")
    assert int(sent[-2:], 16) & 1  # sampled


def test_content_is_not_recorded_unless_asked(gateway: RunningGateway, exporter: InMemorySpanExporter) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "the answer is secret too"})
    response = chat(gateway)
    spans = trace_of(exporter, response.headers["x-gateway-request-id"])
    recorded = json.dumps([dict(s.attributes) for s in spans] + [s.status.description for s in spans])
    assert "launch code" not in recorded and "secret too" not in recorded
    assert not any("gen_ai.input.messages" in s.attributes for s in spans)


def test_content_is_recorded_when_the_config_asks(fake: FakeUpstream, sqlite_url: str, tmp_path: Path,
                                                  exporter: InMemorySpanExporter) -> None:
    settings = _settings(fake, sqlite_url, tmp_path, telemetry={"capture_content": True})
    server = ServerThread(create_app(settings, span_exporter=exporter)).start()
    try:
        running = RunningGateway(url=server.url, settings=settings, app=None, fake=fake)
        for stream in (False, True):
            fake.script_message({"role": "assistant", "content": "forty-two"})
            extra = {"stream": True} if stream else {}
            with running.client() as http:
                response = http.post("/v1/chat/completions", json={
                    "model": "fake", "messages": [{"role": "user", "content": SECRET}], **extra})
            upstream = one(trace_of(exporter, response.headers["x-gateway-request-id"]), "chat fake")
            assert json.loads(upstream.attributes["gen_ai.input.messages"]) == [{"role": "user", "content": SECRET}]
            assert "forty-two" in upstream.attributes["gen_ai.output.messages"]
    finally:
        server.stop()


def test_a_streamed_chat_ends_its_upstream_span_with_the_stream_and_its_usage(
        gateway: RunningGateway, exporter: InMemorySpanExporter) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "one two three four"},
                                usage={"prompt_tokens": 21, "completion_tokens": 4, "total_tokens": 25})
    with gateway.client() as http:
        with http.stream("POST", "/v1/chat/completions", json={
                "model": "fake", "messages": [{"role": "user", "content": "count"}], "stream": True}) as response:
            assert response.status_code == 200
            text = "".join(response.iter_text())
    assert "[DONE]" in text
    spans = trace_of(exporter, response.headers["x-gateway-request-id"])
    server = assert_request_tree(spans, "/v1/chat/completions")
    assert server.attributes["gateway.stream"] is True
    upstream = one(spans, "chat fake")
    assert upstream.attributes["gen_ai.usage.input_tokens"] == 21
    assert upstream.attributes["gen_ai.usage.output_tokens"] == 4
    assert tuple(upstream.attributes["gen_ai.response.finish_reasons"]) == ("stop",)
    assert upstream.attributes["gen_ai.response.id"]
    assert upstream.end_time <= server.end_time


def test_a_responses_request(gateway: RunningGateway, exporter: InMemorySpanExporter) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "hi from responses"})
    client = openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    raw = client.responses.with_raw_response.create(model="fake", input="hello", max_output_tokens=64)
    response = raw.parse()
    spans = trace_of(exporter, raw.headers["x-gateway-request-id"])
    server = assert_request_tree(spans, "/v1/responses")
    assert server.attributes["gateway.wire_format"] == "openai.responses"
    upstream = one(spans, "chat fake")
    assert upstream.attributes["gateway.upstream_api"] == "responses"
    assert upstream.attributes["gen_ai.request.max_tokens"] == 64
    assert upstream.attributes["gen_ai.usage.input_tokens"] == response.usage.input_tokens
    assert upstream.attributes["gen_ai.usage.output_tokens"] == response.usage.output_tokens
    assert tuple(upstream.attributes["gen_ai.response.finish_reasons"]) == ("completed",)


@pytest.mark.parametrize("stream", [False, True])
def test_a_messages_request(gateway: RunningGateway, exporter: InMemorySpanExporter, stream: bool) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "hi from claude"},
                                usage={"input_tokens": 30, "output_tokens": 5})
    client = anthropic.Anthropic(base_url=gateway.url, api_key=TENANT_KEY, max_retries=0)
    kwargs: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 100,
                              "messages": [{"role": "user", "content": "hello"}]}
    if stream:
        raw = client.messages.with_raw_response.create(**kwargs, stream=True)
        request_id = raw.headers["x-gateway-request-id"]
        events = list(raw.parse())
        assert events[-1].type == "message_stop"
    else:
        raw = client.messages.with_raw_response.create(**kwargs)
        request_id = raw.headers["x-gateway-request-id"]
        assert raw.parse().stop_reason == "end_turn"
    spans = trace_of(exporter, request_id)
    server = assert_request_tree(spans, "/v1/messages")
    assert server.attributes["gateway.deployment"] == "claude-*#1"  # the wildcard entry that served it
    upstream = one(spans, "chat claude-sonnet-4-5")
    assert upstream.attributes["gen_ai.provider.name"] == "anthropic"
    assert upstream.attributes["gen_ai.request.max_tokens"] == 100
    assert upstream.attributes["gen_ai.usage.output_tokens"] == 5
    assert upstream.attributes["gen_ai.usage.input_tokens"] >= 30  # cache reads and writes are input too
    assert tuple(upstream.attributes["gen_ai.response.finish_reasons"]) == ("end_turn",)


def test_an_upstream_error_fails_the_upstream_and_the_server_span(
        gateway: RunningGateway, exporter: InMemorySpanExporter) -> None:
    gateway.fake.script(status=500, error={"message": "the model fell over", "type": "server_error"})
    with gateway.client() as http:
        response = http.post("/v1/chat/completions",
                             json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code >= 500
    code = response.json()["error"]["code"]
    spans = trace_of(exporter, response.headers["x-gateway-request-id"])
    upstream = one(spans, "chat fake")
    assert upstream.status.status_code == StatusCode.ERROR and upstream.attributes["error.type"] == code
    server = one(spans, "POST /v1/chat/completions")
    assert server.status.status_code == StatusCode.ERROR and server.attributes["error.type"] == code
    assert server.attributes["http.response.status_code"] == response.status_code
    assert server.attributes["gateway.run_status"] == "error"


def test_a_stream_that_breaks_after_its_200_fails_its_spans(gateway: RunningGateway,
                                                           exporter: InMemorySpanExporter) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "a long answer cut short " * 5},
                                break_stream_after=3)
    with gateway.client() as http:
        with http.stream("POST", "/v1/chat/completions", json={
                "model": "fake", "messages": [{"role": "user", "content": "go"}], "stream": True}) as response:
            assert response.status_code == 200
            "".join(response.iter_text())
    spans = trace_of(exporter, response.headers["x-gateway-request-id"])
    upstream = one(spans, "chat fake")
    server = one(spans, "POST /v1/chat/completions")
    assert upstream.status.status_code == StatusCode.ERROR
    assert server.status.status_code == StatusCode.ERROR
    assert server.attributes["error.type"] == upstream.attributes["error.type"]


def test_a_client_that_leaves_mid_stream_cancels_the_upstream_span(gateway: RunningGateway,
                                                                     exporter: InMemorySpanExporter) -> None:
    gateway.fake.script_message({"role": "assistant", "content": "word " * 40}, chunk_delay=0.1)
    with gateway.client() as http:
        with http.stream("POST", "/v1/chat/completions", json={
                "model": "fake", "messages": [{"role": "user", "content": "go"}], "stream": True}) as response:
            next(response.iter_bytes())
    spans = trace_of(exporter, response.headers["x-gateway-request-id"])
    upstream = one(spans, "chat fake")
    assert upstream.status.status_code == StatusCode.ERROR and upstream.attributes["error.type"] == "cancelled"
    server = one(spans, "POST /v1/chat/completions")
    assert server.attributes["gateway.run_status"] == "client_disconnected"
    assert server.attributes["error.type"] == "client_disconnected"


def test_an_embeddings_request_is_an_embeddings_span(gateway: RunningGateway, exporter: InMemorySpanExporter) -> None:
    with gateway.client() as http:
        response = http.post("/v1/embeddings", json={"model": "fake", "input": "hello"})
    assert response.status_code == 200, response.text
    spans = trace_of(exporter, response.headers["x-gateway-request-id"])
    assert_request_tree(spans, "/v1/embeddings")
    upstream = one(spans, "embeddings fake")
    assert upstream.kind == SpanKind.CLIENT and upstream.attributes["gen_ai.operation.name"] == "embeddings"
    assert upstream.attributes["gen_ai.usage.input_tokens"] == response.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_rehydration_round_is_a_span_between_two_upstream_calls(
        gateway: RunningGateway, exporter: InMemorySpanExporter, stream: bool) -> None:
    messages = invoice_conversation()
    artifact_id = compacted_invoice_id(gateway, messages)
    captured = [s.attributes["gateway.ingest.artifacts_captured"] for s in exporter.get_finished_spans()
                if s.name == "gateway.ingest"]
    assert captured == [2]  # the invoice and the ledger
    messages += [{"role": "assistant", "content": "noted"}, {"role": "user", "content": "What is the exact total?"}]
    gateway.fake.script_message(rehydrate(artifact_id))
    gateway.fake.script_message({"role": "assistant", "content": "48,213.77 EUR"})
    with gateway.client() as http:
        response = http.post("/v1/chat/completions",
                             json={"model": "fake", "messages": messages, "tools": TOOLS, "stream": stream})
    assert response.status_code == 200 and "48,213.77" in response.text
    spans = trace_of(exporter, response.headers["x-gateway-request-id"])
    assert_request_tree(spans, "/v1/chat/completions")
    first, second = sorted((s for s in spans if s.name == "chat fake"), key=lambda s: s.start_time)
    rehydration = one(spans, "gateway.rehydration")
    assert first.end_time <= rehydration.start_time and rehydration.end_time <= second.start_time
    assert rehydration.attributes["gateway.rehydration.round"] == 1
    assert rehydration.attributes["gateway.rehydration.calls"] == 1
    assert tuple(rehydration.attributes["gateway.rehydration.artifact_ids"]) == (artifact_id,)
    assert rehydration.attributes["gateway.rehydration.refused"] == 0
    assert tuple(first.attributes["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    assembly = one(spans, "gateway.assembly")
    assert assembly.attributes["gateway.assembly.compacted"] >= 1


def test_a_callers_traceparent_is_continued(gateway: RunningGateway, exporter: InMemorySpanExporter) -> None:
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    gateway.fake.script_message({"role": "assistant", "content": "hi"})
    response = chat(gateway, headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
    spans = trace_of(exporter, response.headers["x-gateway-request-id"])
    server = one(spans, "POST /v1/chat/completions")
    assert f"{server.context.trace_id:032x}" == trace_id
    assert server.parent is not None and f"{server.parent.span_id:016x}" == parent_id and server.parent.is_remote
    assert {f"{s.context.trace_id:032x}" for s in spans} == {trace_id}
    assert gateway.fake.requests[-1]["headers"]["traceparent"].startswith(f"00-{trace_id}-")


def test_probes_are_not_traced_and_a_refused_request_is_not_an_error_of_the_server(
        gateway: RunningGateway, exporter: InMemorySpanExporter) -> None:
    with gateway.client() as http:
        assert http.get("/healthz").status_code == 200
        refused = http.post("/v1/chat/completions", json={"model": "nope", "messages": []})
    assert refused.status_code in (400, 404)
    spans = trace_of(exporter, refused.headers["x-gateway-request-id"])
    assert [s.name for s in spans] == ["POST /v1/chat/completions"]
    assert spans[0].status.status_code == StatusCode.UNSET
    assert spans[0].attributes["error.type"] == str(refused.status_code)
    assert not any(s.attributes.get("url.path") == "/healthz" for s in exporter.get_finished_spans())


def test_telemetry_is_off_without_an_endpoint(gateway: RunningGateway, fake: FakeUpstream, sqlite_url: str,
                                              tmp_path: Path) -> None:
    settings = _settings(fake, sqlite_url, tmp_path)
    assert settings.telemetry.otlp_endpoint is None
    app = create_app(settings)
    server = ServerThread(app).start()
    try:
        fake.script_message({"role": "assistant", "content": "hi"})
        chat(RunningGateway(url=server.url, settings=settings, app=app, fake=fake))
        assert app.state.services.tracing.tracer is None
        assert "traceparent" not in fake.requests[-1]["headers"]
    finally:
        server.stop()


def test_the_endpoint_must_be_an_http_url(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        _settings(fake, sqlite_url, tmp_path, telemetry={"otlp_endpoint": "collector:4318"})
    assert raised.value.field == "telemetry.otlp_endpoint"
    with pytest.raises(ConfigError) as raised:
        _settings(fake, sqlite_url, tmp_path, telemetry={"sample_ratio": 1.5})
    assert raised.value.field == "telemetry.sample_ratio"
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/v1/traces") == "http://collector:4318/v1/traces"


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.received.append((self.path, dict(self.headers), body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_spans_are_exported_over_otlp_to_the_configured_endpoint(
        fake: FakeUpstream, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    collector = ThreadingHTTPServer(("127.0.0.1", 0), type("Collector", (_Collector,), {"received": []}))
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    monkeypatch.setenv("COLLECTOR_TOKEN", "tok-123")
    endpoint = f"http://127.0.0.1:{collector.server_address[1]}"
    settings = _settings(fake, sqlite_url, tmp_path, telemetry={
        "otlp_endpoint": endpoint, "service_name": "gw-test", "headers": {"x-api-key": "os.environ/COLLECTOR_TOKEN"}})
    app = create_app(settings)
    server = ServerThread(app).start()
    try:
        fake.script_message({"role": "assistant", "content": "hi"})
        response = chat(RunningGateway(url=server.url, settings=settings, app=app, fake=fake))
        request_id = response.headers["x-gateway-request-id"]
        handler = collector.RequestHandlerClass
        deadline = time.monotonic() + 10
        names: set[str] = set()
        while "POST /v1/chat/completions" not in names:  # the server span ends after the answer is sent
            assert time.monotonic() < deadline, names
            assert app.state.services.tracing.force_flush()
            exported = [ExportTraceServiceRequest.FromString(body) for _, _, body in handler.received]
            spans = [(resource, span) for request in exported for resource in request.resource_spans
                     for scope in resource.scope_spans for span in scope.spans]
            names = {span.name for _, span in spans}
            time.sleep(0.02)
    finally:
        server.stop()
        collector.shutdown()
    path, headers, _ = handler.received[0]
    assert path == "/v1/traces" and headers["x-api-key"] == "tok-123"
    assert {"gateway.ingest", "gateway.assembly", "chat fake"} <= names
    resource = spans[0][0].resource
    assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] == "gw-test"
    server_span = next(span for _, span in spans if span.name == "POST /v1/chat/completions")
    attributes = {a.key: a.value.string_value for a in server_span.attributes}
    assert attributes["gateway.request_id"] == request_id
