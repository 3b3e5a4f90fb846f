"""The LiteLLM upstream's warm-up: it loads what LiteLLM's first call and first stream load, and not
LiteLLM's default encoding, which only its token counter needs (14 MB of resident memory kept for good).

In a fresh interpreter: this one's other tests may have loaded that encoding already."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

WARM_UP = """
import asyncio, json, sys
from gateway.upstream.encodings import use_bundled_encodings
use_bundled_encodings()
import litellm, tiktoken.registry
from gateway.upstream.litellm_client.client import LiteLLMUpstream
asyncio.run(LiteLLMUpstream(direct_transport=False).warm_up())
warmed = sorted(tiktoken.registry.ENCODINGS)
counting = litellm.disable_token_counter
# a count after the warm-up loads the encoding, as it did before the warm-up left it out
tokens = litellm.token_counter(model="openai/warm-up", text="a count after the warm-up")
print(json.dumps({"warmed": warmed, "counting_off": counting, "tokens": tokens,
                  "after": sorted(tiktoken.registry.ENCODINGS),
                  "streams_loaded": "litellm.litellm_core_utils.streaming_handler" in sys.modules}))
"""


def test_the_warm_up_leaves_litellms_default_encoding_unloaded_and_its_counter_on() -> None:
    done = subprocess.run([sys.executable, "-c", WARM_UP], cwd=REPO, capture_output=True, text=True, timeout=180,
                          env={"PATH": "/usr/bin:/bin", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOME": "/tmp"})
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["warmed"] == [] and found["streams_loaded"]  # the stream was warmed, no encoding loaded
    assert found["counting_off"] is False  # the counter is back on for real calls
    assert found["tokens"] > 0 and found["after"] == ["cl100k_base"]
