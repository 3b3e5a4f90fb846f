"""The offline demo model answers Anthropic clients too, JSON and streamed (LiteLLM's mock answers whole)."""
from __future__ import annotations

import anthropic

from testkit.gateway import TENANT_KEY, RunningGateway


def test_the_demo_model_answers_in_both_modes(gateway: RunningGateway) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key=TENANT_KEY, max_retries=0)
    message = client.messages.create(model="demo", max_tokens=32, messages=[{"role": "user", "content": "hello"}])
    assert message.content[0].text == "demo says hi"
    with client.messages.stream(model="demo", max_tokens=32, messages=[{"role": "user", "content": "hello"}]) as live:
        text = "".join(live.text_stream)
        final = live.get_final_message()
    assert text == "demo says hi" and final.stop_reason == "end_turn"
