"""No tenant steers the upstream call (issue 27), shown against a running `gateway serve`.

Every way out of the gateway process points at loopback: the configured deployments at the recording
fake upstream (testkit/listeners.py), and everything else at a catch-all listener standing in for
"every other host": the proxy variables (with NO_PROXY for the fake alone), every provider's
`*_API_BASE`-like variable LiteLLM's source reads, the cloud metadata hosts. Then, on every endpoint
that reaches LiteLLM, through each deployment kind (OpenAI over the direct transport and over LiteLLM,
Anthropic native, the Messages and Responses adapters), the client sends every name LiteLLM takes as an
argument (its entry points' signatures, its deployment parameter models, its own list of parameters,
the `kwargs` its call paths read) as a body field, with hostile values: URLs of the catch-all, provider
names, header dicts, credentials, a mock answer. What the fake upstream receives keeps the host, path,
credential and headers a clean request gets; the catch-all receives nothing; every run recorded `ok`
was answered by the upstream. Names go in batches: a refused batch lists its refused fields and the
rest is sent again; a batch that fails otherwise is split in halves down to single names.
"""
from __future__ import annotations

import inspect
import json
import re
import sqlite3
import string
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import httpx
import pytest
import yaml
from litellm.types.router import GenericLiteLLMParams, LiteLLM_Params
from litellm.types.utils import all_litellm_params

from gateway.upstream.litellm_client.base import litellm
from gateway.upstream.litellm_client.params import NAMED
from scripts.processes import Gateway, free_port
from testkit.gateway import ADMIN_KEY, TENANT_KEY
from testkit.listeners import CatchAll, RecordedUpstream, Seen

LITELLM_DIR = Path(litellm.__file__).parent
UPSTREAM_KEY = "sk-upstream-secret"
ATTACKER_KEY = "sk-attacker"
RUN_ID_HEADER = "x-client-request-id"
# Headers whose value differs from one request to the next.
VOLATILE = {"content-length", RUN_ID_HEADER, "x-stainless-retry-count", "x-stainless-read-timeout",
            "x-stainless-timeout", "traceparent", "tracestate"}
BETAS = "anthropic-beta"


def candidate_names() -> list[str]:
    """Every name LiteLLM takes as an argument of the calls the gateway makes, from LiteLLM itself."""
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    functions = (litellm.completion, litellm.embedding, litellm.text_completion, litellm.responses,
                 litellm.anthropic.messages.acreate, litellm.google_genai.agenerate_content)
    names = {p.name for f in functions for p in inspect.signature(f).parameters.values() if p.kind not in kinds}
    names |= set(LiteLLM_Params.model_fields) | set(GenericLiteLLMParams.model_fields) | set(all_litellm_params)
    sources = [LITELLM_DIR / "main.py", LITELLM_DIR / "responses" / "main.py",
               LITELLM_DIR / "llms" / "anthropic" / "messages" / "native" / "handler.py",
               LITELLM_DIR / "llms" / "custom_httpx" / "llm_http_handler.py"]
    for source in sources:
        names |= set(re.findall(r"kwargs\.(?:get|pop)\(\s*[\"'](\w+)[\"']", source.read_text(encoding="utf-8")))
    return sorted(names)


def provider_base_variables() -> list[str]:
    """The environment variables LiteLLM's source reads for a provider's endpoint."""
    found: set[str] = set()
    pattern = re.compile(r"[\"']([A-Z][A-Z0-9_]*(?:_API_BASE|_BASE_URL|_ENDPOINT|_API_URL|_API_HOST))[\"']")
    for source in LITELLM_DIR.rglob("*.py"):
        if "proxy" not in source.parts:
            found |= set(pattern.findall(source.read_text(encoding="utf-8", errors="replace")))
    return sorted(name for name in found if not name.startswith(("LITELLM", "OTEL", "DATABASE", "REDIS")))


@dataclass(frozen=True)
class Route:
    """A client endpoint and model, and what the fake upstream receives for it."""

    api: str  # the key of gateway.upstream.litellm_client.params.NAMED
    path: str
    body: dict[str, Any]
    upstream_path: str
    credential: tuple[str, str]  # the header and value the deployment authenticates with

    @property
    def label(self) -> str:
        return f"{self.path} {self.body.get('model', '')}".strip()


