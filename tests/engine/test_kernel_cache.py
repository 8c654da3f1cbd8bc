"""The kernels' cache folder (rest_lsp/engine/panel_matmul.py, and quant_matmul.py through the same path): only a
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

from rest_lsp.engine import panel_matmul, quant_matmul

cc = panel_matmul._compiler()
needs_cc = pytest.mark.skipif(cc is None, reason="no C compiler here")


@pytest.fixture
def kernels(monkeypatch, tmp_path):
    """An empty kernel folder of the test's own, the kernel looked for again."""
    monkeypatch.setattr(panel_matmul, "_library", [])
    monkeypatch.setattr(panel_matmul, "kernel_folder", lambda: tmp_path / "cache" / "kernels")
    return tmp_path / "cache" / "kernels"


def names(folder):
    """The paths the kernel is looked for at, with OpenMP and without."""
    version = panel_matmul._run([cc, "--version"]).stdout
    return [folder / f"panel_matmul-{panel_matmul._key(flags, version)}.so"
            for flags in (panel_matmul.FLAGS + panel_matmul.OPENMP, panel_matmul.FLAGS)]


def plant(target, marker):
    """A working kernel with a constructor that writes `marker`: what another user would leave there."""
    src = target.parent.parent / "planted.c"
    src.write_text(panel_matmul.SOURCE + '\n#include <stdio.h>\n__attribute__((constructor)) static void planted(void)'
                   f' {{ FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("planted", f); fclose(f); }} }}\n')
    subprocess.run([cc, *panel_matmul.FLAGS, "-fopenmp", str(src), "-o", str(target)], check=True)


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@needs_cc
def test_what_is_built_is_private_and_its_hash_recorded(kernels):
    assert panel_matmul.library() is not None
    lib = names(kernels)[0]
    record = lib.with_name(lib.name + ".sha256")
    assert record.read_text().strip() == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert [oct(p.stat().st_mode & 0o777) for p in (kernels, lib, record)] == ["0o700", "0o700", "0o600"]


@needs_cc
@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_a_folder_others_may_write_is_refused_and_nothing_in_it_runs(kernels, tmp_path, caplog, mode):
    kernels.mkdir(parents=True)
    marker = tmp_path / "ran"
    for target in names(kernels):
        plant(target, marker)
    kernels.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.panel_matmul"):
        assert panel_matmul.library() is None
        assert panel_matmul.library() is None  # decided once
    assert not marker.exists()
    assert warnings_of(caplog) == [
        f"The kernel cache folder is not this user's alone ({kernels} is writable by group or others (mode "
        f"{mode:o})): fp32 steps run without rest-lsp's panel kernel (on oneDNN where torch has it)."]
    assert sorted(p.name for p in kernels.iterdir()) == sorted(t.name for t in names(kernels))  # nothing built


@needs_cc
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file away needs root")
def test_a_folder_of_another_user_is_refused_and_nothing_in_it_runs(kernels, tmp_path, caplog):
    """The reproduction's case: a shared cache folder someone else made (here owned by nobody, mode 700)."""
    kernels.mkdir(parents=True, mode=0o700)
    marker = tmp_path / "ran"
    for target in names(kernels):
        plant(target, marker)
    nobody = pwd.getpwnam("nobody").pw_uid
    for p in (kernels, *kernels.iterdir()):
        os.chown(p, nobody, -1)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.panel_matmul"):
        assert panel_matmul.library() is None
    assert not marker.exists()
    assert f"{kernels} is owned by uid {nobody}, not {os.getuid()}" in caplog.text


@needs_cc
@pytest.mark.parametrize("how", ["replaced", "no record", "a link"])
def test_a_library_that_is_not_the_one_built_is_built_again_not_loaded(kernels, tmp_path, caplog, how):
    assert panel_matmul.library() is not None
    target = names(kernels)[0]
    record = target.with_name(target.name + ".sha256")
    marker = tmp_path / "ran"
    if how == "a link":
        elsewhere = tmp_path / "elsewhere.so"
        plant(elsewhere, marker)
        target.unlink()
        target.symlink_to(elsewhere)
        record.write_text(hashlib.sha256(elsewhere.read_bytes()).hexdigest() + "\n")
    else:
        plant(target, marker)
        target.chmod(0o700)
        if how == "no record":
            record.unlink()
    panel_matmul._library.clear()
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.panel_matmul"):
        assert panel_matmul.library() is not None
    assert not marker.exists()
    assert len(warnings_of(caplog)) == 1 and "is not loaded" in caplog.text and "it is built again" in caplog.text
    assert not target.is_symlink()
    assert record.read_text().strip() == hashlib.sha256(target.read_bytes()).hexdigest()


@needs_cc
def test_a_library_built_without_openmp_is_not_taken_for_one_built_with_it(kernels, tmp_path):
    """The key covers the OpenMP flag: a compiler that could not use OpenMP once leaves a one-thread library
    in the cache; a compiler that can later builds the threaded one instead of loading that."""
    no_openmp = tmp_path / "cc-without-openmp"
    no_openmp.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && exit 1; done\nexec {shutil.which(cc)} '
                         '"$@"\n')
    no_openmp.chmod(0o755)
    built = panel_matmul._build(str(no_openmp), kernels)
    assert built.panel_threaded() == 0
    assert panel_matmul._build(cc, kernels).panel_threaded() == 1



