"""Embeddings, completions and model lookup: passed through LiteLLM, recorded in the ledger, not projected."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import openai
import pytest

from testkit.gateway import OTHER_TENANT_KEY, TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream


@pytest.fixture
def gateway(fake: FakeUpstream, storage_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    models = [{"name": "embed", "litellm_params": {"model": "openai/text-embedding-3-small", "api_base": fake.api_base,
                                                    "api_key": "sk-upstream"}},
              {"name": "instruct", "litellm_params": {"model": "openai/gpt-3.5-turbo-instruct",
                                                       "api_base": fake.api_base, "api_key": "sk-upstream"}},
              {"name": "claude-*", "litellm_params": {"model": "anthropic/claude-*", "api_base": fake.url}}]
    tenants = [{"id": "acme", "api_keys": [TENANT_KEY]},
               {"id": "globex", "api_keys": [OTHER_TENANT_KEY], "models": ["embed"]}]
    running, server = start_gateway(settings_for(fake.api_base, storage_url, tmp_path, models=models,
                                                 tenants=tenants), fake)
    yield running
    server.stop()


def ledger_by_model(gateway: RunningGateway) -> dict[str, dict]:
    with gateway.client() as http:
        return {row["model"]: row for row in http.get("/api/savings").json()["by_model"]}


def test_embeddings_from_the_sdk_and_langchain(gateway: RunningGateway) -> None:
    from langchain_openai import OpenAIEmbeddings

    client = openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    raw = client.embeddings.with_raw_response.create(model="embed", input=["first text", "second text"],
                                                     dimensions=8)
    vectors = raw.parse()
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 8
    assert gateway.fake.requests[-1]["body"]["dimensions"] == 8
    lc = OpenAIEmbeddings(model="embed", base_url=gateway.api_base, api_key=TENANT_KEY,
                          check_embedding_ctx_length=False, max_retries=0)
    assert len(lc.embed_documents(["a", "b", "c"])) == 3 and len(lc.embed_query("q")) == 8
    # LangChain's defaults: the texts go as tiktoken token ids, the vectors asked for in base64
    default = OpenAIEmbeddings(model="embed", base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    assert len(default.embed_documents(["alpha beta", "gamma"])) == 2
    sent = gateway.fake.requests[-1]["body"]
    assert all(isinstance(ids, list) and all(isinstance(i, int) for i in ids) for ids in sent["input"])
    with gateway.client() as http:
        run = http.get(f"/api/requests/{raw.headers['x-gateway-request-id']}").json()
    assert run["wire_format"] == "openai.embeddings" and run["status"] == "ok"
    assert run["usage"]["prompt_tokens"] > 0 and run["cost_usd"] > 0  # priced by LiteLLM's cost map
    assert run["assembly"] is None and run["path_artifact_ids"] == []  # nothing projected or captured
    assert ledger_by_model(gateway)["embed"]["requests"] == 4  # the SDK's and LangChain's three


def test_completions_json_and_stream(gateway: RunningGateway) -> None:
    client = openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    text = client.completions.create(model="instruct", prompt="Say hi", max_tokens=5)
    assert text.choices[0].text == " completed text"
    raw = client.completions.with_raw_response.create(model="instruct", prompt="Say hi", max_tokens=5, stream=True)
    chunks = list(raw.parse())
    assert "".join(c.choices[0].text or "" for c in chunks if c.choices) == " completed text"
    assert all(c.choices and c.usage is None for c in chunks)  # no usage chunk: the client did not ask for it
    asked = list(client.completions.create(model="instruct", prompt="Say hi", max_tokens=5, stream=True,
                                           stream_options={"include_usage": True}))
    assert asked[-1].choices == [] and asked[-1].usage.completion_tokens == 3
    with gateway.client() as http:
        run = http.get(f"/api/requests/{raw.headers['x-gateway-request-id']}").json()
    # the streamed run is recorded with the upstream's usage and its price, like the JSON one
    assert run["wire_format"] == "openai.completions" and run["status"] == "ok" and run["stream"]
    assert run["usage"]["prompt_tokens"] > 0 and run["usage"]["completion_tokens"] == 3 and run["cost_usd"] > 0
    row = ledger_by_model(gateway)["instruct"]
    assert row["requests"] == 3 and row["completion_tokens"] == 9 and row["priced_requests"] == 3


def test_models_retrieve(gateway: RunningGateway) -> None:
    client = openai.OpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0)
    assert client.models.retrieve("embed").id == "embed"
    assert client.models.retrieve("claude-sonnet-4-5").id == "claude-sonnet-4-5"  # a wildcard entry's name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
    other = openai.OpenAI(base_url=gateway.api_base, api_key=OTHER_TENANT_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.models.retrieve("instruct")  # not among the models globex may use
    with pytest.raises(openai.NotFoundError):
        other.embeddings.create(model="instruct", input="x")


@pytest.mark.parametrize("path, body, param", [
    ("/v1/embeddings", {"model": "embed"}, "input"),
    ("/v1/embeddings", {"model": "embed", "input": [{"x": 1}]}, "input"),
    ("/v1/completions", {"model": "instruct", "prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": "x"}, "model"),
    ("/v1/completions", {"model": "instruct", "prompt": "x", "stream": True, "stream_options": "yes"}, "stream_options"),
])
def test_bad_bodies_are_400(gateway: RunningGateway, path: str, body: dict, param: str) -> None:
    with gateway.client() as http:
        response = http.post(path, json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param
