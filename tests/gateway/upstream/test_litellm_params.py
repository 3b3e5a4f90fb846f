"""What a request body may set on a LiteLLM call (gateway/upstream/litellm_client/params.py, gateway/upstream/litellm_client/anthropic_fields.py).

tests/gateway/upstream/test_upstream_steering.py shows the rule end to end against a running gateway."""
from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler

from gateway.errors import InvalidRequest
from gateway.upstream.litellm_client.anthropic_fields import BodyFields, betas_as_sent, place_fields
from gateway.upstream.litellm_client.params import LITELLM_OPTIONS, NAMED, refused, split_body

STEERING = ["api_base", "base_url", "api_key", "custom_llm_provider", "headers", "extra_headers", "extra_body",
            "mock_response", "deployment_id", "timeout", "max_retries", "aws_region_name", "vertex_credentials",
            "azure_ad_token", "client", "litellm_logging_obj", "model_list", "_private"]


@pytest.mark.parametrize("api", sorted(NAMED))
def test_no_documented_field_is_a_litellm_option(api: str) -> None:
    assert not NAMED[api] & LITELLM_OPTIONS
    assert not any(refused(name) for name in NAMED[api])


def test_litellm_options_are_refused_all_of_them_named() -> None:
    assert all(refused(name) for name in STEERING)
    with pytest.raises(InvalidRequest) as caught:
        split_body({"temperature": 1, "custom_llm_provider": "openrouter", "vendor_knob": 1, "headers": {}},
                   NAMED["chat"].__contains__)
    assert caught.value.status_code == 400 and caught.value.param == "custom_llm_provider"
    assert "custom_llm_provider, headers" in caught.value.message and "vendor_knob" not in caught.value.message


def test_other_fields_go_in_the_body() -> None:
    named, in_body = split_body({"temperature": 1, "vendor_knob": {"x": 1}, "metadata": {"a": "b"}},
                                NAMED["chat"].__contains__)
    assert named == {"temperature": 1}
    assert in_body == {"vendor_knob": {"x": 1}, "metadata": {"a": "b"}}  # LiteLLM's `metadata` is its own


def test_a_tool_naming_litellm_proxys_mcp_gateway_is_refused() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}, {"type": "mcp", "server_url": "litellm_proxy/mcp/x"}]
    with pytest.raises(InvalidRequest) as caught:
        split_body({"tools": tools}, NAMED["responses"].__contains__)
    assert caught.value.param == "tools[1].server_url"
    hosted = [{"type": "mcp", "server_url": "https://mcp.example.com/mcp", "server_label": "x"}]
    assert split_body({"tools": hosted}, NAMED["responses"].__contains__)[0] == {"tools": hosted}


def _kwargs(model: str, **more: Any) -> dict[str, Any]:
    return {"model": model, "api_key": "k", "messages": [], "extra_body": {"new_field": 1}, **more}


def test_messages_fields_go_where_litellms_route_sends_them() -> None:
    native = place_fields(_kwargs("anthropic/claude-sonnet-4-5", api_base="http://a.test"), {"new_field": 1})
    assert "extra_body" not in native and isinstance(native["client"], BodyFields)
    assert native["client"].fields == {"new_field": 1}
    adapted = place_fields(_kwargs("openai/gpt-4o", api_base="http://a.test/v1"), {"new_field": 1})
    assert adapted["extra_body"] == {"new_field": 1} and "client" not in adapted
    with pytest.raises(InvalidRequest) as caught:  # Bedrock signs the body: no field can be added after
        place_fields(_kwargs("bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0", aws_region_name="us-east-1"),
                     {"new_field": 1})
    assert caught.value.param == "new_field"
    assert "extra_body" not in place_fields(_kwargs("bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0",
                                                    aws_region_name="us-east-1"), {})  # the config's own: dropped


async def test_body_fields_adds_what_the_body_lacks() -> None:
    sent: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={})

    client = BodyFields(AsyncHTTPHandler(transport=httpx.MockTransport(answer)), {"new_field": 1, "model": "evil"})
    await client.post("http://a.test/v1/messages", data=json.dumps({"model": "claude", "max_tokens": 1}))
    assert sent == [{"model": "claude", "max_tokens": 1, "new_field": 1}]  # the body's own keys win


def test_the_clients_betas_keep_their_order() -> None:
    assert betas_as_sent("b-2,a-1", "a-1,b-2") == "b-2,a-1"  # LiteLLM sorted them: the client's text back
    assert betas_as_sent("b-2, a-1", "a-1,b-2,c-3") == "b-2,a-1,c-3"  # one LiteLLM added goes after them
    assert betas_as_sent("b-2,a-1", "a-1") == "a-1"  # one LiteLLM filtered out for the provider stays out


def test_context_management_to_an_adapted_deployment_takes_the_adapters_edits_only() -> None:
    kept = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}, {"type": "clear_tool_uses_20250919"}]}
    adapted = place_fields({**_kwargs("openai/gpt-4o", api_base="http://a.test/v1"), "context_management": kept}, {})
    assert adapted["context_management"] == kept
    with pytest.raises(InvalidRequest) as caught:
        place_fields({**_kwargs("openai/gpt-4o", api_base="http://a.test/v1"),
                      "context_management": {"edits": [{"type": "compact_20260112"}]}}, {})
    assert caught.value.param == "context_management.edits[0]"
    native = place_fields({**_kwargs("anthropic/claude-sonnet-4-5", api_base="http://a.test"),
                           "context_management": {"edits": [{"type": "compact_20260112"}]}}, {"new_field": 1})
    assert native["context_management"] == {"edits": [{"type": "compact_20260112"}]}  # Anthropic's: as sent
