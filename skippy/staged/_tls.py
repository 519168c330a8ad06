"""TLS on stage links: a stage serves its frames over `trio.SSLStream`, upstream verifies the
stage's certificate against a CA and a name before the first frame.

Why: the stage secret (see _auth) proves both ends know it, but the frames after the handshake
cross the network readable and alterable. TLS encrypts and integrity-protects every frame and
proves the stage to upstream; the secret still proves upstream to the stage (stages ask for no
client certificate), so on a network both are on. A plaintext peer at a TLS stage fails the TLS
handshake and is refused like any other failed handshake; the session already open serves on.
"""

from __future__ import annotations

import os
import ssl

import attrs

from ..errors import SkippyError

PathLike = os.PathLike[str] | str


class StageTLSError(SkippyError):
    """A TLS certificate, key or CA file that cannot be loaded (or only half of a cert/key pair)."""


@attrs.frozen
class LinkTLS:
    """How to reach a TLS stage: the context holding the CA to trust, and the name its
    certificate must carry (default: the host connected to, an IP address included)."""

    context: ssl.SSLContext
    server_name: str | None = None

    def name_for(self, host: str) -> str:
        return self.server_name or host


def server_context(certfile: PathLike, keyfile: PathLike) -> ssl.SSLContext:
    """The context a stage serves with: its certificate (chain) and key, TLS 1.2 or newer."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise StageTLSError(f"cannot load the TLS certificate {str(certfile)!r} with the key {str(keyfile)!r}: "
                            f"{_reason(exc)}") from None
    return context


def client_tls(cafile: PathLike, server_name: str | None = None) -> LinkTLS:
    """Trust only the CA(s) in `cafile` (not the system store: a stage's certificate comes from
    the operator's own CA), and check the certificate names the stage."""
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=os.fspath(cafile))
    except (OSError, ValueError) as exc:
        raise StageTLSError(f"cannot load the TLS CA file {str(cafile)!r}: {_reason(exc)}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return LinkTLS(context, server_name or None)


def pair(certfile: PathLike | None, keyfile: PathLike | None, what: str = "--tls-cert and --tls-key") -> bool:
    """Whether a cert/key pair is given; one without the other is an error."""
    if (certfile is None) != (keyfile is None):
        raise StageTLSError(f"{what} go together: give both or neither")
    return certfile is not None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}"
    return str(exc)
