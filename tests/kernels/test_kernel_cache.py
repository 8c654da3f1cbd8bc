"""The kernels' cache folder (rest_lsp/kernels/loader.py, the one path every kernel is built and loaded by): only a
library this user built is loaded.

A library planted under the predictable name runs its code the moment it is loaded (a constructor), before any
check of its results: so each test plants one whose constructor writes a marker file, and the marker must never
appear.
"""

import hashlib
import logging
import os
import pwd
import shutil
import subprocess

import pytest

from rest_lsp.kernels import levels, loader, panel_matmul, quant_matmul, row_attention

cc = loader._compiler()
needs_cc = pytest.mark.skipif(cc is None, reason="no C compiler here")
KERNELS = {"panel": panel_matmul.KERNEL, "quant": quant_matmul.KERNEL, "attention": row_attention.KERNEL}
LEVEL = levels.chosen()


# The loader is one for every kernel: each kernel is built through it once (`test_what_is_built_...`); its refusals
# and rebuilds are shown on the two that build in seconds (a build of the quant kernel takes half a minute on a slow
# CPU, and the suite builds it elsewhere).
QUICK = ["attention", "panel"]


@pytest.fixture(params=sorted(KERNELS))
def kernel(request, monkeypatch, tmp_path):
    """Each kernel (or each one a test names in QUICK), looked for again in an empty kernel folder of the test's
    own."""
    k = KERNELS[request.param]
    k.forget()
    monkeypatch.setattr(loader, "kernel_folder", lambda: tmp_path / "cache" / "kernels")
    yield k
    k.forget()


def folder_of(tmp_path):
    return tmp_path / "cache" / "kernels"


def names(kernel, folder, level=LEVEL):
    """The paths `kernel`'s library of `level` is looked for at, with OpenMP and without."""
    version = loader._run([cc, "--version"]).stdout
    return [folder / f"{kernel.stem}-{level}-{loader._key(flags, version, kernel.source, kernel.libs)}.so"
            for flags in kernel.variants(level)]


MARKER = "REST_LSP_TEST_PLANTED_MARKER"  # the file a planted library's constructor writes, named at load time


@pytest.fixture(scope="module")
def planted_builds(tmp_path_factory) -> dict[str, object]:
    """Per kernel, one planted library built for the module: each test copies it under the names it plants."""
    return {"folder": tmp_path_factory.mktemp("planted")}


@pytest.fixture
def plant(planted_builds, monkeypatch):
    """plant(kernel, target, marker): a working library of `kernel` at `target` with a constructor that writes
    `marker`: what another user would leave."""

    def put(kernel, target, marker):
        monkeypatch.setenv(MARKER, str(marker))
        built = planted_builds.get(kernel.stem)
        if built is None:
            folder = planted_builds["folder"]
            src = folder / f"planted-{kernel.stem}.c"
            src.write_text(kernel.source + '\n#include <stdio.h>\n#include <stdlib.h>\n__attribute__((constructor)) '
                           f'static void planted(void) {{ const char *m = getenv("{MARKER}"); FILE *f = m ? fopen(m, '
                           '"w") : 0; if (f) { fputs("planted", f); fclose(f); } }\n')
            built = planted_builds[kernel.stem] = folder / f"planted-{kernel.stem}.so"
            subprocess.run([cc, *kernel.variants(LEVEL)[0], str(src), "-o", str(built), *kernel.libs], check=True)
        shutil.copy(built, target)  # with its mode, as the compiler left it

    return put


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@needs_cc
def test_what_is_built_is_private_and_its_hash_recorded(kernel, tmp_path):
    assert kernel.library() is not None
    lib = names(kernel, folder_of(tmp_path))[0]
    record = lib.with_name(lib.name + ".sha256")
    assert record.read_text().strip() == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert [oct(p.stat().st_mode & 0o777) for p in (folder_of(tmp_path), lib, record)] == ["0o700", "0o700", "0o600"]