BEARER = ("authorization", f"Bearer {UPSTREAM_KEY}")
X_API_KEY = ("x-api-key", UPSTREAM_KEY)
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC = {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
GEMINI = "gemini-2.5-flash"
GEMINI_BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
ROUTES = [
    Route("chat", "/v1/chat/completions", {"model": "fake", **CHAT}, "/v1/chat/completions", BEARER),
    Route("chat", "/v1/chat/completions", {"model": "fake-litellm", **CHAT}, "/v1/chat/completions", BEARER),
    Route("chat", "/v1/chat/completions", {"model": "claude-sonnet-4-5", **CHAT}, "/v1/messages", X_API_KEY),
    Route("responses", "/v1/responses", {"model": "fake", "input": "hi"}, "/v1/responses", BEARER),
    Route("responses", "/v1/responses", {"model": "claude-sonnet-4-5", "input": "hi"}, "/v1/messages", X_API_KEY),
    Route("messages", "/v1/messages", {"model": "claude-sonnet-4-5", **ANTHROPIC}, "/v1/messages", X_API_KEY),
    Route("messages", "/v1/messages", {"model": "fake", **ANTHROPIC}, "/v1/chat/completions", BEARER),
    Route("embeddings", "/v1/embeddings", {"model": "fake", "input": "hi"}, "/v1/embeddings", BEARER),
    Route("completions", "/v1/completions", {"model": "fake", "prompt": "hi"}, "/v1/completions", BEARER),
    Route("generate_content", f"/v1beta/models/{GEMINI}:generateContent", GEMINI_BODY,
          f"/v1beta/models/{GEMINI}:generateContent", ("x-goog-api-key", UPSTREAM_KEY)),
]


@dataclass
class Steered:
    """The gateway process, its database, the listeners, and the run ids of every answer it gave."""

    url: str
    db: Path
    upstream: RecordedUpstream
    catch_all: CatchAll
    baselines: dict[str, dict[str, str]] = field(default_factory=dict)
    run_ids: set[str] = field(default_factory=set)

    def post(self, route: Route, extra: dict[str, Any] | None = None) -> httpx.Response:
        answer = httpx.post(f"{self.url}{route.path}", json={**route.body, **(extra or {})}, timeout=60,
                            headers={"Authorization": f"Bearer {TENANT_KEY}", "anthropic-version": "2023-06-01"})
        self.run_ids.add(answer.headers.get("x-gateway-request-id", ""))
        return answer

    def upstream_calls(self, answer: httpx.Response) -> list[Seen]:
        """What the upstream received for the request `answer` answers (by the run id the gateway sends)."""
        run_id = answer.headers.get("x-gateway-request-id")
        return [seen for seen in self.upstream.seen if seen.headers.get(RUN_ID_HEADER) == run_id]

    def each(self, function: Callable[..., Any], *argument_lists: Iterable[Any]) -> list[Any]:
        """`function` over the arguments, a few requests at a time (each request's upstream calls are told
        apart by run id)."""
        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(function, *argument_lists))


def gateway_config(folder: Path, upstream: str) -> Path:
    def deployment(name: str, model: str, base: str, **more: Any) -> dict[str, Any]:
        return {"name": name, "litellm_params": {"model": model, "api_base": base, "api_key": UPSTREAM_KEY, **more}}

    config = {
        "models": [
            deployment("fake", "openai/fake", f"{upstream}/v1"),
            deployment("fake-litellm", "openai/fake", f"{upstream}/v1", drop_params=False),  # LiteLLM's own path
            deployment("claude-*", "anthropic/claude-*", upstream),
            deployment("gpt-*", "openai/*", f"{upstream}/v1"),
            deployment("gem-*", "gemini/*", upstream),
            deployment("gemini-*", "gemini/gemini-*", f"{upstream}/v1beta"),
            deployment("az-*", "azure/*", upstream, api_version="2024-10-21"),
        ],
        "tenants": [{"id": "acme", "api_keys": [TENANT_KEY], "policy": "default"}],
        "admin_keys": [ADMIN_KEY],
        "storage": {"url": f"sqlite:///{folder / 'gateway.db'}", "blob_dir": str(folder / "blobs")},
        "router": {"num_retries": 0},
        "server": {"upstream_timeout_seconds": 20},
        "log_level": "warning",
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def outbound_environment(catch_all: CatchAll) -> dict[str, str]:
    """This process's environment with every way out but loopback's fake upstream at the catch-all."""
    import os

    host = f"127.0.0.1:{catch_all.port}"
    # Not this process's LiteLLM settings (LITELLM_OFFLINE_MODE...): the gateway sets its own.
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and not k.startswith("LITELLM")}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env[name] = catch_all.url
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    for name in provider_base_variables():
        env[name] = catch_all.url
    env.update(AWS_EC2_METADATA_DISABLED="true", GCE_METADATA_HOST=host, GCE_METADATA_IP=host,
               GATEWAY_DIRECT_TRANSPORT="1")
    return env


