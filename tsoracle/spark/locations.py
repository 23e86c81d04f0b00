"""Where tables live: `data_dir` as a local path or a Hadoop file-system URI, and table names."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tsoracle.errors import ConfigError

# A URI scheme (file:, hdfs:, s3a:, abfss:, ...); a Windows drive letter is not one.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")
TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def table_location(data_dir: str | os.PathLike[str]) -> str:
    """`data_dir` as Spark and Hadoop will address it: URIs stay as given (Spark resolves them
    with the matching file system), plain paths become absolute local paths."""
    text = os.fspath(data_dir)
    if not text.strip():
        raise ConfigError("data_dir is empty; give a directory or a file-system URI")
    if _SCHEME.match(text):
        return text.rstrip("/")
    return str(Path(text).resolve())


def check_table_name(name: object) -> str:
    if not isinstance(name, str) or not TABLE_NAME.match(name):
        raise ConfigError(
            f"table name {name!r} is not allowed: use letters, digits and _, starting with a "
            "letter or _ (at most 128); it names a directory under data_dir")
    return name
