"""deploy/ applies as it is: every object or file a manifest names is defined, the configs load with
the gateway's own validation, the probes hit routes the gateway serves, and a stop lets a stream finish.

No container engine, kubectl or schema validator runs here: the manifests are resolved by hand,
field by field, for the fields they rely on.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shlex
import signal
import sqlite3
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from gateway.config import ENV_PREFIX, ConfigError, Settings, parse_settings, tenant_policies
from scripts.processes import TENANT_KEY, Gateway, fake_upstream, free_port, write_config
from testkit.gateway import start_gateway
from testkit.fake_upstream import FakeUpstream

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
REPO = DEPLOY.parent
K8S = DEPLOY / "k8s"
WORKLOADS = ("Deployment", "StatefulSet")
API_VERSIONS = {"ConfigMap": "v1", "Secret": "v1", "Service": "v1", "PersistentVolumeClaim": "v1",
                "Deployment": "apps/v1", "StatefulSet": "apps/v1", "PodDisruptionBudget": "policy/v1"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _k8s_objects() -> list[dict[str, Any]]:
    return [doc for file in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(file.read_text()) if doc]


OBJECTS = _k8s_objects()


def _named(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in OBJECTS if o["kind"] == kind and o["metadata"]["name"] == name]
    assert found, f"{kind} {name!r} is referenced but no manifest in deploy/k8s defines it"
    return found[0]


def _keys(obj: dict[str, Any]) -> set[str]:
    return set(obj.get("data") or {}) | set(obj.get("stringData") or {}) | set(obj.get("binaryData") or {})


def _secret_values(obj: dict[str, Any], filled: bool = True) -> dict[str, str]:
    """A Secret's values; `filled`: as an operator sets them (the shipped placeholders replaced)."""
    values = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
    values = {**values, **(obj.get("stringData") or {})}
    return {k: v.replace("REPLACE-ME", "set-by-operator") if filled else v for k, v in values.items()}


def _workloads() -> list[dict[str, Any]]:
    return [o for o in OBJECTS if o["kind"] in WORKLOADS]


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def _gateway() -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = _named("Deployment", "gateway")
    return deployment, next(c for c in _pod(deployment)["containers"] if c["name"] == "gateway")