@pytest.fixture(scope="module")
def steered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Steered]:
    folder = tmp_path_factory.mktemp("steering")
    with RecordedUpstream() as upstream, CatchAll() as catch_all:
        gateway = Gateway(gateway_config(folder, upstream.url), free_port(), folder / "gateway.log",
                          env=outbound_environment(catch_all)).start(seconds=240)
        try:
            running = Steered(gateway.url, folder / "gateway.db", upstream, catch_all)
            for route in ROUTES:  # what a clean request of each route sends the upstream
                answer = running.post(route)
                assert answer.status_code == 200, (route.label, answer.text)
                [seen] = running.upstream_calls(answer)
                running.baselines[route.label] = seen.headers
            yield running
            # Every request the upstream received was one of the gateway's runs, and the catch-all none.
            assert {seen.headers.get(RUN_ID_HEADER) for seen in upstream.seen} <= running.run_ids
            assert catch_all.contacts() == []
        finally:
            gateway.stop()


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for item in value.items() for part in item for s in _strings(part)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return [value] if isinstance(value, str) and len(value) >= 4 else []


def _violations(steered: Steered, route: Route, answer: httpx.Response, sent: Any = None) -> list[str]:
    """What the request `answer` answers changed in the upstream call, reached elsewhere, or recorded
    falsely: another host, path or credential; headers other than a clean request's (LiteLLM may add the
    betas of a documented feature, `anthropic-beta`), or holding what the client sent (`sent`); any
    contact with the catch-all; a 200 the upstream did not give."""
    problems = [f"the catch-all was reached: {data[:200]!r}" for data in steered.catch_all.contacts()]
    baseline = steered.baselines[route.label]
    calls = steered.upstream_calls(answer)
    header, value = route.credential
    for seen in calls:
        if (seen.method, seen.path, seen.query) != ("POST", route.upstream_path, ""):
            problems.append(f"upstream request {seen.method} {seen.path}?{seen.query}")
        if seen.headers.get("host") != steered.upstream.host or seen.headers.get(header) != value:
            problems.append(f"host or credential changed: {seen.headers}")
        if set(seen.headers) - {BETAS} != set(baseline) - {BETAS}:
            problems.append(f"headers {sorted(set(seen.headers) ^ set(baseline))} added or dropped")
        changed = {k for k in baseline if k not in VOLATILE | {BETAS} and seen.headers.get(k) != baseline[k]}
        if changed:
            problems.append(f"headers changed: {sorted(changed)}")
        carried = [k for k, v in seen.headers.items() for s in _strings(sent) if s in v]
        if carried:
            problems.append(f"headers {carried} carry what the client sent")
    if answer.status_code == 200 and not calls:
        problems.append("answered 200 without the upstream being called")
    return problems


_REFUSED = re.compile(r"Unrecognized request arguments? supplied: ([\w, -]+?) \(")


