"""The build pipeline: cache keys, idempotence, and a patch that does not apply."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from skippy.errors import PatchApplyError
from skippy.native import _build, _source
from skippy.native._build import BuildFlags, build_key


def test_key_changes_with_patch_bytes_and_flags(tmp_path):
    patch = tmp_path / "0001-x.patch"
    patch.write_text("one")
    base = build_key(BuildFlags(native=True, cuda=False), [patch])
    assert build_key(BuildFlags(native=True, cuda=False), [patch]) == base
    assert build_key(BuildFlags(native=False, cuda=False), [patch]) != base
    assert build_key(BuildFlags(native=True, cuda=True), [patch]) != base
    patch.write_text("two")
    assert build_key(BuildFlags(native=True, cuda=False), [patch]) != base
    assert build_key(BuildFlags(native=True, cuda=False), []) != base


def test_flags_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("SKIPPY_NATIVE", "0")
    monkeypatch.setenv("SKIPPY_CUDA", "1")
    flags = BuildFlags()
    assert not flags.native and flags.cuda
    assert "-DGGML_NATIVE=OFF" in flags.cmake_args() and "-DGGML_CUDA=ON" in flags.cmake_args()


def test_second_build_only_reads_the_stamp(native_build, monkeypatch):
    """A finished build is not fetched, configured or compiled again."""

    def forbidden(*args, **kwargs):
        raise AssertionError(f"ensure_built ran a process although nothing changed: {args}")

    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    assert _build.ensure_built(progress=False) == native_build


def test_extension_is_rebuilt_when_the_cdef_changes(native_build, monkeypatch):
    monkeypatch.setattr(_build, "extension_digest", lambda: "something-else")
    assert not _build._complete(native_build, tools=False)


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "a.txt").write_text("alpha\nbeta\ngamma\n")
    return tree


def _patch(tmp_path: Path, name: str, old: str, new: str) -> Path:
    path = tmp_path / name
    path.write_text(f"--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n alpha\n-{old}\n+{new}\n gamma\n")
    return path


def test_patches_apply_in_order(tmp_path):
    tree = _tree(tmp_path)
    first = _patch(tmp_path, "0001-first.patch", "beta", "BETA")
    second = _patch(tmp_path, "0002-second.patch", "BETA", "delta")
    _source.apply_patches(tree, [first, second])
    assert (tree / "a.txt").read_text() == "alpha\ndelta\ngamma\n"


def test_a_patch_that_does_not_apply_stops_the_build_by_name(tmp_path):
    tree = _tree(tmp_path)
    good = _patch(tmp_path, "0001-good.patch", "beta", "BETA")
    bad = _patch(tmp_path, "0002-stale.patch", "beta", "other")  # expects text the first one changed
    with pytest.raises(PatchApplyError, match="0002-stale.patch") as info:
        _source.apply_patches(tree, [good, bad])
    assert info.value.patch == "0002-stale.patch"


def test_every_project_patch_is_in_the_key():
    names = [p.name for p in _source.patch_files()]
    assert names == sorted(names) and names, "patches/ holds the ordered queue"
    assert "0001-memory-ledger.patch" in names


def test_build_cuda_gets_its_own_cache_entry(monkeypatch):
    """`skippy build --cuda` passes GGML_CUDA=ON under another key: it never replaces the CPU build."""
    import skippy.native
    from skippy.cli import main

    seen: list[BuildFlags] = []
    monkeypatch.setattr(skippy.native, "ensure_built",
                        lambda flags, tools, progress: seen.append(flags) or _build.locate(flags))
    monkeypatch.delenv("SKIPPY_LLAMA_DEV_TREE", raising=False)
    assert main(["build", "--cuda", "--quiet"]) == 0
    assert main(["build", "--quiet"]) == 0
    cuda, cpu = seen
    assert cuda.cuda and not cpu.cuda and "-DGGML_CUDA=ON" in cuda.cmake_args()
    assert _build.locate(cuda).root != _build.locate(cpu).root
