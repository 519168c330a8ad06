"""The pinned llama.cpp source: fetched with pip by exact version, verified, patched.

We never vendor llama.cpp: the `vendor/llama.cpp` tree of one PyPI sdist is the
substrate, and `patches/` is the only place our changes to it live.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import attrs
from loguru import logger

from .._pip import pip_download
from ..errors import NativeBuildError, PatchApplyError


@attrs.frozen
class Pin:
    package: str
    version: str
    sha256: str
    commit: str

    @property
    def sdist_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}.tar.gz"

    @property
    def vendor_prefix(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}/vendor/llama.cpp/"


PIN = Pin(
    package="llama-cpp-python",
    version="0.3.36",
    sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    commit="0c1e57098",
)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def patches_dir() -> Path:
    """patches/ of a source checkout, or the copy packaged inside a wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parents[1] / "patches", here.parent / "_patches"):
        if candidate.is_dir():
            return candidate
    raise NativeBuildError("cannot find the patches/ directory next to the skippy package")


def patch_files(directory: Path | None = None) -> list[Path]:
    return sorted((directory or patches_dir()).glob("*.patch"))


def fetch_sdist(downloads: Path, pin: Pin = PIN) -> Path:
    """Download the pinned sdist once (pip, exact version) and check its sha256."""
    downloads.mkdir(parents=True, exist_ok=True)
    target = downloads / pin.sdist_name
    if target.exists() and sha256_file(target) == pin.sha256:
        return target
    error = pip_download(pin.package, pin.version, downloads, sdist=True)
    if error is not None or not target.exists():
        raise NativeBuildError(f"pip could not fetch {pin.package}=={pin.version}:\n{error}")
    actual = sha256_file(target)
    if actual != pin.sha256:
        target.unlink()
        raise NativeBuildError(f"{target.name}: sha256 {actual} does not match the pin {pin.sha256}")
    return target


def extract_vendor_tree(sdist: Path, dest: Path, pin: Pin = PIN) -> None:
    """Unpack only vendor/llama.cpp from the sdist into dest (replacing it)."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    prefix = pin.vendor_prefix
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for member in tar.getmembers():
            if not member.name.startswith(prefix) or member.name == prefix:
                continue
            member.name = member.name[len(prefix):]
            if member.name == ".git" or member.name.startswith(".git/"):
                continue  # a submodule gitfile pointing into the sdist's own .git: git would follow it
            members.append(member)
        if not members:
            raise NativeBuildError(f"{sdist.name} has no {prefix} tree")
        tar.extractall(tmp, members=members, filter="data")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def apply_patches(tree: Path, patches: list[Path]) -> None:
    """Apply each patch in order; the first that does not apply stops the build, by name."""
    # the tree may sit inside some git work tree; stop git from applying relative to that
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    for patch in patches:
        check = subprocess.run(
            ["git", "apply", "--check", "--whitespace=nowarn", str(patch)],
            cwd=tree, env=env, capture_output=True, text=True,
        )
        if check.returncode != 0:
            raise PatchApplyError(patch.name, check.stderr.strip() or check.stdout.strip())
        subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=tree, env=env, check=True)
        logger.info("applied {}", patch.name)