def exercise(steered: Steered, route: Route, names: list[str], value: Any, outcomes: dict[str, str]) -> None:
    """Send `names` (all with `value`) on `route`, check what came out, and go on with what was not
    settled: the rest after refused fields, halves of a batch that failed otherwise."""
    answer = steered.post(route, {name: value for name in names})
    problems = _violations(steered, route, answer, value)
    if problems:
        if len(names) > 1:  # find the name that does it
            for half in (names[: len(names) // 2], names[len(names) // 2:]):
                exercise(steered, route, half, value, outcomes)
        pytest.fail(f"{route.label}: {names} = {value!r}: {problems}")
    if answer.status_code == 200:
        outcomes.update(dict.fromkeys(names, "forwarded"))
        return
    refused = _REFUSED.search(answer.text) if answer.status_code == 400 else None
    param = _param(answer)
    if refused or (answer.status_code // 100 == 4 and param in names):  # those settled, the rest again
        listed = [name.strip() for name in refused.group(1).split(",")] if refused else [param]
        assert set(listed) <= set(names), (listed, answer.text)
        outcomes.update(dict.fromkeys(listed, "refused" if refused else f"answered {answer.status_code}"))
        rest = [name for name in names if name not in listed]
        if rest:
            exercise(steered, route, rest, value, outcomes)
    elif len(names) > 1:
        for half in (names[: len(names) // 2], names[len(names) // 2:]):
            exercise(steered, route, half, value, outcomes)
    else:
        outcomes[names[0]] = f"answered {answer.status_code}"


def _param(answer: httpx.Response) -> str | None:
    """The field an OpenAI-format 400 names (as `param`, or its first part: `metadata` of `metadata.x`)."""
    try:
        error = answer.json()["error"]
        violations = [d for d in error.get("details") or [] if "fieldViolations" in d]  # Google's shape
        param = violations[0]["fieldViolations"][0]["field"] if violations else error["param"]
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    return re.split(r"[.\[]", param, maxsplit=1)[0] if isinstance(param, str) and param else None


def hostile_values(catch_all: CatchAll) -> list[Any]:
    host = f"127.0.0.1:{catch_all.port}"
    return [f"{catch_all.url}/v1", "openrouter", "sagemaker", "ollama", "watsonx",
            {"Host": host, "Authorization": f"Bearer {ATTACKER_KEY}", "x-api-key": ATTACKER_KEY},
            ATTACKER_KEY, "an answer the client made up", True,
            {"api_base": catch_all.url, "custom_llm_provider": "openai", "url": catch_all.url}]


@pytest.mark.parametrize("route", ROUTES, ids=lambda route: route.label)
def test_no_body_field_steers_the_upstream_call(steered: Steered, route: Route) -> None:
    """Every LiteLLM argument name that is no documented field of the route's API, with every hostile
    value: refused with a 400 naming it, or sent to the configured upstream in the body, and nothing else."""
    names = [name for name in candidate_names() if name not in NAMED[route.api] and name not in ("model", "stream")]
    assert {"custom_llm_provider", "api_base", "headers", "mock_response", "deployment_id", "api_key",
            "extra_headers", "base_url", "aws_region_name", "azure_ad_token"} <= set(names)

    def campaign(value: Any) -> dict[str, str]:
        outcomes: dict[str, str] = {}
        exercise(steered, route, names, value, outcomes)
        return outcomes

    values = hostile_values(steered.catch_all)
    for value, outcomes in zip(values, steered.each(campaign, values)):
        assert set(outcomes) == set(names)
        for name in ("custom_llm_provider", "api_base", "headers", "mock_response", "deployment_id"):
            assert outcomes[name] == "refused", (name, value, outcomes[name])
    _ok_runs_were_answered_upstream(steered)


@pytest.mark.parametrize("route", ROUTES, ids=lambda route: route.label)
def test_documented_fields_with_hostile_values_do_not_steer_either(steered: Steered, route: Route) -> None:
    """The route's own documented fields (which LiteLLM takes by name), one at a time, hostile values."""
    values = hostile_values(steered.catch_all)
    own = sorted(NAMED[route.api] | {"model", "stream"})
    steered.each(lambda n, name: exercise(steered, route, [name], values[n % len(values)], {}), range(len(own)), own)
    _ok_runs_were_answered_upstream(steered)


def _ok_runs_were_answered_upstream(steered: Steered) -> None:
    answered = {seen.headers.get(RUN_ID_HEADER) for seen in steered.upstream.seen}
    with sqlite3.connect(steered.db) as db:
        ok = {run_id for (run_id,) in db.execute("SELECT id FROM model_runs WHERE status = 'ok'")}
    assert ok and ok <= answered, sorted(ok - answered)[:5]


UNSAFE_NAMES = ["gpt-a/b", "gpt-a?b", "gpt-a#b", "gpt-a%2fb", "gpt-..", "gpt-a/../b", "gpt-a b", "gpt-a\\b",
                "claude-../../v1/evil?", "claude-x/../../y", "gem-../../../../v1/evil?", "gem-a/b:generateContent",
                "az-a/b", "az-x%2F..%2Fy", "az-..", "broken-a/b", "gpt-a\nb", "gpt-ä"]


@pytest.mark.parametrize("api", ["chat", "messages", "responses", "embeddings"])
def test_a_wildcard_takes_only_a_plain_name(steered: Steered, api: str) -> None:
    """Names whose wildcard part holds `/`, `?`, `#`, `%`, spaces or `..` are unknown models: a 404 in the
    caller's format, and nothing reaches any listener."""
    route = next(r for r in ROUTES if r.api == api)
    before = len(steered.upstream.seen)
    answers = steered.each(lambda name: steered.post(route, {"model": name}), UNSAFE_NAMES)
    for name, answer in zip(UNSAFE_NAMES, answers):
        assert answer.status_code == 404, (name, answer.text)
        error = answer.json()
        if api == "messages":
            assert error["type"] == "error" and error["error"]["type"] == "not_found_error", error
        else:
            assert error["error"]["code"] == "model_not_found", error
    assert steered.upstream.seen[before:] == [] and steered.catch_all.contacts() == []
    assert steered.post(route, {"model": "gpt-fake.v1:latest"}).status_code == 200  # a plain name matches


# What no answer may hold: a traceback, a file path, a package version, LiteLLM's exception names, the
# deployment's address or credential (the client's own values, echoed back, may hold the catch-all's).
_LEAKS = r"Traceback|site-packages|dist-packages|File \"|\.py\b|/usr/|/home/|/work/|/tmp/|litellm\.\w+Error|==\d"


def _leak(steered: Steered, text: str) -> re.Match[str] | None:
    return re.search(f"{_LEAKS}|{re.escape(steered.upstream.host)}|{UPSTREAM_KEY}", text)


PROVIDERS = ["openrouter", "sagemaker", "ollama", "watsonx", "bedrock", "vertex_ai", "azure", "cohere", "deepseek",
             "together_ai", "huggingface", "litellm_proxy", "nosuch", "text-completion-openai", "gemini"]
TOOL_TYPES = ["mcp", "computer_use", "computer_20250124", "web_search", "web_search_preview", "code_interpreter",
              "file_search", "local_shell", "bash_20250124", "", "x" * 300, "../../etc/passwd",
              "".join(string.ascii_letters[(7 * i) % 52] for i in range(12))]


def _tools(api: str, kind: str, catch_all: CatchAll) -> list[dict[str, Any]]:
    common = {"type": kind, "name": "t", "server_label": "s", "server_url": f"{catch_all.url}/mcp/x"}
    if api == "chat":
        return [{**common, "function": {"name": "t", "parameters": {"type": "object"}}},
                {"type": "mcp", "server_url": "litellm_proxy", "server_label": "s"}][: 1 if kind != "mcp" else 2]
    if api == "messages":
        return [{**common, "input_schema": {"type": "object"}}]
    return [{**common, "parameters": {"type": "object"}}]


def test_no_answer_holds_a_traceback_a_path_or_an_internal_address(steered: Steered) -> None:
    """A bounded fuzz over provider names (as models through every wildcard, as provider-prefixed models,
    as a body field) and tool types, on every endpoint: whatever LiteLLM makes of them, the client reads
    no traceback, file path, package version, internal address or credential, and never a 500."""
    cases: list[tuple[Route, dict[str, Any]]] = []
    for route in {route.api: route for route in ROUTES}.values():
        for n, provider in enumerate(PROVIDERS):
            wildcard = ["gpt-", "gem-", "az-", "claude-"][n % 4] + provider
            cases += [(route, {"model": model}) for model in (wildcard, f"{provider}/x")]
    for route in ROUTES:
        cases.append((route, {"custom_llm_provider": "sagemaker", "api_base": steered.catch_all.url}))
        if route.api in ("chat", "responses", "messages"):
            cases += [(route, {"tools": _tools(route.api, kind, steered.catch_all)}) for kind in TOOL_TYPES]
    answers = steered.each(lambda case: steered.post(*case), cases)
    for (route, extra), answer in zip(cases, answers):
        assert answer.status_code != 500 and not _leak(steered, answer.text), (route.label, extra, answer.text)
    assert len(answers) > 150 and {a.status_code for a in answers} >= {200, 400, 404, 502}
    assert steered.catch_all.contacts() == []


def test_messages_unknown_fields_reach_the_provider(steered: Steered) -> None:
    """A field Anthropic's API has and the gateway does not name goes on in the body, natively and through
    LiteLLM's adapter, streamed or not."""
    for route in (r for r in ROUTES if r.api == "messages"):
        for stream in (False, True):
            answer = steered.post(route, {"some_new_field": {"enabled": True}, "stream": stream})
            assert answer.status_code == 200, answer.text
            run_id = answer.headers["x-gateway-request-id"]
            [sent] = [r for r in steered.upstream.requests if r["headers"].get(RUN_ID_HEADER) == run_id]
            assert sent["body"]["some_new_field"] == {"enabled": True}, (route.label, json.dumps(sent["body"])[:300])
