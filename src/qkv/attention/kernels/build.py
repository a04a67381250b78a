"""Compile qkv's C++ attention kernels into the environment, once, at set-up (``make setup``):

    python -m qkv.attention.kernels.build                 # → <venv>/qkv-kernels/qkv_intervals_<tag>.so
    python -m qkv.attention.kernels.build --can-compile   # exit 0 when g++ and Python.h are here

The kernel is a torch C++ extension (``torch/extension.h``, ATen's BLAS and ``parallel_for``),
compiled by the machine's ``g++`` with torch's own include and library paths
(``torch.utils.cpp_extension``) for *this* CPU (``-march=native``: the build is local to the
environment that runs it). ``<tag>`` hashes the source, the flags, the CPU and torch's version,
so a build made from another source, for another CPU or another torch is never loaded (:mod:`qkv.attention.kernels`
then uses the pure-torch spans path). Nothing compiles at import or at run time.

Exit status 0 whether or not it built: set-up goes on without the kernel, and says so in one line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

SOURCE = Path(__file__).with_name("intervals.cpp")
NAME = "qkv_intervals"
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp", "-std=c++20", "-shared", "-fPIC", "-w")


def build_dir() -> Path:
    """Where kernels live: inside the environment (``sys.prefix``: the venv of ``make setup``)."""
    return Path(sys.prefix) / "qkv-kernels"


def cpu_features() -> str:
    """This CPU's model and instruction-set flags (``/proc/cpuinfo``): a ``-march=native`` build is
    for them only (an environment copied to another machine must not run it)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [x for x in f if x.startswith(("model name", "flags", "Features", "CPU part"))]
    except OSError:
        lines = []
    import platform
    return "".join(sorted(set(lines))) or platform.machine()


def tag() -> str:
    """The build's identity: source, flags, the CPU, torch version and C++ ABI (a change to any
    is another build; a build of another identity is never loaded)."""
    import torch
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(" ".join(FLAGS).encode())
    h.update(cpu_features().encode())
    h.update(torch.__version__.encode())
    h.update(str(torch._C._GLIBCXX_USE_CXX11_ABI).encode())
    return h.hexdigest()[:12]


def library_path() -> Path:
    """The compiled module this source and torch would load (it may not exist)."""
    return build_dir() / f"{NAME}_{tag()}.so"


def compile_command(out: Path, cxx: str) -> list[str]:
    import torch
    from torch.utils import cpp_extension
    name = out.stem
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libs = cpp_extension.library_paths()
    return [cxx, *FLAGS, f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *(f"-I{p}" for p in includes), str(SOURCE), "-o", str(out),
            *(f"-L{p}" for p in libs), "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def _loads(path: Path) -> bool:
    """Whether the built module imports next to this torch (in a fresh interpreter: a module
    imported here could not be replaced by the final file)."""
    probe = ("import importlib.util, sys, torch; p = sys.argv[1]; "
             "s = importlib.util.spec_from_file_location(p.rsplit('/', 1)[1][:-3], p); "
             "importlib.util.module_from_spec(s)")
    return subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True).returncode == 0


def build() -> Path | None:
    """Compile the kernel unless this exact build exists; its path, or None (with one note why)."""
    out = library_path()
    if out.exists():
        print(f"qkv kernels: {out} (already built)")
        return out
    if not can_compile():
        print("note: no C++ compiler (g++) or Python headers (python3-dev), so qkv runs its "
              "pure-torch spans path (install them and run `python -m qkv.attention.kernels.build`)")
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # no partial file under the final name
        part = Path(tmp) / out.name
        proc = subprocess.run(compile_command(part, compiler()), capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
            print(f"note: the C++ kernel did not build ({last[:200]}); qkv runs its pure-torch spans path")
            return None
        if not _loads(part):
            print("note: the C++ kernel built but does not load with this torch; qkv runs its "
                  "pure-torch spans path")
            return None
        for old in out.parent.glob(f"{NAME}_*.so"):  # earlier builds: never loaded again
            old.unlink()
        part.replace(out)
    print(f"qkv kernels: built {out} in {time.perf_counter() - t0:.0f} s")
    return out


def compiler() -> str | None:
    """The C++ compiler to use ($CXX, else g++ or c++), or None."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def can_compile() -> bool:
    """A compiler and the Python headers torch's extension header needs (``Python.h``)."""
    return compiler() is not None and (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()


if __name__ == "__main__":
    if sys.argv[1:] == ["--can-compile"]:  # set-up asks first, and installs g++ where it may
        sys.exit(0 if can_compile() else 1)
    build()
