"""What a client reads of an upstream failure (gateway/upstream/errors.py): the provider's short message."""
from __future__ import annotations

import logging

import pytest

from gateway.upstream.errors import MAX_CHARS, client_message, log_upstream_error


@pytest.mark.parametrize("text, said", [
    ("litellm.BadRequestError: OpenAIException - bad temperature", "bad temperature"),
    ('litellm.ContextWindowExceededError: litellm.BadRequestError: AnthropicError - {"type":"error","error":'
     '{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens"}}', "prompt is too long: 210000 tokens"),
    ("Error code: 400 - {'error': {'message': 'Invalid value: tools[0]', 'type': 'x', 'param': None}}",
     "Invalid value: tools[0]"),
    ("litellm.NotFoundError: AzureException NotFoundError - Error code: 404", ""),
    ('{"detail": "model not loaded"}', "model not loaded"),
])
def test_the_providers_own_message_is_kept(text: str, said: str) -> None:
    assert client_message(text) == said


def test_no_traceback_path_version_or_address_is_kept() -> None:
    text = ("litellm.APIConnectionError: OpenAIException - Cannot connect to host gpu-7.internal:8443 "
            "(10.0.3.7) via http://10.0.3.7:8443/v1 litellm==1.110.2 Python 3.11.7 "
            "/opt/venv/lib/python3.11/site-packages/litellm/main.py\n"
            "Traceback (most recent call last):\n  File \"/opt/venv/lib/python3.11/site-packages/x.py\", line 1")
    said = client_message(text)
    for leak in ("Traceback", "site-packages", "main.py", "gpu-7.internal", "10.0.3.7", "8443", "1.110.2", "3.11"):
        assert leak not in said, (leak, said)
    assert said.startswith("Cannot connect to host")


def test_the_deployments_own_address_is_hidden_and_the_length_bounded() -> None:
    assert "vllm.corp" not in client_message("upstream vllm.corp/v1 says no", hidden=["vllm.corp/v1"])
    assert len(client_message("x" * 5000)) == MAX_CHARS


def test_the_whole_text_goes_to_the_log_with_the_request_id(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.upstream"):
        log_upstream_error("req_1", "APIConnectionError", "Traceback (most recent call last): ...")
    [record] = caplog.records
    assert record.fields == {"request_id": "req_1", "error_type": "APIConnectionError",  # type: ignore[attr-defined]
                             "upstream_error": "Traceback (most recent call last): ..."}
