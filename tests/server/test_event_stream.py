"""EventStream against a bare ASGI send/receive: bytes in order, the feeder beside the body, and a
client that leaves cancels the body generator (its `finally` runs) and the feeder."""

from __future__ import annotations

import trio
import trio.testing

from skippy.server.event_stream import EventStream

SCOPE = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}


class Client:
    """The ASGI side of one connection: what the response sent, and a disconnect to trigger."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.left = trio.Event()

    async def receive(self) -> dict:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        await trio.lowlevel.checkpoint()

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


async def test_the_body_goes_out_in_order_and_the_response_ends() -> None:
    async def body():
        for i in range(5):
            yield f"data: {i}\r\n\r\n".encode()

    client = Client()
    with trio.fail_after(5):
        await EventStream(body())(SCOPE, client.receive, client.send)
    assert client.body == b"".join(f"data: {i}\r\n\r\n".encode() for i in range(5))
    start = client.sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert headers[b"x-accel-buffering"] == b"no"
    assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


async def test_the_feeder_runs_beside_the_body_and_is_cancelled_when_it_ends() -> None:
    tx, rx = trio.open_memory_channel(0)
    fed_to_the_end = []

    async def feeder() -> None:
        async with tx:
            for i in range(3):
                await tx.send(i)
            await trio.sleep_forever()  # only the end of the body stops it
        fed_to_the_end.append(True)

    async def body():
        for _ in range(3):
            yield f"data: {await rx.receive()}\r\n\r\n".encode()

    client = Client()
    with trio.fail_after(5):
        await EventStream(body(), feeder=feeder)(SCOPE, client.receive, client.send)
    assert client.body == b"data: 0\r\n\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n"
    assert not fed_to_the_end


async def test_a_client_that_leaves_cancels_the_body_and_its_cleanup_runs() -> None:
    cleaned = trio.Event()
    first_sent = trio.Event()

    async def body():
        try:
            yield b"data: 0\r\n\r\n"
            first_sent.set()
            await trio.sleep_forever()  # waiting for a token that never comes
            yield b"data: never\r\n\r\n"
        finally:
            cleaned.set()

    client = Client()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(EventStream(body()), SCOPE, client.receive, client.send)
            await first_sent.wait()
            client.left.set()
        assert cleaned.is_set()
    assert client.body == b"data: 0\r\n\r\n"
    assert not any(m.get("more_body") is False for m in client.sent)  # no orderly end: the client is gone


async def test_a_write_that_fails_closes_the_suspended_body() -> None:
    cleaned = trio.Event()

    async def body():
        try:
            yield b"data: 0\r\n\r\n"
            yield b"data: 1\r\n\r\n"
        finally:
            cleaned.set()

    client = Client()

    async def failing_send(message: dict) -> None:
        if message["type"] == "http.response.body":
            raise OSError("connection reset")
        await client.send(message)

    with trio.fail_after(5):
        try:
            await EventStream(body())(SCOPE, client.receive, failing_send)
        except* OSError:
            pass
        else:
            raise AssertionError("the failed write must surface")
    assert cleaned.is_set()  # the generator was suspended at its first yield and is closed, not left to GC