def _container_env(pod: dict[str, Any], container: dict[str, Any], filled: bool = True) -> dict[str, str]:
    """The environment the container starts with, from the manifests' own Secrets and ConfigMaps."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "secretRef" in source:
            env.update(_secret_values(_named("Secret", source["secretRef"]["name"]), filled))
        else:
            env.update(_named("ConfigMap", source["configMapRef"]["name"])["data"])
    for item in container.get("env", []):
        ref = item.get("valueFrom", {})
        if "secretKeyRef" in ref:
            secret = _secret_values(_named("Secret", ref["secretKeyRef"]["name"]), filled)
            env[item["name"]] = secret[ref["secretKeyRef"]["key"]]
        elif "configMapKeyRef" in ref:
            env[item["name"]] = _named("ConfigMap", ref["configMapKeyRef"]["name"])["data"][ref["configMapKeyRef"]["key"]]
        else:
            env[item["name"]] = item["value"]
    return env


def _env_refs(raw: Any) -> set[str]:
    if isinstance(raw, dict):
        return set().union(*(_env_refs(v) for v in raw.values()))
    if isinstance(raw, list):
        return set().union(*(_env_refs(v) for v in raw))
    return {raw[len(ENV_PREFIX):]} if isinstance(raw, str) and raw.startswith(ENV_PREFIX) else set()


def _k8s_config_raw() -> dict[str, Any]:
    """The gateway config the Deployment's `--config` names, read from the ConfigMap mounted there."""
    deployment, container = _gateway()
    config_path = Path(container["args"][container["args"].index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if Path(m["mountPath"]) == config_path.parent)
    volume = next(v for v in _pod(deployment)["volumes"] if v["name"] == mount["name"])
    config_map = _named("ConfigMap", volume["configMap"]["name"])
    assert config_path.name in config_map["data"], f"{config_map['metadata']['name']} has no key {config_path.name}"
    return yaml.safe_load(config_map["data"][config_path.name])


def _load(raw: dict[str, Any], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    missing = _env_refs(raw) - set(env)
    assert not missing, f"the config reads {sorted(missing)} from the environment, which does not set them"
    for name in _env_refs(raw):
        monkeypatch.setenv(name, env[name])
    return parse_settings(raw, "deploy", str(DEPLOY))


def _k8s_settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    deployment, container = _gateway()
    return _load(_k8s_config_raw(), _container_env(_pod(deployment), container), monkeypatch)


def _dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text()


def _port_of(container: dict[str, Any], port: int | str) -> int:
    """A probe's or a Service's port, by number or by the container port's name."""
    ports = container.get("ports", [])
    if isinstance(port, str):
        named = [p["containerPort"] for p in ports if p.get("name") == port]
        assert named, f"container {container['name']} has no port named {port!r}"
        return named[0]
    assert port in [p["containerPort"] for p in ports], f"container {container['name']} does not expose {port}"
    return port


def _probes(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in container]


# --- kubernetes ----------------------------------------------------------------------------------


def test_every_k8s_document_is_a_known_object_with_a_valid_unique_name() -> None:
    seen = set()
    for obj in OBJECTS:
        kind, name = obj["kind"], obj["metadata"]["name"]
        assert obj["apiVersion"] == API_VERSIONS[kind], f"{kind} {name}: apiVersion {obj['apiVersion']}"
        assert DNS_LABEL.match(name) and len(name) <= 63, f"{kind} {name!r} is not a DNS label"
        assert (kind, name) not in seen, f"{kind} {name} is defined twice"
        seen.add((kind, name))
        for field in ("data", "stringData"):  # the API refuses numbers and booleans here
            for key, value in (obj.get(field) or {}).items():
                assert isinstance(value, str), f"{kind} {name}: {field}.{key} is not a string"
    assert {"Deployment", "Service", "ConfigMap", "Secret", "PersistentVolumeClaim"} <= {o["kind"] for o in OBJECTS}


@pytest.mark.parametrize("workload", _workloads(), ids=lambda w: f"{w['kind']}/{w['metadata']['name']}")
def test_everything_a_workload_references_is_defined(workload: dict[str, Any]) -> None:
    spec, pod = workload["spec"], _pod(workload)
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items(), "the selector does not match the pods"
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    for volume in volumes.values():
        if "configMap" in volume:
            config_map = _named("ConfigMap", volume["configMap"]["name"])
            assert {i["key"] for i in volume["configMap"].get("items", [])} <= _keys(config_map)
        elif "secret" in volume:
            secret = _named("Secret", volume["secret"]["secretName"])
            assert {i["key"] for i in volume["secret"].get("items", [])} <= _keys(secret)
        elif "persistentVolumeClaim" in volume:
            _named("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
        else:
            assert "emptyDir" in volume, f"volume {volume['name']}: a kind this resolver does not know"
    if workload["kind"] == "StatefulSet":
        assert _named("Service", spec["serviceName"])["spec"].get("clusterIP") == "None"  # its governing service
    for container in pod["containers"]:
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes or mount["name"] in claims, f"mount of undefined volume {mount['name']}"
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                _named("Secret", source["secretRef"]["name"])
            else:
                _named("ConfigMap", source["configMapRef"]["name"])
        for item in container.get("env", []):
            ref = item.get("valueFrom", {})
            for kind, field in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                if field in ref:
                    assert ref[field]["key"] in _keys(_named(kind, ref[field]["name"])), f"{item['name']}: no such key"
        for probe in _probes(container):
            handler = probe.get("httpGet") or probe.get("tcpSocket")
            if handler is not None:
                _port_of(container, handler["port"])
            else:
                assert probe["exec"]["command"]
        assert container["image"] and ":" in container["image"]


def test_services_and_budgets_select_pods_and_target_their_ports() -> None:
    for service in [o for o in OBJECTS if o["kind"] in ("Service", "PodDisruptionBudget")]:
        selector = service["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        pods = [w for w in _workloads() if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert pods, f"{service['kind']} {service['metadata']['name']} selects no pods"
        for port in service["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            for workload in pods:
                exposed = {key for c in _pod(workload)["containers"] for p in c.get("ports", [])
                           for key in (p["containerPort"], p.get("name"))}
                assert target in exposed, f"Service {service['metadata']['name']}: no container port {target}"


def test_the_k8s_gateway_config_loads_from_the_pod_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _k8s_settings(monkeypatch)
    assert tenant_policies(settings)["acme"].name == "coding-agent"
    deployment, container = _gateway()
    # several replicas share PostgreSQL and Redis, both reached through a Service of the manifests
    assert deployment["spec"]["replicas"] > 1
    database = urlsplit(settings.storage.url)
    assert database.scheme.startswith("postgresql")
    postgres = _named("Service", database.hostname)
    assert database.port in [p["port"] for p in postgres["spec"]["ports"]]
    credentials = _secret_values(_named("Secret", "postgres-credentials"))
    assert (database.username, database.password, database.path.lstrip("/")) == (
        credentials["POSTGRES_USER"], credentials["POSTGRES_PASSWORD"], credentials["POSTGRES_DB"])
    assert settings.redis.url is not None
    redis = urlsplit(settings.redis.url)
    assert redis.port in [p["port"] for p in _named("Service", redis.hostname)["spec"]["ports"]]
    # the server listens where the Service sends
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.*)$", _dockerfile(), re.M).group(1))
    assert int(entrypoint[entrypoint.index("--port") + 1]) == settings.server.port == _port_of(container, "http")
    # each pod's connections (2 x pool_size at most) fit PostgreSQL's limit during a rollout too
    args = _named("StatefulSet", "postgres")["spec"]["template"]["spec"]["containers"][0]["args"]
    max_connections = int(next(a.split("=")[1] for a in args if a.startswith("max_connections=")))
    pods = deployment["spec"]["replicas"] + deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"]
    assert pods * 2 * settings.storage.pool_size < max_connections


def test_the_shipped_placeholder_secrets_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """`kubectl apply -f deploy/k8s/` as shipped starts no gateway that takes requests with REPLACE-ME keys."""
    deployment, container = _gateway()
    with pytest.raises(ConfigError) as caught:
        _load(_k8s_config_raw(), _container_env(_pod(deployment), container, filled=False), monkeypatch)
    refused = {problem.field for problem in caught.value.problems}
    assert {"models[0].litellm_params.api_key", "tenants[0].api_keys[0]", "admin_keys[0]", "storage.url",
            "dashboard.session_secret"} <= refused
    assert all("holds a placeholder (REPLACE-ME...)" in p.problem for p in caught.value.problems)


def test_the_k8s_gateway_writes_only_to_volumes_it_may_write(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _k8s_settings(monkeypatch)
    deployment, container = _gateway()
    pod = _pod(deployment)
    context = pod["securityContext"]
    user = re.search(r"^USER (\d+):(\d+)$", _dockerfile(), re.M)
    assert user, "the Dockerfile's USER is numeric (uid:gid), so runAsNonRoot can be checked"
    assert (context["runAsUser"], context["runAsGroup"]) == (int(user.group(1)), int(user.group(2)))
    assert context["fsGroup"] == context["runAsGroup"] and context["runAsNonRoot"] is True
    assert f"--uid {context['runAsUser']}" in _dockerfile()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    writable = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert "/tmp" in writable
    blobs = writable[settings.storage.blob_dir]
    claim = _named("PersistentVolumeClaim", blobs["persistentVolumeClaim"]["claimName"])
    assert "ReadWriteMany" in claim["spec"]["accessModes"]  # every replica writes the blobs


def test_the_grace_period_covers_a_stream_and_the_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _k8s_settings(monkeypatch)
    deployment, container = _gateway()
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    assert settings.server.shutdown_grace_seconds >= settings.server.upstream_timeout_seconds
    # the preStop hook runs inside the grace period, then SIGTERM: the drain, then the runs settled
    assert _pod(deployment)["terminationGracePeriodSeconds"] > int(sleep[1]) + settings.server.shutdown_grace_seconds
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz?degraded=ok"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_probes_get_answers_from_a_gateway_built_from_the_configmap(
        fake: FakeUpstream, postgres_url: str, redis_url: str, redis_prefix: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _k8s_config_raw()
    deployment, container = _gateway()
    for name in _env_refs(raw):
        monkeypatch.setenv(name, _container_env(_pod(deployment), container)[name])
    # the cluster's services stand in for the manifests' own (postgres, redis: not resolvable here)
    raw["storage"] = {**raw["storage"], "url": postgres_url, "blob_dir": str(tmp_path / "blobs")}
    raw["redis"] = {"url": redis_url, "key_prefix": redis_prefix}
    running, server = start_gateway(parse_settings(raw, "deploy", str(tmp_path)), fake)
    try:
        paths = [p["httpGet"]["path"] for p in _probes(container)]
        compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
        paths += re.findall(r"127\.0\.0\.1:4000(/\w+)", " ".join(compose["services"]["gateway"]["healthcheck"]["test"]))
        paths += re.findall(r"127\.0\.0\.1:4000(/\w+)", _dockerfile())
        assert {"/readyz", "/healthz"} <= set(paths)
        with httpx.Client(base_url=running.url, timeout=30) as http:
            for path in paths:
                assert http.get(path).status_code == 200, path
    finally:
        server.stop()


# --- docker compose ------------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration))


def _compose_env(service: dict[str, Any]) -> dict[str, str]:
    """The service's environment, with `${NAME:?message}` standing for a value compose insists on."""
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    for name, value in env.items():
        assert value is not None and re.fullmatch(r"\$\{\w+:\?[^}]+\}|[^$]*", value), (
            f"{name}: set it or make compose refuse to start without it (${{{name}:?...}})")
    return {name: f"value-of-{name}" for name in env}


def test_compose_references_resolve() -> None:
    compose = _compose()
    services, volumes = compose["services"], compose.get("volumes", {})
    for name, service in services.items():
        assert "healthcheck" in service, f"{name} has no healthcheck"
        for needed, how in (service.get("depends_on") or {}).items():
            assert needed in services, f"{name} depends on undefined service {needed}"
            if how.get("condition") == "service_healthy":
                assert "healthcheck" in services[needed]
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).is_file(), f"{name} mounts {source}, which does not exist"
            else:
                assert source in volumes, f"{name} mounts undefined volume {source}"
        if "build" in service:
            context = DEPLOY / service["build"]["context"]
            assert (context / service["build"]["dockerfile"]).is_file()
    for copied in re.findall(r"^COPY (.+) \S+$", _dockerfile(), re.M):
        for source in copied.split():
            assert (REPO / source).exists(), f"the Dockerfile copies {source}, which does not exist"
    # nginx sends to the gateway service, on the port the gateway listens on
    upstream = re.search(r"server (\w+):(\d+);", (DEPLOY / "nginx.conf").read_text())
    assert upstream.group(1) in services and upstream.group(1) == "gateway" and upstream.group(2) == "4000"


def _nginx_directives(text: str) -> list[tuple[str, str]]:
    """(name, arguments) of each simple directive of an nginx config, in order (comments dropped)."""
    text = re.sub(r"#[^\n]*", "", text)
    return [(name, args.strip()) for name, args in re.findall(r"(?<![\w$@/.:-])(\w+)\s+((?:'[^']*'|[^;{}'])*);", text)]


def test_nginx_holds_slow_and_heavy_clients_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compose file's front proxy times out slow headers and bodies, caps connections per address
    (answered 503 with retry-after in the caller's error shape), buffers a body whole before a gateway
    sees it, and agrees with the gateway's own limits."""
    text = (DEPLOY / "nginx.conf").read_text()
    found = _nginx_directives(text)
    one = {name: args for name, args in found}
    settings = _load(yaml.safe_load((DEPLOY / "config.compose.yaml").read_text()),
                     _compose_env(_compose()["services"]["gateway"]), monkeypatch)
    for name, gateway_seconds in (("client_header_timeout", settings.server.header_timeout_seconds),
                                  ("client_body_timeout", settings.server.body_timeout_seconds),
                                  ("send_timeout", None)):
        assert name in one, f"nginx.conf sets no {name}"
        assert 0 < _seconds(one[name]) <= (gateway_seconds or 60), (name, one[name])
    assert one["reset_timedout_connection"] == "on"
    zone = re.fullmatch(r"\$binary_remote_addr zone=(\w+):\d+m", one["limit_conn_zone"])
    assert zone, one["limit_conn_zone"]
    limit = re.fullmatch(r"(\w+) (\d+)", one["limit_conn"])
    assert limit and limit.group(1) == zone.group(1) and 0 < int(limit.group(2)) <= settings.server.max_connections
    assert one["limit_conn_status"] == "503" and one["error_page"] == "503 = @busy"
    size = re.fullmatch(r"(\d+)m", one["client_max_body_size"])
    assert size and int(size.group(1)) * 1024 * 1024 == settings.server.max_body_bytes
    assert one["proxy_request_buffering"] == "on"  # a slow body stays in nginx
    # nginx's own 503: retry-after, and the error shape of the path (Anthropic's under /v1/messages)
    busy = text.split("location @busy", 1)[1]
    assert re.search(r"add_header Retry-After \d+ always;", busy)
    assert "if ($uri ~ ^/v1/messages)" in busy
    anthropic, openai = (json.loads(body) for body in re.findall(r"return 503 '([^']*)';", busy))
    assert anthropic["type"] == "error" and anthropic["error"]["type"] == "overloaded_error"
    assert set(openai["error"]) == {"message", "type", "param", "code"}


def test_the_compose_config_loads_with_the_compose_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    compose = _compose()
    gateway = compose["services"]["gateway"]
    assert "./config.compose.yaml:/etc/gateway/config.yaml:ro" in gateway["volumes"]
    assert '"/etc/gateway/config.yaml"' in _dockerfile()
    settings = _load(yaml.safe_load((DEPLOY / "config.compose.yaml").read_text()), _compose_env(gateway), monkeypatch)
    assert tenant_policies(settings)["acme"].name == "coding-agent"
    # two replicas: shared PostgreSQL and Redis, both services of the file, and a shared blob volume
    assert gateway["deploy"]["replicas"] > 1
    database = urlsplit(settings.storage.url)
    assert database.scheme.startswith("postgresql") and database.hostname in compose["services"]
    postgres = compose["services"][database.hostname]["environment"]
    assert (database.username, database.password, database.path.lstrip("/")) == (
        postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], postgres["POSTGRES_DB"])
    assert settings.redis.url and urlsplit(settings.redis.url).hostname in compose["services"]
    # /metrics names tenants: the published port is this machine's only, and scrapes need the token
    for service in compose["services"].values():
        for published in service.get("ports", []):
            assert str(published).startswith("127.0.0.1:"), published
    assert settings.server.metrics_token == _compose_env(gateway)["GATEWAY_METRICS_TOKEN"]
    assert f"blobs:{settings.storage.blob_dir}" in gateway["volumes"]
    assert settings.server.shutdown_grace_seconds >= settings.server.upstream_timeout_seconds
    assert _seconds(gateway["stop_grace_period"]) > settings.server.shutdown_grace_seconds
    command = shlex.split(" ".join(gateway["healthcheck"]["test"][1:]))
    assert any("/readyz" in part for part in command)


# --- the stop: `gateway serve` finishes what is in flight, within server.shutdown_grace_seconds ----


@pytest.fixture
def upstream() -> Iterator[str]:
    with fake_upstream() as url:
        yield url


def _serve(tmp_path: Path, upstream: str, shutdown_grace_seconds: float) -> Gateway:
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'gateway.db'}", upstream,
                          shutdown_grace_seconds=shutdown_grace_seconds)
    raw = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**raw, "log_level": "info"}))  # uvicorn's shutdown lines
    return Gateway(config, free_port(), tmp_path / "gateway.log").start()


