"""Throwaway TLS material made at test time (trustme): a CA, a stage certificate signed by it for
127.0.0.1, localhost and a DNS name, and a second CA that signed nothing here (an untrusting client)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

STAGE_NAME = "stage-1.internal"


@attrs.frozen
class TLSFiles:
    ca: Path
    cert: Path
    key: Path
    other_ca: Path


def make_tls_files(directory: Path) -> TLSFiles:
    trustme = pytest.importorskip("trustme", reason="TLS tests need trustme (a dev extra)")
    ca, other = trustme.CA(), trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost", STAGE_NAME)
    files = TLSFiles(directory / "ca.pem", directory / "cert.pem", directory / "key.pem", directory / "other-ca.pem")
    ca.cert_pem.write_to_path(str(files.ca))
    other.cert_pem.write_to_path(str(files.other_ca))
    leaf.private_key_pem.write_to_path(str(files.key))
    for i, pem in enumerate(leaf.cert_chain_pems):  # the leaf, then any intermediates
        pem.write_to_path(str(files.cert), append=i > 0)
    return files
