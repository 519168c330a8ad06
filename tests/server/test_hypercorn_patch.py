"""skippy.server._hypercorn_eof: installed by serve_app, not at import; version-guarded, idempotent."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from loguru import logger

from skippy.server import _hypercorn_eof

pytestmark = pytest.mark.server


class _TCPServer:
    """Stands in for hypercorn's TCPServer so a test can patch (or refuse to) without touching the real one."""

    async def _read_data(self) -> None: ...

    async def _idle_timeout(self) -> None: ...

    async def _initiate_server_close(self) -> None: ...


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
    monkeypatch.setattr(_hypercorn_eof.importlib.metadata, "version",
                        lambda name: version if name == "hypercorn" else real(name))


def test_importing_the_server_does_not_patch_hypercorn():
    code = ("import skippy.server, skippy.server.serve\n"
            "from hypercorn.trio.tcp_server import TCPServer\n"
            "assert not hasattr(TCPServer, '_skippy_eof_closes')\n"
            "assert skippy.server._hypercorn_eof.install() and TCPServer._skippy_eof_closes\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_installed_hypercorn_is_in_the_known_range():
    """pyproject.toml's bound and KNOWN_VERSIONS agree with what is installed: the fix is live."""
    low, high = _hypercorn_eof.KNOWN_VERSIONS
    assert low <= _hypercorn_eof._version_tuple(importlib.metadata.version("hypercorn")) < high


def test_install_patches_a_known_version_once(monkeypatch, fake_tcp_server, warnings):
    _with_version(monkeypatch, "0.18.0")
    assert _hypercorn_eof.install()
    patched = fake_tcp_server._read_data, fake_tcp_server._idle_timeout
    assert patched[0] is not _TCPServer._read_data and patched[1] is not _TCPServer._idle_timeout
    assert _hypercorn_eof.install()  # a second install leaves the first patch in place (no double wrap)
    assert (fake_tcp_server._read_data, fake_tcp_server._idle_timeout) == patched
    assert warnings == []


@pytest.mark.parametrize("version", ["0.16.0", "0.19.0", "1.0", "unknown"])
def test_install_refuses_an_unknown_version(monkeypatch, fake_tcp_server, warnings, version):
    _with_version(monkeypatch, version)
    assert not _hypercorn_eof.install()
    assert fake_tcp_server._read_data is _TCPServer._read_data
    assert fake_tcp_server._idle_timeout is _TCPServer._idle_timeout
    assert len(warnings) == 1 and "not patching" in warnings[0]


def test_install_refuses_when_the_private_methods_moved(monkeypatch, fake_tcp_server, warnings):
    _with_version(monkeypatch, "0.18.0")
    monkeypatch.delattr(_TCPServer, "_initiate_server_close")
    assert not _hypercorn_eof.install()
    assert fake_tcp_server._read_data is _TCPServer._read_data
    assert len(warnings) == 1 and "_initiate_server_close" in warnings[0]
