"""Finding a `tritonserver` to run: the one on PATH (NVIDIA's containers) or the one in the nvidia-pytriton wheel.

The wheel ships the server, its python backend and one `triton_python_backend_stub` per CPython version. The
stub that matches this interpreter (or the file `$TRITONTTS_PYTHON_STUB` names) is copied next to the backend
(in place, or into a private tree under a cache dir when site-packages is read-only).

The stub embeds CPython without naming a program, so CPython looks for `python3` on PATH and derives
`sys.prefix` from it (a `pyvenv.cfg` next to it makes that prefix the venv). Putting this interpreter's bin dir
first on PATH therefore gives the models this environment's site-packages (numpy<2, torch, tritontts). The
stub links `libpython3.X.so.1.0`; a dir holding only a link to this interpreter's own libpython goes on
LD_LIBRARY_PATH (pyenv, conda), so that the runtime and the standard library are the same build.
"""

from __future__ import annotations

import ctypes.util
import filecmp
import hashlib
import importlib.util
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CONTAINER_BINARY = Path("/opt/tritonserver/bin/tritonserver")
STUB_NAME = "triton_python_backend_stub"
STUB_ENV = "TRITONTTS_PYTHON_STUB"
"""A stub to use instead of the wheel's (one built from a newer python_backend for this Python)."""
SYSTEM_LIB_DIRS = ("/usr/lib", "/lib", "/usr/lib64", "/lib64")


class TritonNotFoundError(RuntimeError):
    """No usable tritonserver could be found or prepared."""


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    source: str  # "PATH" | "pytriton"
    backend_dir: Path | None = None  # None: the server's own default
    caches_dir: Path | None = None  # --cache-directory: response-cache implementations
    path_prepend: tuple[str, ...] = ()
    ld_library_path_prepend: tuple[str, ...] = ()
    unset: tuple[str, ...] = ()

    def server_args(self) -> list[str]:
        args = []
        if self.backend_dir is not None:
            args.append(f"--backend-directory={self.backend_dir}")
        if self.caches_dir is not None:
            args.append(f"--cache-directory={self.caches_dir}")
        return args

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment the server (and the python-backend stubs it spawns) runs with."""
        env = dict(os.environ if base is None else base)
        for name in self.unset:
            env.pop(name, None)
        _prepend(env, "PATH", self.path_prepend)
        _prepend(env, "LD_LIBRARY_PATH", self.ld_library_path_prepend)
        return env


def find_tritonserver(cache_dir: str | Path | None = None, prefer_path: bool = True) -> TritonInstall:
    """The tritonserver on PATH (or in /opt/tritonserver) if any, else the nvidia-pytriton bundle."""
    if prefer_path:
        on_path = shutil.which("tritonserver")
        if on_path:
            return TritonInstall(binary=Path(on_path).resolve(), source="PATH")
        if os.access(CONTAINER_BINARY, os.X_OK):
            return TritonInstall(binary=CONTAINER_BINARY, source="PATH")
    bundle = pytriton_bundle_dir()
    if bundle is None:
        raise TritonNotFoundError(
            "no tritonserver found: none on PATH, none in /opt/tritonserver, and the nvidia-pytriton wheel is "
            f"not installed for {sys.executable} (pip install nvidia-pytriton==0.7.0)"
        )
    return prepare_pytriton_bundle(bundle, cache_dir=cache_dir)


def pytriton_bundle_dir() -> Path | None:
    """`<site-packages>/pytriton/tritonserver` without importing pytriton."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        return None
    bundle = Path(spec.origin).parent / "tritonserver"
    return bundle if (bundle / "bin" / "tritonserver").exists() else None


