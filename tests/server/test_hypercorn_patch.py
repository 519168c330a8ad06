"""skippy.server._hypercorn_trio: installed by serve_app, not at import; version-guarded, idempotent; the
uncontended write keeps the lock's order and cancellation and skips only its yield."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
import trio
import trio.testing
from loguru import logger

from skippy.server import _hypercorn_trio

pytestmark = pytest.mark.server


class _TCPServer:
    """Stands in for hypercorn's TCPServer so a test can patch (or refuse to) without touching the real one."""

    async def _read_data(self) -> None: ...

    async def _idle_timeout(self) -> None: ...

    async def _initiate_server_close(self) -> None: ...

    async def protocol_send(self, event) -> None: ...


@pytest.fixture
def fake_tcp_server(monkeypatch):
    import hypercorn.trio.tcp_server as module

    cls = type("TCPServer", (_TCPServer,), {})
    monkeypatch.setattr(module, "TCPServer", cls)
    return cls


@pytest.fixture
def warnings():
    seen: list[str] = []
    logger.enable("skippy")
    sink = logger.add(lambda m: seen.append(m.record["message"]), level="WARNING")
    yield seen
    logger.remove(sink)
    logger.disable("skippy")


def _with_version(monkeypatch, version: str) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(_hypercorn_trio.importlib.metadata, "version",
                        lambda name: version if name == "hypercorn" else real(name))


def test_importing_the_server_does_not_patch_hypercorn():
    code = ("import skippy.server, skippy.server.serve\n"
            "from hypercorn.trio.tcp_server import TCPServer\n"
            "assert not hasattr(TCPServer, '_skippy_patched')\n"
            "assert skippy.server._hypercorn_trio.install() and TCPServer._skippy_patched\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_installed_hypercorn_is_in_the_known_range():
    """pyproject.toml's bound and KNOWN_VERSIONS agree with what is installed: the fix is live."""
    low, high = _hypercorn_trio.KNOWN_VERSIONS
    assert low <= _hypercorn_trio._version_tuple(importlib.metadata.version("hypercorn")) < high


def test_install_patches_a_known_version_once(monkeypatch, fake_tcp_server, warnings):
    _with_version(monkeypatch, "0.18.0")
    assert _hypercorn_trio.install()
    patched = fake_tcp_server._read_data, fake_tcp_server._idle_timeout, fake_tcp_server.protocol_send
    assert patched[0] is not _TCPServer._read_data and patched[1] is not _TCPServer._idle_timeout
    assert patched[2] is not _TCPServer.protocol_send
    assert _hypercorn_trio.install()  # a second install leaves the first patch in place (no double wrap)
    assert (fake_tcp_server._read_data, fake_tcp_server._idle_timeout, fake_tcp_server.protocol_send) == patched
    assert warnings == []


@pytest.mark.parametrize("version", ["0.16.0", "0.19.0", "1.0", "unknown"])
def test_install_refuses_an_unknown_version(monkeypatch, fake_tcp_server, warnings, version):
    _with_version(monkeypatch, version)
    assert not _hypercorn_trio.install()
    assert fake_tcp_server._read_data is _TCPServer._read_data
    assert fake_tcp_server._idle_timeout is _TCPServer._idle_timeout
    assert fake_tcp_server.protocol_send is _TCPServer.protocol_send
    assert len(warnings) == 1 and "not patching" in warnings[0]


def test_install_refuses_when_the_private_methods_moved(monkeypatch, fake_tcp_server, warnings):
    _with_version(monkeypatch, "0.18.0")
    monkeypatch.delattr(_TCPServer, "_initiate_server_close")
    assert not _hypercorn_trio.install()
    assert fake_tcp_server._read_data is _TCPServer._read_data
    assert len(warnings) == 1 and "_initiate_server_close" in warnings[0]


# -- the uncontended write, on hypercorn's own protocol_send wrapped as install() wraps it ----------


class _Conn:
    """What protocol_send touches on a TCPServer: its send lock, its stream, its protocol."""

    def __init__(self, broken: bool = False, order: list[str] | None = None) -> None:
        self.order = order if order is not None else []
        self.send_lock = trio.Lock()
        self.written: list[bytes] = []
        self.handled: list[object] = []
        self.broken = broken
        self.stream = self
        self.protocol = self

    async def send_all(self, data: bytes) -> None:
        if self.broken:
            raise trio.BrokenResourceError
        self.order.append("write")
        self.written.append(data)
        await trio.lowlevel.checkpoint()

    async def handle(self, event: object) -> None:
        self.handled.append(event)


def _send():
    from hypercorn.trio.tcp_server import TCPServer

    original = getattr(TCPServer, "_skippy_original_protocol_send", TCPServer.protocol_send)
    return _hypercorn_trio._uncontended_write(original)


async def test_a_free_lock_is_taken_without_a_yield_before_the_write():
    from hypercorn.events import RawData

    order: list[str] = []
    send, conn = _send(), _Conn(order=order)

    async def other() -> None:
        order.append("other task")

    async def write(nursery: trio.Nursery) -> None:
        nursery.start_soon(other)  # runnable from the write's first yield on
        await send(conn, RawData(b"token"))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write, nursery)
    assert conn.written == [b"token"] and not conn.send_lock.locked()
    # hypercorn's own `async with send_lock` yields before the write, and `other` runs there
    assert order == ["write", "other task"]