@needs_cc
@pytest.mark.parametrize("kernel", QUICK, indirect=True)
@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_a_folder_others_may_write_is_refused_and_nothing_in_it_runs(kernel, tmp_path, caplog, mode, plant):
    kernels = folder_of(tmp_path)
    kernels.mkdir(parents=True)
    marker = tmp_path / "ran"
    for target in names(kernel, kernels):
        plant(kernel, target, marker)
    kernels.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.kernels.loader"):
        assert kernel.library() is None
        assert kernel.library() is None  # decided once
    assert not marker.exists()
    assert warnings_of(caplog) == [
        f"The kernel cache folder is not this user's alone ({kernels} is writable by group or others (mode "
        f"{mode:o})): {kernel.purpose}."]
    assert sorted(p.name for p in kernels.iterdir()) == sorted(t.name for t in names(kernel, kernels))  # none built


@needs_cc
@pytest.mark.parametrize("kernel", QUICK, indirect=True)
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file away needs root")
def test_a_folder_of_another_user_is_refused_and_nothing_in_it_runs(kernel, tmp_path, caplog, plant):
    """A shared cache folder someone else made (here owned by nobody, mode 700)."""
    kernels = folder_of(tmp_path)
    kernels.mkdir(parents=True, mode=0o700)
    marker = tmp_path / "ran"
    for target in names(kernel, kernels):
        plant(kernel, target, marker)
    nobody = pwd.getpwnam("nobody").pw_uid
    for p in (kernels, *kernels.iterdir()):
        os.chown(p, nobody, -1)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.kernels.loader"):
        assert kernel.library() is None
    assert not marker.exists()
    assert f"{kernels} is owned by uid {nobody}, not {os.getuid()}" in caplog.text


@needs_cc
@pytest.mark.parametrize("kernel", QUICK, indirect=True)
@pytest.mark.parametrize("how", ["replaced", "no record", "a link"])
def test_a_library_that_is_not_the_one_built_is_built_again_not_loaded(kernel, tmp_path, caplog, how, plant):
    kernels = folder_of(tmp_path)
    kernels.mkdir(parents=True, mode=0o700)
    target = names(kernel, kernels)[0]
    record = target.with_name(target.name + ".sha256")
    marker = tmp_path / "ran"
    if how == "a link":
        elsewhere = tmp_path / "elsewhere.so"
        plant(kernel, elsewhere, marker)
        target.symlink_to(elsewhere)
        record.write_text(hashlib.sha256(elsewhere.read_bytes()).hexdigest() + "\n")
        record.chmod(0o600)
    else:
        plant(kernel, target, marker)
        target.chmod(0o700)
        if how == "replaced":  # a record of other bytes (what the library was before it was replaced)
            record.write_text(hashlib.sha256(b"the library that was built").hexdigest() + "\n")
            record.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.kernels.loader"):
        assert kernel.library() is not None
    assert not marker.exists()
    assert len(warnings_of(caplog)) == 1 and "is not loaded" in caplog.text and "it is built again" in caplog.text
    assert not target.is_symlink()
    assert record.read_text().strip() == hashlib.sha256(target.read_bytes()).hexdigest()
    assert [oct(p.stat().st_mode & 0o777) for p in (target, record)] == ["0o700", "0o600"]


@needs_cc
def test_the_key_covers_the_level_and_openmp(tmp_path):
    """The level's flags and OpenMP are in the key: a one-thread library left by a compiler without OpenMP is not
    taken for the threaded one, and the library of one level is never loaded for another."""
    kernel, folder = panel_matmul.KERNEL, folder_of(tmp_path)
    paths = {p for level in levels.LEVELS for p in names(kernel, folder, level)}
    assert len(paths) == 2 * len(levels.LEVELS)
    no_openmp = tmp_path / "cc-without-openmp"
    no_openmp.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && exit 1; done\nexec {shutil.which(cc)} '
                         '"$@"\n')
    no_openmp.chmod(0o755)
    stem = f"{kernel.stem}-{LEVEL}"
    one = loader.build_and_load(str(no_openmp), folder, stem, kernel.source, kernel.variants(LEVEL), kernel.libs)
    assert panel_matmul._bind(one).panel_threaded() == 0
    both = loader.build_and_load(cc, folder, stem, kernel.source, kernel.variants(LEVEL), kernel.libs)
    assert panel_matmul._bind(both).panel_threaded() == 1
    assert sorted(p.name for p in folder.glob("*.so")) == sorted(p.name for p in names(kernel, folder))
