"""Every string a user controls reaches the dashboard escaped (issue 8: a filter error came back raw)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator
from urllib.parse import quote

import httpx
import pytest

from testkit.gateway import ADMIN_KEY, TENANT_KEY, RunningGateway, dashboard_sign_in

SCRIPT = "<script>alert(1)</script>"
ATTRIBUTE = '"><img src=x onerror=alert(2)>'


@contextmanager
def signed_in(gateway: RunningGateway, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        response = dashboard_sign_in(client, key)
        assert response.status_code in (200, 303), response.text
        yield client


def assert_escaped(page: str) -> None:
    assert SCRIPT not in page and "<img src=x" not in page
    assert "onerror=alert(2)>" not in page.replace("&gt;", ">").replace("&#34;", '"') or "&lt;img" in page


@pytest.mark.parametrize("key", [TENANT_KEY, ADMIN_KEY], ids=["tenant", "admin"])
@pytest.mark.parametrize("parameter", ["start", "end", "model", "tenant"])
@pytest.mark.parametrize("payload", [SCRIPT, ATTRIBUTE])
def test_script_in_every_overview_parameter_is_escaped(gateway: RunningGateway, key: str, parameter: str,
                                                       payload: str) -> None:
    with signed_in(gateway, key) as client:
        response = client.get(f"/dashboard?{parameter}={quote(payload)}")
    assert response.status_code in (200, 400, 404)
    assert_escaped(response.text)


@pytest.mark.parametrize("key", [TENANT_KEY, ADMIN_KEY], ids=["tenant", "admin"])
@pytest.mark.parametrize("parameter", ["from", "to", "model", "policy_version", "tenant"])
@pytest.mark.parametrize("payload", [SCRIPT, ATTRIBUTE])
def test_script_in_every_evaluation_parameter_is_escaped(gateway: RunningGateway, key: str, parameter: str,
                                                         payload: str) -> None:
    with signed_in(gateway, key) as client:
        response = client.get(f"/dashboard/evaluation?{parameter}={quote(payload)}")
    assert response.status_code in (200, 400, 404)
    assert_escaped(response.text)


def test_script_in_labels_participants_and_content_is_escaped(gateway: RunningGateway) -> None:
    messages = [{"role": "system", "content": SCRIPT}, {"role": "user", "content": ATTRIBUTE},
                {"role": "assistant", "content": None, "name": SCRIPT, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "t", "arguments": '{"q": "' + SCRIPT + '"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": SCRIPT * 40}]
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "fake", "messages": messages},
                             headers={"x-gateway-session": SCRIPT, "x-gateway-participant": ATTRIBUTE})
        assert response.status_code == 200
    request_id = response.headers["x-gateway-request-id"]
    with signed_in(gateway, TENANT_KEY) as client:
        overview = client.get("/dashboard")
        inspector = client.get(f"/dashboard/requests/{request_id}")
        missing = client.get(f"/dashboard/requests/{quote(SCRIPT, safe='')}")
    assert overview.status_code == 200 and "&lt;script&gt;" in overview.text
    assert inspector.status_code == 200 and "&lt;script&gt;" in inspector.text
    assert missing.status_code == 404
    for page in (overview.text, inspector.text):
        assert_escaped(page)
    # A path that matches no page is answered in JSON, which no browser renders as HTML.
    assert missing.headers["content-type"] == "application/json"
    assert missing.headers["x-content-type-options"] == "nosniff"