def _stream_then_stop(gateway: Gateway, upstream: str, text: str) -> tuple[str, list[str]]:
    """Start a stream of `text`, SIGTERM the gateway once its first chunk is here, read to the end."""
    httpx.post(f"{upstream}/_script", json={"message": {"content": text}, "chunk_delay": 0.05}).raise_for_status()
    received, lines = [], []
    with httpx.Client(base_url=gateway.url, timeout=120) as http:
        with http.stream("POST", "/v1/chat/completions",
                         json={"model": "fake", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
                         headers={"authorization": f"Bearer {TENANT_KEY}"}) as response:
            assert response.status_code == 200
            request_id = response.headers["x-gateway-request-id"]
            try:
                for line in response.iter_lines():
                    lines.append(line)
                    if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                        received.append(line)
                        if len(received) == 2:  # the text has begun
                            os.killpg(gateway.process.pid, signal.SIGTERM)
            except httpx.HTTPError:
                lines.append("<cut>")
    return request_id, lines


def _run_status(tmp_path: Path, request_id: str) -> str:
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        return db.execute("SELECT status FROM model_runs WHERE id = ?", (request_id,)).fetchone()[0]


def _log_messages(tmp_path: Path) -> list[str]:
    lines = (tmp_path / "gateway.log").read_text().splitlines()
    messages = [json.loads(line).get("message", "") for line in lines if line.startswith("{")]
    assert "Application shutdown complete." in messages  # the app's own shutdown ran: not killed
    return messages


def test_a_stopped_gateway_finishes_the_stream_in_flight(tmp_path: Path, upstream: str) -> None:
    gateway = _serve(tmp_path, upstream, shutdown_grace_seconds=120)
    text = "".join(f"word{i:03d} " for i in range(120))  # 60 chunks, 3 s
    try:
        request_id, lines = _stream_then_stop(gateway, upstream, text)
        assert gateway.process.wait(60) == -signal.SIGTERM  # uvicorn raises the signal again once it is done
    finally:
        gateway.stop()
    assert lines[-1] != "<cut>" and "data: [DONE]" in lines
    content = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                      for line in lines if line.startswith("data: {") and json.loads(line[6:])["choices"])
    assert content == text
    assert any(m.startswith("Waiting for connections to close") for m in _log_messages(tmp_path))  # it was draining
    assert _run_status(tmp_path, request_id) == "ok"


def test_a_stopped_gateway_cuts_streams_after_the_shutdown_grace_and_settles_them(
        tmp_path: Path, upstream: str) -> None:
    gateway = _serve(tmp_path, upstream, shutdown_grace_seconds=1)
    text = "x" * 16 * 2000  # 2,000 chunks: 100 s, far beyond the grace
    try:
        request_id, lines = _stream_then_stop(gateway, upstream, text)
        assert gateway.process.wait(60) == -signal.SIGTERM  # uvicorn raises the signal again once it is done
    finally:
        gateway.stop()
    assert "data: [DONE]" not in lines  # cut, not finished
    assert any("timeout graceful shutdown exceeded" in m for m in _log_messages(tmp_path))
    assert _run_status(tmp_path, request_id) in ("interrupted", "client_disconnected")  # not left pending
