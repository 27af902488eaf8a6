"""One reading layer for every file parplan reads (models, layer tables, arrays, devices,
topologies, profiles, plans): text, JSON and TOML with one error shape.

Every failure is the caller's error class with a message naming the file and what is wrong
with it: missing, a directory, not UTF-8, unreadable, not valid JSON/TOML, nested too deeply.

Example:
    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("wb", suffix=".toml", delete=False) as f:
    ...     _ = f.write(b"\\xff\\xfe")
    >>> try:
    ...     read_text(f.name, "device file")
    ... except ConfigError as exc:
    ...     print(str(exc).replace(f.name, "X"))
    device file 'X' is not UTF-8 text
    >>> os.unlink(f.name)
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from parplan.errors import ConfigError

#: Files larger than this are refused before they are read (no planner input is this big).
MAX_FILE_BYTES = 256 * 2**20


def read_text(
    path: str | Path, what: str, error: type[Exception] = ConfigError, hint: str = ""
) -> str:
    """The UTF-8 text of ``path``; ``what`` names the kind of file in messages ("model file")."""
    p = Path(path)
    where = f"{what} '{path}'"
    if not p.exists():
        raise error(f"{where} does not exist" + (f"; {hint}" if hint else ""))
    if p.is_dir():
        raise error(f"{where} is a directory, not a file")
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise error(
                f"{where} is {size / 2**20:.0f} MiB; files over {MAX_FILE_BYTES // 2**20} MiB are refused"
            )
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{where} is not UTF-8 text") from None
    except OSError as exc:
        raise error(f"{where} cannot be read ({exc.strerror or exc})") from None


def parse_json(text: str, where: str, error: type[Exception] = ConfigError) -> Any:
    """``json.loads`` with parse errors and over-deep nesting as one message."""
    return _parse(json.loads, json.JSONDecodeError, "JSON", text, where, error)


def parse_toml(text: str, where: str, error: type[Exception] = ConfigError) -> dict:
    """``tomllib.loads`` with parse errors and over-deep nesting as one message."""
    return _parse(tomllib.loads, tomllib.TOMLDecodeError, "TOML", text, where, error)


def _parse(
    loads, decode_error: type[Exception], kind: str, text: str, where: str, error: type[Exception]
):
    try:
        return loads(text)
    except decode_error as exc:
        raise error(f"{where}: not valid {kind} ({exc})") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply to be a parplan input") from None


def read_structured(path: str | Path, what: str, error: type[Exception] = ConfigError) -> Any:
    """A JSON (``.json``) or TOML (any other suffix) file's data."""
    text = read_text(path, what, error)
    where = f"{what} '{path}'"
    if Path(path).suffix.lower() == ".json":
        return parse_json(text, where, error)
    return parse_toml(text, where, error)
