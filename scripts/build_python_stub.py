"""Build `triton_python_backend_stub` from python_backend r24.12 (or --tag) for this Python.

The tritonserver bundled in nvidia-pytriton 0.7.0 (2.51, python backend r24.10) has a stub that frees numpy
arrays without the GIL; on GPUs it crashed BLS stubs under load. Build the fixed stub once per machine/Python:

    python scripts/build_python_stub.py --output exp/python_stub/triton_python_backend_stub --gpu auto
    export TRITONTTS_PYTHON_STUB=$PWD/exp/python_stub/triton_python_backend_stub   # or run.sh --python_stub

Needs cmake, a C++ compiler, git (unless --sources), the boost headers (libboost-dev), rapidjson-dev (or
rapidjson's include folder in --sources), zlib (not libarchive: upstream's stub target links it, no stub source
uses it, and the build drops it), this Python's headers and shared library, and for --gpu on a CUDA toolkit with
nvcc. A toolkit other than CUDA 12 gives a stub that needs that toolkit's libcudart on the serving host; --gpu off
needs no CUDA runtime.
NVIDIA's tritonserver containers (Dockerfile.server) already have a fixed python backend: no build needed there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from tritontts.triton.bundle import bundle_libs_dir, pytriton_bundle_dir
from tritontts.triton.stub_build import StubBuild, StubBuildError, build, find_nvcc, nvcc_cuda_major


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", type=Path, default=Path("exp/python_stub") / "triton_python_backend_stub")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path("exp/python_stub/work"),
        help="clones, patched trees, builds (per tag)",
    )
    parser.add_argument("--tag", default="r24.12", help="python_backend, common, core and backend release")
    parser.add_argument("--python", default=sys.executable, help="the Python the stub embeds")
    parser.add_argument(
        "--gpu",
        choices=("auto", "on", "off"),
        default="auto",
        help="auto: on when nvcc is found (PATH, /usr/local/cuda)",
    )
    parser.add_argument(
        "--sources", type=Path, default=None, help="a folder of checkouts instead of git clone"
    )
    parser.add_argument("--boost-include", type=Path, default=Path("/usr/include"))
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument(
        "--cmake-arg",
        dest="cmake_args",
        action="append",
        default=[],
        metavar="ARG",
        help="appended to the cmake configure command, repeatable; write --cmake-arg=-DNAME=VALUE",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, build nothing")
    return parser.parse_args(argv)


def cudart_warning(major: int) -> str:
    return (
        f"build_python_stub: warning: nvcc is CUDA {major}, so the GPU stub will link that toolkit's "
        f"libcudart.so.{major}, which must be found at run time on the serving host (LD_LIBRARY_PATH); "
        "--gpu off builds a CPU-only stub that needs no CUDA runtime (BLS models then pass CPU tensors)"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpu = find_nvcc() is not None if args.gpu == "auto" else args.gpu == "on"
    if args.gpu == "auto" and not gpu:
        print(
            "build_python_stub: no nvcc found, building a CPU-only stub (BLS models then get CPU tensors only)"
        )
    nvcc = find_nvcc() if gpu else None
    major = nvcc_cuda_major(nvcc) if nvcc else None
    if major is not None and major != 12:
        print(cudart_warning(major), file=sys.stderr)
    options = {"jobs": args.jobs} if args.jobs else {}
    plan = StubBuild(
        work_dir=args.work_dir.resolve(),
        tag=args.tag,
        python=args.python,
        gpu=gpu,
        sources=args.sources.resolve() if args.sources else None,
        boost_include=args.boost_include,
        cmake_args=tuple(args.cmake_args),
        **options,
    )
    if args.dry_run:
        for command in [*plan.clone_commands(), plan.cmake_command(), plan.make_command()]:
            print(" ".join(command))
        return 0
    bundle = pytriton_bundle_dir()
    bundle_libs = bundle_libs_dir(bundle) if bundle else None
    try:
        stub = build(plan, args.output.resolve(), bundle_libs=bundle_libs)
    except StubBuildError as error:
        print(f"build_python_stub: {error}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as error:
        command = " ".join(map(str, error.cmd))
        print(
            f"build_python_stub: `{command}` failed with exit code {error.returncode} (output above)",
            file=sys.stderr,
        )
        return 1
    print(f"built {stub} (python_backend {args.tag}, GPU {'on' if gpu else 'off'}, {args.python})")
    print(f"use it: export TRITONTTS_PYTHON_STUB={stub}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
