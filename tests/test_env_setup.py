"""The environment that env/setup.sh builds: what a later setup, a fresh clone or another node depends on.

env/build_horovod.sh caches the Horovod wheel it builds and installs it into every later venv. A library in that
wheel that names the venv it was built in (an absolute RUNPATH, CMake's default) imports there and nowhere else:
once that venv is gone, ``import horovod.torch`` fails with "libmpi.so.12: cannot open shared object file"
(stop 42's CI: a wheel cached from a removed clone).
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest


def _runpath(lib: Path) -> list[str]:
    """The RUNPATH (or, failing that, RPATH) entries of a shared library, read by binutils' readelf."""
    readelf = shutil.which("readelf")
    assert readelf, "readelf (binutils, which gcc needs too) is not on PATH"
    out = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    paths = {kind: line.split("[", 1)[1].rsplit("]", 1)[0]
             for line in out.splitlines() for kind in ("RUNPATH", "RPATH") if f"({kind})" in line}
    found = paths.get("RUNPATH", paths.get("RPATH", ""))
    return [p for p in found.split(":") if p]


def _horovod_torch_lib() -> Path:
    spec = importlib.util.find_spec("horovod")
    assert spec and spec.origin, "horovod is not installed in this venv (env/setup.sh installs it)"
    lib = Path(spec.origin).parent / "torch" / f"mpi_lib_v2{sysconfig.get_config_var('EXT_SUFFIX')}"
    assert lib.is_file(), f"{lib} is missing: Horovod was built without PyTorch"
    return lib


@pytest.mark.parametrize("needed", ["libmpi.so.12", "libtorch_cpu.so"])
def test_horovod_finds_its_libraries_relative_to_itself(needed):
    lib = _horovod_torch_lib()
    entries = _runpath(lib)
    absolute = [e for e in entries if not e.startswith("$ORIGIN")]
    assert entries and not absolute, (
        f"{lib.name} has RUNPATH {entries}: entries outside $ORIGIN tie the cached wheel to the venv it was "
        "built in (env/build_horovod.sh, patch 4)")
    dirs = [Path(e.replace("$ORIGIN", str(lib.parent), 1)).resolve() for e in entries]
    assert any((d / needed).exists() for d in dirs), f"{needed} is in none of {[str(d) for d in dirs]}"


def test_the_runpath_reader_sees_an_absolute_entry(tmp_path):
    """The reader itself, on a library linked here with an absolute and a relative entry."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc is not on PATH"
    src = tmp_path / "x.c"
    src.write_text("int x(void) { return 1; }\n")
    lib = tmp_path / "libx.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib), str(src),
                    "-Wl,--enable-new-dtags,-rpath,/opt/venv/lib:$ORIGIN/../lib"], check=True)
    assert _runpath(lib) == ["/opt/venv/lib", "$ORIGIN/../lib"]
