"""scripts/build_python_stub.py: the commands it runs and the CMake edits it makes (the build itself is not run
here: two minutes of C++; see the README for the builds that were run)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from scripts.build_python_stub import main as build_main
from tritontts.triton.stub_build import (
    SOURCES,
    StubBuild,
    StubBuildError,
    link_bundled_cudart,
    patchelf,
    prepare_trees,
)

BOOST_BLOCK = """include(ExternalProject)
ExternalProject_Add(
  boostorg
  URL https://archives.boost.io/release/1.80.0/source/boost_1_80_0.tar.gz
  PREFIX "boost-src"
  CONFIGURE_COMMAND ${CMAKE_COMMAND} -E copy_directory
                    <SOURCE_DIR>/boost/ ${CMAKE_BINARY_DIR}/boost
  INSTALL_COMMAND ""
  BUILD_COMMAND ""
)
set(boostorg_INCLUDE_DIRS "${CMAKE_BINARY_DIR}/boost/")
"""
KERNEL_LINE = (
    'set_target_properties(kernel_library_new PROPERTIES CUDA_ARCHITECTURES "53;60-real;70-real;90-real")\n'
)


def write_checkouts(root: Path) -> Path:
    for name in SOURCES:
        (root / name).mkdir(parents=True)
    (root / "python_backend" / "CMakeLists.txt").write_text(f"project(x)\n{BOOST_BLOCK}add_library(stub)\n")
    (root / "common" / "src").mkdir()
    (root / "common" / "src" / "CMakeLists.txt").write_text("add_library(a)\nadd_subdirectory(test)\n")
    (root / "backend" / "CMakeLists.txt").write_text(f"add_library(kernel_library_new)\n{KERNEL_LINE}")
    return root


def test_clone_commands_fetch_every_source_at_its_tag(tmp_path):
    plan = StubBuild(work_dir=tmp_path, tag="r24.12")
    commands = plan.clone_commands()
    tags = {Path(c[-1]).name: c[c.index("--branch") + 1] for c in commands}
    assert tags == {
        "python_backend": "r24.12",
        "common": "r24.12",
        "core": "r24.12",
        "backend": "r24.12",
        "pybind11": "v2.12.0",
        "dlpack": "v0.8",
    }
    assert all(c[:4] == ["git", "clone", "--depth", "1"] for c in commands)
    assert StubBuild(work_dir=tmp_path, sources=tmp_path).clone_commands() == []


def test_cmake_reads_the_patched_trees_and_builds_offline(tmp_path):
    sources = write_checkouts(tmp_path / "src")
    plan = StubBuild(work_dir=tmp_path / "work", sources=sources, gpu=True, python="/opt/py/bin/python3.12")
    command = plan.cmake_command()
    assert command[command.index("-S") + 1] == str(tmp_path / "work" / "python_backend")
    assert "-DFETCHCONTENT_FULLY_DISCONNECTED=ON" in command
    assert "-DTRITON_ENABLE_GPU=ON" in command
    assert "-DPYTHON_EXECUTABLE=/opt/py/bin/python3.12" in command
    dirs = dict(
        arg[len("-DFETCHCONTENT_SOURCE_DIR_") :].split("=", 1) for arg in command if "SOURCE_DIR" in arg
    )
    assert dirs == {
        "REPO-COMMON": str(tmp_path / "work" / "common"),
        "REPO-CORE": str(sources / "core"),
        "REPO-BACKEND": str(tmp_path / "work" / "backend"),
        "PYBIND11": str(sources / "pybind11"),
        "DLPACK": str(sources / "dlpack"),
    }
    assert plan.make_command()[:5] == [
        "cmake",
        "--build",
        str(tmp_path / "work" / "build"),
        "--target",
        "triton-python-backend-stub",
    ]


def test_prepare_trees_swaps_the_boost_download_and_drops_common_tests(tmp_path):
    sources = write_checkouts(tmp_path / "src")
    plan = StubBuild(work_dir=tmp_path / "work", sources=sources, boost_include=Path("/usr/include"))
    prepare_trees(plan)
    backend_cmake = (tmp_path / "work" / "python_backend" / "CMakeLists.txt").read_text()
    assert "ExternalProject_Add" not in backend_cmake
    assert 'add_custom_target(boostorg)\nset(boostorg_INCLUDE_DIRS "/usr/include")' in backend_cmake
    assert backend_cmake.endswith("add_library(stub)\n")
    assert "# add_subdirectory(test)" in (tmp_path / "work" / "common" / "src" / "CMakeLists.txt").read_text()
    assert 'CUDA_ARCHITECTURES "80-real"' in (tmp_path / "work" / "backend" / "CMakeLists.txt").read_text()
    assert "ExternalProject_Add" in (sources / "python_backend" / "CMakeLists.txt").read_text()  # untouched
    prepare_trees(plan)  # again: starts from fresh copies


def test_a_common_tree_without_tests_is_fine(tmp_path):
    sources = write_checkouts(tmp_path / "src")
    (sources / "common" / "src" / "CMakeLists.txt").write_text("add_library(a)\n")
    prepare_trees(StubBuild(work_dir=tmp_path / "work", sources=sources))
    assert (tmp_path / "work" / "common" / "src" / "CMakeLists.txt").read_text() == "add_library(a)\n"


def test_an_unknown_cmake_layout_is_an_error_naming_the_file(tmp_path):
    sources = write_checkouts(tmp_path / "src")
    (sources / "python_backend" / "CMakeLists.txt").write_text("project(x)\n")
    with pytest.raises(
        StubBuildError, match=r"python_backend/CMakeLists.txt: expected one the ExternalProject"
    ):
        prepare_trees(StubBuild(work_dir=tmp_path / "work", sources=sources))


def test_check_names_what_is_missing(tmp_path):
    with pytest.raises(StubBuildError, match="no boost headers in"):
        StubBuild(work_dir=tmp_path, boost_include=tmp_path).check()
    boost = tmp_path / "inc"
    (boost / "boost").mkdir(parents=True)
    (boost / "boost" / "version.hpp").write_text("")
    (tmp_path / "src" / "core").mkdir(parents=True)
    if shutil.which("cmake") and shutil.which("c++"):
        with pytest.raises(StubBuildError, match="lacks python_backend, common, backend, pybind11, dlpack"):
            StubBuild(work_dir=tmp_path, sources=tmp_path / "src", boost_include=boost).check()


def test_dry_run_prints_the_plan(tmp_path, capsys):
    assert build_main(["--dry-run", "--work-dir", str(tmp_path), "--gpu", "off", "--jobs", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8
    assert lines[0].startswith(
        "git clone --depth 1 --branch r24.12 https://github.com/triton-inference-server/"
    )
    assert "-DTRITON_ENABLE_GPU=OFF" in lines[6]
    assert lines[7].endswith("--target triton-python-backend-stub -j 3")


@pytest.mark.skipif(not (shutil.which("cc") and patchelf()), reason="needs cc and patchelf")
def test_a_gpu_stub_is_pointed_at_the_wheels_cudart(tmp_path):
    libs = tmp_path / "nvidia_pytriton.libs"
    libs.mkdir()
    (tmp_path / "lib.c").write_text("int cudart_marker(void) { return 7; }\n")
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcudart.so.12",
            "-o",
            str(tmp_path / "libcudart.so.12"),
            "lib.c",
        ],
        check=True,
        cwd=tmp_path,
    )
    shutil.copy(tmp_path / "libcudart.so.12", libs / "libcudart-09529672.so.12.6.77")
    (tmp_path / "main.c").write_text(
        "int cudart_marker(void);\nint main(void) { return cudart_marker() - 7; }\n"
    )
    stub = tmp_path / "stub"
    subprocess.run(
        ["cc", "-o", str(stub), "main.c", str(tmp_path / "libcudart.so.12"), f"-Wl,-rpath,{tmp_path}"],
        check=True,
        cwd=tmp_path,
    )
    tool = patchelf()
    assert link_bundled_cudart(stub, libs, tool) == "libcudart-09529672.so.12.6.77"
    needed = subprocess.run([tool, "--print-needed", str(stub)], capture_output=True, text=True, check=True)
    assert "libcudart-09529672.so.12.6.77" in needed.stdout.split() and "libcudart.so.12" not in needed.stdout
    (tmp_path / "libcudart.so.12").unlink()  # only the wheel's copy is left to find
    assert subprocess.run([str(stub)], env={"LD_LIBRARY_PATH": str(libs)}).returncode == 0
    assert link_bundled_cudart(stub, libs, tool) is None  # already pointed there
