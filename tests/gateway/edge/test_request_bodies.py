"""gateway/edge/request_bodies.py as plain ASGI: the body deadline and the process's budget of request bytes."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.edge.request_bodies import BodyBudget, RequestBodies
from gateway.errors import RequestTimeout, ServiceUnavailable

MAX_BODY = 1000


def _scope(length: int | None) -> dict[str, Any]:
    headers = [(b"host", b"x")] + ([(b"content-length", str(length).encode())] if length is not None else [])
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}


class _Client:
    """The server's side of `receive`: the body in `parts`, then (once the body is read) nothing until
    the client leaves; `stall` before part `n` never sends it."""

    def __init__(self, parts: list[bytes], stall: int | None = None) -> None:
        self.parts = parts
        self.stall = stall
        self.sent = 0
        self.left = asyncio.Event()

    async def __call__(self) -> dict[str, Any]:
        if self.sent == self.stall:
            await asyncio.Event().wait()
        if self.sent < len(self.parts):
            self.sent += 1
            return {"type": "http.request", "body": self.parts[self.sent - 1], "more_body": self.sent < len(self.parts)}
        await self.left.wait()
        return {"type": "http.disconnect"}


class _App:
    """Reads the whole body, notes what the budget held meanwhile, and answers (or raises what it met)."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.held_while_reading: list[int] = []
        self.error: Exception | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            while True:
                message = await receive()
                self.held_while_reading.append(self.budget.held)
                if not message.get("more_body"):
                    break
        except (RequestTimeout, ServiceUnavailable) as error:
            self.error = error
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        self.held_while_reading.append(self.budget.held)  # after the response started
        await send({"type": "http.response.body", "body": b"ok"})


async def _run(app: Any, scope: dict[str, Any], client: _Client, budget: BodyBudget,
               timeout: float = 5.0) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await RequestBodies(app, timeout_seconds=timeout, budget=budget, max_body_bytes=MAX_BODY)(scope, client, send)
    return sent


def test_a_declared_body_is_held_whole_while_read_and_given_back_when_the_answer_starts() -> None:
    budget = BodyBudget(MAX_BODY)
    app = _App(budget)
    asyncio.run(_run(app, _scope(600), _Client([b"x" * 300, b"y" * 300]), budget))
    assert app.held_while_reading == [600, 600, 0] and budget.held == 0


def test_a_chunked_body_is_counted_as_it_comes() -> None:
    budget = BodyBudget(MAX_BODY)
    app = _App(budget)
    asyncio.run(_run(app, _scope(None), _Client([b"x" * 100, b"y" * 250]), budget))
    assert app.held_while_reading == [100, 350, 0] and budget.held == 0


def test_a_body_that_does_not_fit_beside_the_others_is_refused_before_it_is_read() -> None:
    budget = BodyBudget(MAX_BODY)
    assert budget.take(700)  # another request's
    app = _App(budget)
    client = _Client([b"x" * 400])
    asyncio.run(_run(app, _scope(400), client, budget))
    assert isinstance(app.error, ServiceUnavailable) and app.error.status_code == 503
    assert app.error.code == "server_busy" and app.error.headers == {"retry-after": "1"}
    assert client.sent == 0 and budget.held == 700


def test_a_body_larger_than_the_whole_budget_is_read_when_it_is_the_only_one() -> None:
    """As after a reload that raised `max_body_bytes` past the budget the process started with."""
    budget = BodyBudget(MAX_BODY // 2)
    app = _App(budget)
    asyncio.run(_run(app, _scope(800), _Client([b"x" * 800]), budget))
    assert app.error is None and app.held_while_reading == [800, 0] and budget.held == 0


def test_a_chunked_body_passing_the_budget_midway_is_refused_and_gives_back_what_it_held() -> None:
    budget = BodyBudget(MAX_BODY)
    assert budget.take(500)
    app = _App(budget)
    asyncio.run(_run(app, _scope(None), _Client([b"x" * 400, b"y" * 400]), budget))
    assert isinstance(app.error, ServiceUnavailable) and budget.held == 500


def test_a_body_that_stops_arriving_is_a_408_that_closes_the_connection() -> None:
    budget = BodyBudget(MAX_BODY)
    app = _App(budget)
    asyncio.run(_run(app, _scope(600), _Client([b"x" * 300, b"y" * 300], stall=1), budget, timeout=0.2))
    assert isinstance(app.error, RequestTimeout) and app.error.status_code == 408
    assert app.error.headers == {"connection": "close"} and "0.2 s" in app.error.message
    assert budget.held == 0


def test_once_the_body_is_read_receive_waits_for_the_client_without_a_deadline() -> None:
    """A stream listens on `receive` for the client leaving, for as long as it lasts."""
    budget = BodyBudget(MAX_BODY)

    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["more_body"] is False
        await send({"type": "http.response.start", "status": 200, "headers": []})
        assert (await receive())["type"] == "http.disconnect"  # after the deadline has passed
        await send({"type": "http.response.body", "body": b""})

    async def scenario() -> None:
        client = _Client([b"{}"])
        asyncio.get_running_loop().call_later(0.3, client.left.set)
        await _run(streaming, _scope(2), client, budget, timeout=0.1)

    asyncio.run(scenario())
    assert budget.held == 0


@pytest.mark.parametrize("length", [MAX_BODY + 1, 10**12])
def test_a_body_declared_past_the_largest_allowed_is_left_to_the_route(length: int) -> None:
    """Its route refuses it unread as too large (400 request_too_large); the budget takes nothing for it."""
    budget = BodyBudget(MAX_BODY)
    app = _App(budget)
    asyncio.run(_run(app, _scope(length), _Client([b"x" * 10]), budget))
    assert app.error is None and app.held_while_reading == [10, 0]


def test_the_budget_is_given_back_when_the_app_fails() -> None:
    budget = BodyBudget(MAX_BODY)

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        raise RuntimeError("a fault")

    with pytest.raises(RuntimeError):
        asyncio.run(_run(failing, _scope(300), _Client([b"x" * 300]), budget))
    assert budget.held == 0
