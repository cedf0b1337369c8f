#!/usr/bin/env python3
"""Fill `${name}` placeholders of a config.pbtxt template.

    python3 scripts/fill_template.py -i config.pbtxt key:value,key2:value2    # in place (upstream call form)
    python3 scripts/fill_template.py -o out.pbtxt config.pbtxt key:value       # into another file
    python3 scripts/fill_template.py config.pbtxt key:value                    # to stdout

Each positional substitution is split on commas, each pair on its first colon, so values may hold colons;
write `\\,` for a comma inside a value, or pass the pair with `-s key:value`, which is taken verbatim.
A key that is not a placeholder of the file is an error, and so is a placeholder left unfilled, unless
`--allow-unfilled` (the TensorRT-LLM backend reads a leftover `${...}` as "not set").
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TemplateError(ValueError):
    """A substitution that does not fit the template."""


def split_unescaped(text: str, delimiter: str) -> list[str]:
    """Split on `delimiter` except where it follows a backslash; `\\x` stands for `x`."""
    parts, current, escaped = [], [], False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == delimiter:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if escaped:
        current.append("\\")
    parts.append("".join(current))
    return parts


def parse_pair(pair: str) -> tuple[str, str]:
    key, sep, value = pair.partition(":")
    key = key.strip()
    if not sep or not KEY.fullmatch(key):
        raise TemplateError(f"'{pair}' is not a key:value pair")
    return key, value


def parse_substitutions(joined: list[str], verbatim: list[str] = ()) -> dict[str, str]:
    pairs = [parse_pair(p) for text in joined for p in split_unescaped(text, ",") if p.strip()]
    pairs += [parse_pair(p) for p in verbatim]
    values: dict[str, str] = {}
    for key, value in pairs:
        if key in values and values[key] != value:
            raise TemplateError(
                f"key '{key}' given twice with different values: '{values[key]}' and '{value}'"
            )
        values[key] = value
    return values


def placeholders(text: str) -> list[str]:
    return list(dict.fromkeys(PLACEHOLDER.findall(text)))


def fill(text: str, values: dict[str, str], allow_unfilled: bool = False, source: str = "template") -> str:
    present = set(placeholders(text))
    unknown = [key for key in values if key not in present]
    if unknown:
        raise TemplateError(
            f"key '{unknown[0]}' is not a placeholder in {source} (it has: {', '.join(sorted(present))})"
        )
    filled = PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)
    left = [name for name in placeholders(text) if name not in values]
    if left and not allow_unfilled:
        raise TemplateError(
            f"placeholders left unfilled in {source}: {', '.join(left)} (or pass --allow-unfilled)"
        )
    return filled


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("file_path", type=Path, help="the config.pbtxt template")
    parser.add_argument("substitutions", nargs="*", help="key:value[,key:value...]")
    parser.add_argument(
        "-s", "--set", dest="verbatim", action="append", default=[], help="one key:value, verbatim"
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument("-i", "--in_place", "--in-place", action="store_true", help="rewrite the file")
    target.add_argument("-o", "--output", type=Path, help="write the filled file here")
    parser.add_argument("--allow-unfilled", "--allow_unfilled", action="store_true")
    args = parser.parse_args(argv)
    try:
        text = args.file_path.read_text()
        values = parse_substitutions(args.substitutions, args.verbatim)
        filled = fill(text, values, allow_unfilled=args.allow_unfilled, source=str(args.file_path))
    except (OSError, TemplateError) as err:
        print(f"fill_template.py: error: {err}", file=sys.stderr)
        return 1
    if args.in_place:
        write_atomic(args.file_path, filled)
    elif args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.output, filled)
    else:
        sys.stdout.write(filled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
