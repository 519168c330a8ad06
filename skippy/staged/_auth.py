"""Stage link authentication: a shared secret, proven both ways by HMAC challenge-response in
the Hello exchange, before a connection can start (or displace) a session.

Why: a stage takes activations from whoever connects and the newest connection wins, so on a
network any peer could feed it frames or take the pipeline's session away. With a secret
(`--secret-file PATH` or `$SKIPPY_STAGE_SECRET`) the handshake is:

    upstream -> Hello(nonce=Nu)                               Nu: 32 fresh random bytes
    stage    -> Auth(mac=HMAC(K, "stage"    | Nu | Ns | Hello), nonce=Ns)   Ns: 32 fresh bytes
    upstream -> Auth(mac=HMAC(K, "upstream" | Nu | Ns | Hello))  (only once the stage's MAC checks)
    stage    -> the Hello reply, as without a secret (after reaching the next stage)

The secret never crosses the wire. Each side's MAC covers the other side's fresh nonce, so a
recorded answer is worthless in the next handshake (replay); the role labels keep one side's
MAC from being reflected back as the other's; MACs are compared in constant time. What this
does not do: encrypt or integrity-protect the frames after the handshake (an on-path attacker
could still read or alter them): that is TLS on the link (see _tls), which composes with this.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path
from typing import Mapping

import attrs
import trio
from loguru import logger

from ..errors import SkippyError
from ._frames import NONCE_BYTES, Auth, Error, Hello, Message, encode
from ._transport import FrameStream

ENV_VAR = "SKIPPY_STAGE_SECRET"
MIN_SECRET_BYTES = 16
_STAGE, _UPSTREAM = b"skippy-stage-v3 stage", b"skippy-stage-v3 upstream"


class StageSecretError(SkippyError):
    """The stage secret is missing, unreadable or too short to be one."""


def load_secret(path: os.PathLike[str] | str | None = None, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The secret from `path` (trailing whitespace stripped), else from $SKIPPY_STAGE_SECRET, else None."""
    env = os.environ if environ is None else environ
    if path is not None:
        try:
            data = Path(path).read_bytes().rstrip()
            mode = Path(path).stat().st_mode
        except OSError as exc:
            raise StageSecretError(f"cannot read the stage secret file {str(path)!r}: {exc.strerror or exc}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            logger.warning("the stage secret file {} is readable by others (chmod 600 it)", path)
        where = f"the stage secret file {str(path)!r}"
    elif env.get(ENV_VAR):
        data, where = env[ENV_VAR].encode(), f"${ENV_VAR}"
    else:
        return None
    if len(data) < MIN_SECRET_BYTES:
        raise StageSecretError(f"{where} holds {len(data)} bytes; a stage secret needs at least {MIN_SECRET_BYTES} "
                               "(e.g. head -c 32 /dev/urandom | base64 > FILE)")
    return data


def new_secret() -> str:
    """A fresh random secret as text (for stages a launcher starts itself)."""
    return secrets.token_hex(32)


def mac(secret: bytes, role: bytes, hello: Hello, stage_nonce: bytes) -> bytes:
    """HMAC-SHA256 over a role label, both nonces and upstream's whole Hello frame."""
    return hmac.new(secret, role + hello.nonce + stage_nonce + encode(hello), hashlib.sha256).digest()


def _refusal(code: str, message: str) -> Error:
    return Error(0, code, message)


async def say_hello(stream: FrameStream, hello: Hello, secret: bytes | None, where: str) -> Message | None:
    """Upstream's side: send `hello` and, with a secret, prove it and check the stage's proof.

    Returns the stage's answer to the Hello (its Hello, or its Error); a stage that fails to prove
    the secret (or does not ask for it) is answered here as an Error with code "unauthenticated"."""
    if secret is None:
        await stream.send(hello)
        return await stream.receive()
    hello = attrs.evolve(hello, nonce=secrets.token_bytes(NONCE_BYTES))
    await stream.send(hello)
    challenge = await stream.receive()
    if isinstance(challenge, Error) or challenge is None:
        return challenge
    if not isinstance(challenge, Auth) or len(challenge.nonce) != NONCE_BYTES:
        return _refusal("unauthenticated", f"the stage at {where} did not authenticate (answered "
                                           f"{type(challenge).__name__}: does it run without the stage secret?)")
    if not hmac.compare_digest(challenge.mac, mac(secret, _STAGE, hello, challenge.nonce)):
        logger.warning("the stage at {} failed to prove the stage secret: not using it", where)
        return _refusal("unauthenticated", f"the stage at {where} does not know the stage secret")
    await stream.send(Auth(mac(secret, _UPSTREAM, hello, challenge.nonce)))
    return await stream.receive()


async def check_upstream(up: FrameStream, hello: Hello, secret: bytes | None, peer: str) -> Error | None:
    """The stage's side, after upstream's Hello: None when it proved the secret (or none is set),
    else the Error to refuse it with (logged). Its proof is awaited under the caller's timeout."""
    if secret is None:
        return None
    if len(hello.nonce) != NONCE_BYTES:
        return _unauthenticated(peer, "sent no challenge (no stage secret?)")
    nonce = secrets.token_bytes(NONCE_BYTES)
    await up.send(Auth(mac(secret, _STAGE, hello, nonce), nonce))
    proof = await up.receive()
    if not isinstance(proof, Auth):
        return _unauthenticated(peer, f"answered the challenge with {type(proof).__name__}")
    if not hmac.compare_digest(proof.mac, mac(secret, _UPSTREAM, hello, nonce)):
        return _unauthenticated(peer, "does not know the stage secret")
    return None


def _unauthenticated(peer: str, why: str) -> Error:
    logger.warning("stage link: refused {}: it {}", peer, why)
    return _refusal("unauthenticated", "this stage requires the stage secret (--secret-file or "
                                       f"${ENV_VAR}); authentication failed")


def is_loopback(host: str) -> bool:
    """Whether a listen address is reachable from this host only."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def send_refusal(up: FrameStream, error: Error) -> None:
    """Best effort: a peer that does not read must not hold the stage."""
    with trio.move_on_after(1.0):
        try:
            await up.send(error)
        except (SkippyError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
