"""The fake upstream (gateway/fake_upstream/) in a thread of the test process, on a free port.

`with FakeUpstream() as fake: fake.script_message(...)` queues answers step by
step (an assistant message, an HTTP error, a delay, a broken stream) for
`/v1/chat/completions`, `/v1/responses` and `/v1/messages` alike; `fake.requests`
holds every request body and its headers. `fake.state.responder` (and
`responses_responder`, `chat_responder`) answers from the conversation instead,
as agent mode does (gateway/fake_upstream/agent.py). Standalone, as users run it:
`gateway fake-upstream --port 18080`.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

import uvicorn

from gateway.fake_upstream.app import build_app
from gateway.fake_upstream.state import FakeState, Step


class ServerThread:
    """A uvicorn server for `app` in a background thread, on a free port."""

    def __init__(self, app: Any, port: int = 0) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 120  # a loaded 2-core machine takes a while to import LiteLLM
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class FakeUpstream:
    def __init__(self, port: int = 0, wrap: Callable[[Any], Any] | None = None) -> None:
        """`wrap`: ASGI middleware to serve the fake's app behind (testkit/listeners.py records with it)."""
        self.state = FakeState()
        app = build_app(self.state)
        self._server = ServerThread(app if wrap is None else wrap(app), port)

    def __enter__(self) -> "FakeUpstream":
        self._server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.stop()

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def api_base(self) -> str:
        return f"{self._server.url}/v1"

    def reset(self) -> None:
        self.state.clear()

    def script(self, **step: Any) -> None:
        with self.state.lock:
            self.state.script.append(Step(**step))

    def script_message(self, message: dict[str, Any], **step: Any) -> None:
        self.script(message=message, **step)

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return list(self.state.requests)

    def last_body(self) -> dict[str, Any]:
        return self.requests[-1]["body"]
