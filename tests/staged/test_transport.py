"""FrameStream: whole frames over trio streams, refusing bad ones without losing its place."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import trio
import trio.testing

from skippy.staged import (
    HEADER_SIZE,
    Activations,
    FrameError,
    FrameStream,
    Hello,
    Release,
    StageDisconnected,
    Token,
    connect,
    encode,
)

pytestmark = pytest.mark.staged

TOKEN = Token(1, 42, 7, None)


def big_activations(request_id: int = 1, n_tokens: int = 256, n_embd: int = 1024) -> Activations:
    """2 MiB of hidden state: many reads and (on a lockstep stream) many partial writes."""
    hidden = np.arange(n_tokens * n_embd, dtype=np.float32).reshape(n_tokens, n_embd)
    return Activations(request_id, 0, np.arange(n_tokens, dtype=np.int32), hidden, True)


def raw_and_framed(**kwargs) -> tuple[trio.abc.Stream, FrameStream]:
    """A raw byte stream writing to a FrameStream reading, to send arbitrary bytes."""
    raw, other = trio.testing.memory_stream_pair()
    return raw, FrameStream(other, **kwargs)


async def test_messages_flow_both_ways_then_clean_eof_is_none():
    left, right = (FrameStream(s) for s in trio.testing.memory_stream_pair())
    with trio.fail_after(5):
        await left.send(TOKEN)
        await right.send(Release(1, "done"))
        assert await right.receive() == TOKEN
        assert await left.receive() == Release(1, "done")
        await left.aclose()
        assert await right.receive() is None


@pytest.mark.parametrize("keep", [HEADER_SIZE - 1, len(encode(TOKEN)) - 1], ids=["in-header", "in-payload"])
async def test_eof_mid_frame_is_a_disconnect(keep):
    raw, link = raw_and_framed()
    with trio.fail_after(5):
        await raw.send_all(encode(TOKEN)[:keep])
        await raw.aclose()
        with pytest.raises(StageDisconnected, match=f"closed mid-frame: {keep} of"):
            await link.receive()


async def test_oversized_frame_is_refused_from_its_header_and_the_stream_stays_dead():
    raw, link = raw_and_framed(max_frame_bytes=1024)
    frame = encode(big_activations())
    with trio.fail_after(5):
        await raw.send_all(frame[: HEADER_SIZE + 10])  # the payload never arrives: waiting for it would hang
        with pytest.raises(FrameError, match="larger than the configured maximum 1024") as caught:
            await link.receive()
        assert caught.value.resync is False
        await raw.send_all(encode(TOKEN))
        with pytest.raises(FrameError, match="lost frame sync"):
            await link.receive()


async def test_bad_payload_is_skipped_and_the_next_frame_received():
    raw, link = raw_and_framed()
    bad = bytearray(encode(big_activations(n_tokens=2, n_embd=4)))
    bad[HEADER_SIZE + 20] = 9  # dtype code
    with trio.fail_after(5):
        await raw.send_all(bytes(bad) + encode(TOKEN))
        with pytest.raises(FrameError, match="dtype code 9") as caught:
            await link.receive()
        assert caught.value.resync is True
        assert await link.receive() == TOKEN


async def test_send_refuses_a_frame_over_the_maximum_and_writes_nothing():
    raw, link = raw_and_framed(max_frame_bytes=1024)
    with trio.fail_after(5):
        with pytest.raises(FrameError, match="refusing to send") as caught:
            await link.send(big_activations())
        assert caught.value.resync is True
        await link.send(TOKEN)
        assert await raw.receive_some() == encode(TOKEN)


async def test_concurrent_senders_never_interleave(nursery):
    # A lockstep stream hands bytes over piece by piece as the reader asks for them, so an
    # unserialised second send_all would collide with the first (trio raises BusyResourceError).
    a, b = trio.testing.lockstep_stream_pair()
    sender, receiver = FrameStream(a), FrameStream(b)
    sent = {rid: [big_activations(rid, n_tokens=8), Token(rid, rid, 0, None)] for rid in range(1, 5)}
    with trio.fail_after(5):
        for msgs in sent.values():
            nursery.start_soon(_send_all, sender, msgs)
        received = [await receiver.receive() for _ in range(2 * len(sent))]
    for rid, msgs in sent.items():
        assert [m for m in received if m.request_id == rid] == msgs


async def _send_all(link: FrameStream, msgs) -> None:
    for msg in msgs:
        await link.send(msg)


async def test_a_send_cancelled_mid_frame_ends_the_link(nursery):
    a, raw = trio.testing.lockstep_stream_pair()
    sender = FrameStream(a)
    scope = trio.CancelScope()

    async def send_cancellable() -> None:
        with scope:
            await sender.send(big_activations())

    with trio.fail_after(5):
        nursery.start_soon(send_cancellable)
        await trio.testing.wait_all_tasks_blocked()
        assert len(await raw.receive_some(1000)) == 1000  # part of the frame is out
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert scope.cancelled_caught
        with pytest.raises(StageDisconnected, match="stopped mid-frame"):
            await sender.send(TOKEN)


async def test_cancelled_receive_loses_nothing(nursery):
    raw, link = raw_and_framed()
    frame = encode(TOKEN)
    scope = trio.CancelScope()

    async def receive_cancellable() -> None:
        with scope:
            await link.receive()

    with trio.fail_after(5):
        await raw.send_all(frame[: HEADER_SIZE + 3])
        nursery.start_soon(receive_cancellable)
        await trio.testing.wait_all_tasks_blocked()  # header read, waiting for the payload
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert scope.cancelled_caught
        await raw.send_all(frame[HEADER_SIZE + 3 :])
        assert await link.receive() == TOKEN


async def test_a_second_concurrent_receiver_is_refused(nursery):
    _, link = raw_and_framed()
    with trio.fail_after(5):
        nursery.start_soon(link.receive)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await link.receive()
        nursery.cancel_scope.cancel()


async def _broken(*args) -> None:
    raise trio.BrokenResourceError("connection reset")


async def test_a_broken_connection_is_a_disconnect():
    link = FrameStream(
        trio.StapledStream(
            trio.testing.MemorySendStream(send_all_hook=_broken),
            trio.testing.MemoryReceiveStream(receive_some_hook=_broken),
        )
    )
    with trio.fail_after(5):
        with pytest.raises(StageDisconnected, match="while sending"):
            await link.send(TOKEN)
        with pytest.raises(StageDisconnected, match="connection broke"):
            await link.receive()


async def test_loopback_tcp_echo(nursery):
    async def echo(stream: trio.SocketStream) -> None:
        async with FrameStream(stream) as link:
            while (msg := await link.receive()) is not None:
                await link.send(msg)

    msgs = [Hello(0, 2, 0, 3, 6, 128, "digest"), big_activations(), TOKEN]
    with trio.fail_after(5):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, echo, listeners)
        async with await connect("127.0.0.1", port) as link:
            assert link.stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            for msg in msgs:
                await link.send(msg)
            assert [await link.receive() for _ in msgs] == msgs
        nursery.cancel_scope.cancel()