def prepare_pytriton_bundle(
    bundle: Path, cache_dir: str | Path | None = None, in_place: bool | None = None
) -> TritonInstall:
    """Install the stub for this Python into the bundle (`in_place`, default: when writable) or a private tree."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    custom = os.environ.get(STUB_ENV)
    if custom and not Path(custom).is_file():
        raise TritonNotFoundError(f"{STUB_ENV}={custom}: no such file")
    if custom:
        _check_stub_python(Path(custom), version)
    stub = Path(custom) if custom else bundle / "python_backend_stubs" / version / STUB_NAME
    if not stub.exists():
        shipped = sorted(p.name for p in (bundle / "python_backend_stubs").iterdir() if p.is_dir())
        raise TritonNotFoundError(
            f"nvidia-pytriton ships no python backend stub for Python {version} (it has {', '.join(shipped)}); "
            "use a venv with one of those versions"
        )
    backends = bundle / "backends"
    if in_place is None:
        in_place = os.access(backends / "python", os.W_OK)
    if not in_place:
        backends = _private_backends(
            bundle, Path(cache_dir) if cache_dir else _default_cache_dir(), version, stub
        )
    _install_file(stub, backends / "python" / STUB_NAME)
    return TritonInstall(
        binary=bundle / "bin" / "tritonserver",
        source="pytriton",
        backend_dir=backends,
        caches_dir=bundle / "caches",
        path_prepend=(str(interpreter_bin_dir()),),
        ld_library_path_prepend=(str(bundle_libs_dir(bundle)), *_libpython_dirs(version, backends.parent)),
        unset=("PYTHONHOME",),
    )


def _check_stub_python(stub: Path, version: str) -> None:
    """A stub links one `libpython3.X.so`: refuse one built for another Python than this interpreter."""
    linked = {m.decode() for m in re.findall(rb"libpython(3\.\d+)\.so", stub.read_bytes())}
    if linked and version not in linked:
        raise TritonNotFoundError(
            f"{STUB_ENV}={stub} was built for Python {', '.join(sorted(linked))}, not this interpreter's {version}: "
            "rebuild it with this Python (scripts/build_python_stub.py)"
        )


def interpreter_bin_dir() -> Path:
    """The dir whose `python3` is this interpreter (the venv's bin when running in a venv)."""
    for candidate in (Path(sys.prefix) / "bin", Path(sys.executable).parent):
        if (candidate / "python3").exists():
            return candidate
    raise TritonNotFoundError(
        f"no `python3` next to {sys.executable}: the python backend stub finds its environment through it"
    )


def bundle_libs_dir(bundle: Path) -> Path:
    """The shared libraries the wheel ships for its server (libcudart among them)."""
    wheel_libs = bundle.parent.parent / "nvidia_pytriton.libs"
    return wheel_libs if wheel_libs.is_dir() else bundle / "external_libs"


def _libpython_dirs(version: str, link_parent: Path) -> tuple[str, ...]:
    """A dir holding only a link to this interpreter's libpython (none needed for the system's own)."""
    soname = f"libpython{version}.so.1.0"
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent")
    if (libdir / soname).exists() and not str(libdir).startswith(SYSTEM_LIB_DIRS):
        link_dir = link_parent / f"libpython{version}-{hashlib.sha256(str(libdir).encode()).hexdigest()[:12]}"
        link_dir.mkdir(exist_ok=True)
        link = link_dir / soname
        if not link.is_symlink() or link.resolve() != (libdir / soname).resolve():
            _replace_with_symlink(libdir / soname, link)
        return (str(link_dir),)
    if ctypes.util.find_library(f"python{version}") is None:
        raise TritonNotFoundError(
            f"the python backend stub needs the shared library {soname}, which this interpreter "
            f"({sys.executable}) does not provide and the system does not have (install libpython{version})"
        )
    return ()


def _private_backends(bundle: Path, cache_dir: Path, version: str, stub: Path) -> Path:
    key = hashlib.sha256(f"{bundle.resolve()}|{stub.resolve()}".encode()).hexdigest()[:12]
    backends = cache_dir / f"tritonserver-backends-py{version}-{key}"
    python_dir = backends / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for source in (bundle / "backends" / "python").iterdir():
        if source.is_file() and source.name != STUB_NAME:
            link = python_dir / source.name
            if not link.is_symlink() or link.resolve() != source.resolve():
                _replace_with_symlink(source, link)
    return backends


def _install_file(source: Path, target: Path) -> None:
    """Copy `source` to `target` unless an identical copy is there; atomic, so concurrent callers are safe."""
    if target.exists() and filecmp.cmp(source, target, shallow=False):
        return
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    shutil.copy2(source, tmp)
    os.replace(tmp, target)


def _replace_with_symlink(source: Path, link: Path) -> None:
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(source.resolve())
    os.replace(tmp, link)


def _default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tritontts"


def _prepend(env: dict[str, str], name: str, entries: tuple[str, ...]) -> None:
    if not entries:
        return
    existing = [p for p in env.get(name, "").split(os.pathsep) if p and p not in entries]
    env[name] = os.pathsep.join([*entries, *existing])
