"""Compile qkv's C++ attention kernels into the environment, once, at set-up (`make setup`):

    python -m qkv.attention.kernels.build                 # → <venv>/qkv-kernels/qkv_intervals_<tag>.so
    python -m qkv.attention.kernels.build --can-compile   # exit 0 when g++ and Python.h are here

The kernel is a torch C++ extension (`torch/extension.h`, ATen's BLAS and `parallel_for`),
compiled by the machine's `g++` with torch's own include and library paths
(`torch.utils.cpp_extension`) for *this* CPU (`-march=native`: the build is local to the
environment that runs it). `<tag>` hashes the source, the flags, the CPU and torch's version,
so a build made from another source, for another CPU or another torch is never loaded
(`qkv.attention.kernels` then uses the pure-torch spans path). Nothing compiles at import or at run
time.

A library is *verified* before anything maps it into a user's process: a fresh interpreter
imports it and runs a tiny forward and backward (`check_in_child`), and a stamp beside it
(`<name>.verified`) records the sha256 of the file that passed. Loading compares the file with
its stamp; a file without a matching stamp gets the child-process check once (and its stamp), so
a truncated or corrupt library costs one warning line and the pure-torch path, never a SIGBUS in
the user's process. `build` checks an existing library the same way and rebuilds it when the
check fails.

Exit status 0 whether or not it built: set-up goes on without the kernel, and says so in one line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
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
    """Where kernels live: inside the environment (`sys.prefix`: the venv of `make setup`)."""
    return Path(sys.prefix) / "qkv-kernels"


def cpu_features() -> str:
    """This CPU's model and instruction-set flags (`/proc/cpuinfo`): a `-march=native` build is
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
    h.update(str(torch.compiled_with_cxx11_abi()).encode())
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
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
            *(f"-I{p}" for p in includes), str(SOURCE), "-o", str(out),
            *(f"-L{p}" for p in libs), "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


# A fresh interpreter imports the library and runs it on a few rows: a file that is truncated,
# corrupt or built against another torch fails here (a signal ends only that process).
_PROBE = """
import importlib.util, sys, torch
path = sys.argv[1]
spec = importlib.util.spec_from_file_location(path.rsplit('/', 1)[-1][:-3], path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
q = torch.randn(1, 2, 8, 4)  # (b, h, t, d); row i keeps keys [0, i + 1)
lo, hi = torch.zeros(1, 8, dtype=torch.int64), torch.arange(1, 9).view(1, 8)
out, lse = module.interval_forward(q, q, q, lo, hi, 0.5, 4, 8)
grads = module.interval_backward(q, q, q, out, torch.ones_like(out), lse, lse.new_empty(0), lo, hi,
                                 0.5, 4, 8)
assert all(bool(x.isfinite().all()) for x in (out, lse, *grads)), 'not finite'
"""


def check_in_child(path: Path) -> str | None:
    """None when the library at `path` imports and computes in a fresh interpreter, else why
    not in a few words (the child's last line, or the signal that ended it)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True,
                              text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "a test import took over 300 s"
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        return f"a test import died of {signal.Signals(-proc.returncode).name}"
    last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return last[:200]


def stamp_path(path: Path) -> Path:
    """The verified stamp beside a library: the sha256 of the file that passed the check."""
    return path.with_suffix(".verified")


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:  # gone, a directory, unreadable
        return None


def verified(path: Path) -> bool:
    """Whether this very file passed `check_in_child` (its stamp holds its sha256)."""
    try:
        stamp = stamp_path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return False
    return stamp != "" and stamp == _digest(path)


def verify(path: Path) -> str | None:
    """Check `path` in a child process and stamp it when it passes (where the directory is
    writable: else the check runs again in the next process); None, or why it failed."""
    digest = _digest(path)
    why = check_in_child(path) if digest is not None else "not a readable file"
    if why is None:
        try:
            part = stamp_path(path).with_suffix(f".verified.{os.getpid()}")
            part.write_text(digest + "\n")
            part.replace(stamp_path(path))  # two processes stamping at once: either file is whole
        except OSError:
            pass
    return why


def _remove(path: Path) -> None:
    """A library that failed its check, whatever it is (a file, a link, a directory), and its stamp."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    stamp_path(path).unlink(missing_ok=True)


def build() -> Path | None:
    """Compile the kernel unless this exact build exists and passes its check; its path, or None
    (with one note why)."""
    out = library_path()
    if out.exists() or out.is_symlink():
        why = verify(out)
        if why is None:
            print(f"qkv kernels: {out} (already built; it loads and computes)")
            return out
        print(f"qkv kernels: {out} does not load ({why}); building it again", flush=True)
        _remove(out)
    if not can_compile():
        print("note: no C++ compiler (g++) or Python headers (python3-dev), so qkv runs its "
              "pure-torch spans path (install them and run `python -m qkv.attention.kernels.build`)")
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    cxx = compiler()
    print(f"qkv kernels: compiling {SOURCE.name} with {cxx} (1-3 minutes) ...", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # no partial file under the final name
        part = Path(tmp) / out.name
        proc = subprocess.run(compile_command(part, cxx), capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
            print(f"note: the C++ kernel did not build ({last[:200]}); qkv runs its pure-torch spans path")
            return None
        why = check_in_child(part)
        if why is not None:
            print(f"note: the C++ kernel built but does not load with this torch ({why}); qkv runs "
                  "its pure-torch spans path")
            return None
        for old in out.parent.glob(f"{NAME}_*.so"):  # earlier builds: never loaded again
            _remove(old)
        digest = _digest(part)
        part.replace(out)
        stamp_path(out).write_text(digest + "\n")  # after the rename: the stamp names a whole file
    print(f"qkv kernels: built {out} in {time.perf_counter() - t0:.0f} s")
    return out


def compiler() -> str | None:
    """The C++ compiler to use ($CXX, else g++ or c++), or None."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def can_compile() -> bool:
    """A compiler and the Python headers torch's extension header needs (`Python.h`)."""
    return compiler() is not None and (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()


if __name__ == "__main__":
    if sys.argv[1:] == ["--can-compile"]:  # set-up asks first, and installs g++ where it may
        sys.exit(0 if can_compile() else 1)
    build()