# -- the quantized kernel (rest_lsp/engine/quant_matmul.py) goes through the same path --------------------------------

@pytest.fixture
def quant_kernels(monkeypatch, tmp_path):
    """An empty kernel folder of the test's own, the quantized kernel looked for again."""
    monkeypatch.setattr(quant_matmul, "_libraries", {})
    monkeypatch.setattr(quant_matmul, "kernel_folder", lambda: tmp_path / "cache" / "kernels")
    return tmp_path / "cache" / "kernels"


def quant_names(folder, march=quant_matmul.NATIVE):
    """The paths the quantized kernel for `march` is looked for at, with OpenMP and without."""
    version = panel_matmul._run([cc, "--version"]).stdout
    return [folder / f"quant_matmul-{panel_matmul._key(flags, version, quant_matmul.SOURCE, quant_matmul.LIBS)}.so"
            for flags in quant_matmul.variants(march)]


def plant_quant(target, marker):
    """A working quantized kernel with a constructor that writes `marker`."""
    src = target.parent.parent / "planted_quant.c"
    src.write_text(quant_matmul.SOURCE + '\n#include <stdio.h>\n__attribute__((constructor)) static void planted(void)'
                   f' {{ FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("planted", f); fclose(f); }} }}\n')
    subprocess.run([cc, *quant_matmul.variants(quant_matmul.NATIVE)[0], str(src), "-o", str(target),
                    *quant_matmul.LIBS], check=True)


@needs_cc
def test_a_quant_library_in_a_folder_others_may_write_is_refused_and_does_not_run(quant_kernels, tmp_path, caplog):
    quant_kernels.mkdir(parents=True)
    marker = tmp_path / "ran"
    for target in quant_names(quant_kernels):
        plant_quant(target, marker)
    quant_kernels.chmod(0o757)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.quant_matmul"):
        assert quant_matmul.library() is None
    assert not marker.exists()
    assert warnings_of(caplog) == [
        (f"The kernel cache folder is not this user's alone ({quant_kernels} is writable by group or others (mode "
         "757)): the quantized mode cannot run.")]
    assert sorted(p.name for p in quant_kernels.iterdir()) == sorted(t.name for t in quant_names(quant_kernels))


@needs_cc
@pytest.mark.parametrize("how", ["replaced", "no record", "a link"])
def test_a_quant_library_that_is_not_the_one_built_is_built_again_not_loaded(quant_kernels, tmp_path, caplog, how):
    """A planted library under the quantized kernel's predictable name (the case panel_matmul's hardening had
    left open for it) is refused like the panel kernel's: its code never runs, the kernel is built again."""
    quant_kernels.mkdir(parents=True, mode=0o700)
    target = quant_names(quant_kernels)[0]
    record = target.with_name(target.name + ".sha256")
    marker = tmp_path / "ran"
    if how == "a link":
        elsewhere = tmp_path / "elsewhere.so"
        plant_quant(elsewhere, marker)
        target.symlink_to(elsewhere)
        record.write_text(hashlib.sha256(elsewhere.read_bytes()).hexdigest() + "\n")
        record.chmod(0o600)
    else:
        plant_quant(target, marker)
        target.chmod(0o700)
        if how == "replaced":  # a record of other bytes (what the library was before it was replaced)
            record.write_text(hashlib.sha256(b"the library that was built").hexdigest() + "\n")
            record.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="rest_lsp.engine.quant_matmul"):
        assert quant_matmul.library() is not None
    assert not marker.exists()
    assert len(warnings_of(caplog)) == 1 and "is not loaded" in caplog.text and "it is built again" in caplog.text
    assert not target.is_symlink()
    assert record.read_text().strip() == hashlib.sha256(target.read_bytes()).hexdigest()
    assert [oct(p.stat().st_mode & 0o777) for p in (target, record)] == ["0o700", "0o600"]


@needs_cc
def test_the_quant_librarys_key_covers_its_flags(quant_kernels, tmp_path):
    """-march and OpenMP are in the key: a one-thread library left by a compiler without OpenMP is not taken for
    the threaded one, and the library of one -march is never loaded for another."""
    names = {march: quant_names(quant_kernels, march) for march in (quant_matmul.NATIVE, "-march=haswell")}
    assert len({p for paths in names.values() for p in paths}) == 4
    no_openmp = tmp_path / "cc-without-openmp"
    no_openmp.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && exit 1; done\nexec {shutil.which(cc)} '
                         '"$@"\n')
    no_openmp.chmod(0o755)
    assert quant_matmul._build(str(no_openmp), quant_kernels, quant_matmul.NATIVE).quant_threaded() == 0
    assert quant_matmul._build(cc, quant_kernels, quant_matmul.NATIVE).quant_threaded() == 1
    assert sorted(p.name for p in quant_kernels.glob("*.so")) == sorted(p.name for p in names[quant_matmul.NATIVE])