async def test_a_held_lock_is_waited_for_and_writes_stay_in_order():
    from hypercorn.events import RawData

    send, conn = _send(), _Conn()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await conn.send_lock.acquire()
            nursery.start_soon(send, conn, RawData(b"second"))
            await trio.testing.wait_all_tasks_blocked()
            assert conn.written == []  # it waits for the holder
            conn.written.append(b"first")
            conn.send_lock.release()
    assert conn.written == [b"first", b"second"] and not conn.send_lock.locked()


async def test_a_cancelled_caller_raises_before_writing():
    from hypercorn.events import RawData

    send, conn = _send(), _Conn()
    with trio.fail_after(5):
        with trio.CancelScope() as scope:
            scope.cancel()
            await send(conn, RawData(b"late"))
    assert scope.cancelled_caught and conn.written == [] and not conn.send_lock.locked()


async def test_a_broken_stream_reports_closed_and_frees_the_lock():
    from hypercorn.events import Closed, RawData

    send, conn = _send(), _Conn(broken=True)
    with trio.fail_after(5):
        await send(conn, RawData(b"x"))
    assert conn.handled == [Closed()] and not conn.send_lock.locked()


# -- the write without a yield, on a real socket pair ----------------------------------------------


class _SocketConn(_Conn):
    """A TCPServer's write side over a real trio SocketStream (one end of a socket pair)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__()
        self.stream = stream


def _socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


async def _read_exactly(stream: trio.SocketStream, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = await stream.receive_some(65536)
        assert chunk, "the writer closed early"
        got += chunk
    return bytes(got)


async def test_a_write_the_socket_takes_at_once_makes_no_yield():
    from hypercorn.events import RawData

    order: list[str] = []
    ours, peer = _socket_pair()
    send, conn = _send(), _SocketConn(ours)

    async def other() -> None:
        order.append("other task")

    async def write(nursery: trio.Nursery) -> None:
        nursery.start_soon(other)  # runnable from the write's first yield on
        await send(conn, RawData(b"data: token\n\n"))
        order.append("written")

    with trio.fail_after(5):
        async with ours, peer, trio.open_nursery() as nursery:
            nursery.start_soon(write, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert await _read_exactly(peer, 13) == b"data: token\n\n"
    # trio's send_all yields after the send, and `other` would run before "written"
    assert order == ["written", "other task"] and not conn.send_lock.locked()


async def test_what_the_socket_does_not_take_at_once_follows_whole_and_in_order():
    from hypercorn.events import RawData

    ours, peer = _socket_pair()
    send, conn = _send(), _SocketConn(ours)
    big = bytes(range(256)) * 16384  # 4 MiB: more than a socket pair's buffers hold
    with trio.fail_after(10):
        async with ours, peer, trio.open_nursery() as nursery:
            nursery.start_soon(send, conn, RawData(big))
            await trio.testing.wait_all_tasks_blocked()  # part written, the rest waiting to drain
            assert conn.send_lock.locked()
            nursery.start_soon(send, conn, RawData(b"after"))  # waits for the lock, then follows
            got = await _read_exactly(peer, len(big) + 5)
    assert got == big + b"after" and not conn.send_lock.locked() and conn.handled == []


async def test_a_peer_that_left_reports_closed_on_the_direct_write():
    from hypercorn.events import Closed, RawData

    ours, peer = _socket_pair()
    send, conn = _send(), _SocketConn(ours)
    with trio.fail_after(5):
        async with ours:
            await peer.aclose()
            await send(conn, RawData(b"x"))  # the first write after the peer left may still be taken
            await send(conn, RawData(b"y"))
    assert conn.handled and conn.handled[-1] == Closed() and not conn.send_lock.locked()
