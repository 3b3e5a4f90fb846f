"""The OpenAI Agents SDK, with its default settings (the Responses API), runs a tool loop through the gateway."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from gateway.fake_upstream.state import Step
from testkit.gateway import TENANT_KEY, RunningGateway, settings_for, start_gateway
from testkit.fake_upstream import FakeUpstream

REPORT = "\n".join(f"sensor {i}: reading {i * 3.5:.1f} within bounds" for i in range(120))


@pytest.fixture
def gateway(fake: FakeUpstream, sqlite_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    models = [{"name": "gpt-4.1", "litellm_params": {"model": "openai/gpt-4.1", "api_base": fake.api_base,
                                                      "api_key": "sk-upstream"}}]
    running, server = start_gateway(settings_for(fake.api_base, sqlite_url, tmp_path, models=models), fake)
    yield running
    server.stop()
    fake.state.responses_responder = None


def agent_model(body: dict[str, Any]) -> Step:
    """Call read_sensors for each of three sites, one per turn, then answer."""
    done = [i for i in body["input"] if i.get("type") == "function_call_output"]
    if len(done) < 3:
        return Step(message={"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_s{len(done)}", "type": "function",
             "function": {"name": "read_sensors", "arguments": json.dumps({"site": f"site-{len(done)}"})}}]})
    return Step(message={"role": "assistant", "content": "All three sites are within bounds."})


async def test_the_agents_sdk_runs_its_tool_loop_through_the_gateway(gateway: RunningGateway) -> None:
    from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI

    calls: list[str] = []

    @function_tool
    def read_sensors(site: str) -> str:
        """Read every sensor of a site."""
        calls.append(site)
        return f"{site}\n{REPORT}"

    gateway.fake.state.responses_responder = agent_model
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=gateway.api_base, api_key=TENANT_KEY, max_retries=0),
                              use_for_tracing=False)
    agent = Agent(name="inspector", instructions="Inspect every site.", model="gpt-4.1", tools=[read_sensors])
    result = await Runner.run(agent, "Check the three sites.")
    assert result.final_output == "All three sites are within bounds."
    assert calls == ["site-0", "site-1", "site-2"]
    bodies = [r["body"] for r in gateway.fake.requests if r.get("path") == "/v1/responses"]
    assert len(bodies) == 4
    last = bodies[-1]["input"]
    outputs = [i for i in last if i.get("type") == "function_call_output"]
    assert len(outputs) == 3 and outputs[-1]["output"].startswith("site-2")
    with gateway.client() as http:
        savings = http.get("/api/savings").json()["totals"]
    assert savings["requests"] == 4 and savings["tokens_forwarded"] <= savings["tokens_sent"]
