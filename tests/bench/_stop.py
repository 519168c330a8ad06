"""How the bench tests stop a harness process they started."""

from __future__ import annotations

import signal

import trio


async def stop_gently(process: trio.Process) -> None:
    """The harness stops its servers on SIGTERM; give it time before SIGKILL."""
    process.send_signal(signal.SIGTERM)
    with trio.move_on_after(30):
        await process.wait()
    if process.returncode is None:
        process.kill()
