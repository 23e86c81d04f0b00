"""Check a dashboard's JSON against Grafana's own published dashboard model (schema v1).

The model is Grafana Labs' foundation SDK for Python (`grafana-foundation-sdk`, its build for
Grafana 11.6), whose classes are generated from the CUE schemas that define Grafana's dashboard
kind and its panel and query plugins. Its `from_json` reads without checking types, so this
module checks the result against the classes' type hints, then encodes the model back to JSON
and compares:

- a key the model drops is a field Grafana's schema does not define;
- a value of the wrong type, an enum or literal value outside the schema's set, null in a
  field that is not nullable, a missing required field: a type error at its JSON path;
- a panel type or a query's datasource type the model has no plugin schema for (Grafana
  would show "panel plugin not found", and nothing inside such a panel could be checked).

    python -m tsoracle_dev.dashboards.grafana_model FILE.json...   # prints problems, exits 1 on any
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel

register_default_plugins()
SCHEMA_VERSION = Dashboard().schema_version  # the layout the model describes (41: Grafana 11.6)


@functools.cache
def _json_names(cls: type) -> dict[str, str]:
    """Attribute -> JSON key, read from the class's generated `from_json` (the names are not
    derivable: `type_val` is "type", `folder_uid` "folderUID", `auto_min` "auto_min")."""
    try:
        source = inspect.getsource(cls.from_json)
    except (OSError, TypeError, AttributeError):
        return {}
    return {attr: key for key, attr in _FROM_JSON_KEY.findall(source)}


def _camel(attr: str) -> str:
    """The JSON key of an attribute whose `from_json` branch is not the usual one-liner."""
    head, *rest = attr.removesuffix("_val").split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


_FROM_JSON_KEY = re.compile(r'if "([^"]+)" in data:\s*args\["([^"]+)"\]')


def _is_model(value: object) -> bool:
    return callable(getattr(value, "to_json", None)) and bool(_hints(type(value)))


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):
        return {}


def _describe(value: object) -> str:
    text = json.dumps(value, cls=JSONEncoder) if not _is_model(value) else type(value).__name__
    return f"{type(value).__name__} {text[:40]}"


def _check(value: object, hint: Any, path: str, out: list[str], raw: object = None) -> None:
    """`value` as the model read it from `raw` (its JSON) against the type hint `hint`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        if _is_model(value):
            _walk(value, path, out, raw)
        return
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return
        tried = []
        for alt in args:
            if alt is type(None):
                continue
            errors: list[str] = []
            _check(value, alt, path, errors, raw)
            if not errors:
                return
            tried.append(errors)
        out.extend(min(tried, key=len) if tried else [f"{path}: null is not allowed"])
        return
    if value is None:
        out.append(f"{path}: null where the schema wants {_hint_name(hint)}")
        return
    if origin is typing.Literal:
        if value not in args:
            out.append(f"{path}: {value!r} is not one of {list(args)}")
        return
    if origin is list:
        if not isinstance(value, list):
            out.append(f"{path}: expected a list, got {_describe(value)}")
            return
        raws = raw if isinstance(raw, list) and len(raw) == len(value) else [None] * len(value)
        for i, (item, item_raw) in enumerate(zip(value, raws, strict=True)):
            _check(item, args[0] if args else Any, f"{path}[{i}]", out, item_raw)
        return
    if origin is dict:
        if not isinstance(value, dict):
            out.append(f"{path}: expected an object, got {_describe(value)}")
            return
        for key, item in value.items():
            _check(item, args[1] if len(args) == 2 else Any, f"{path}.{key}", out)
        return
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        allowed = [m.value for m in hint]
        if isinstance(value, bool) or (not isinstance(value, hint) and value not in allowed):
            out.append(f"{path}: {value!r} is not one of {allowed}")
        return
    if hint is bool:
        if not isinstance(value, bool):
            out.append(f"{path}: expected a boolean, got {_describe(value)}")
        return
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            out.append(f"{path}: expected an integer, got {_describe(value)}")
        return
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            out.append(f"{path}: expected a number, got {_describe(value)}")
        return
    if hint is str:
        if not isinstance(value, str):
            out.append(f"{path}: expected a string, got {_describe(value)}")
        return
    if hint is cogvariants.Dataquery:
        if isinstance(value, cogruntime.UnknownDataquery):
            out.append(f"{path}: a query of no datasource type the model knows (set the panel's"
                       " datasource to {type, uid})")
        elif isinstance(value, cogvariants.Dataquery):
            _walk(value, path, out, raw)
        else:
            out.append(f"{path}: expected a query object, got {_describe(value)}")
        return
    if isinstance(hint, type):
        if not isinstance(value, hint):
            out.append(f"{path}: expected {hint.__name__}, got {_describe(value)}")
        elif _is_model(value):
            _walk(value, path, out, raw)
        return
    raise TypeError(f"{path}: type hint {hint!r} not understood")


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint)


def _optional(hint: Any) -> bool:
    return (typing.get_origin(hint) in (typing.Union, types.UnionType)
            and type(None) in typing.get_args(hint))


def _walk(model: object, path: str, out: list[str], raw: object = None) -> None:
    names = _json_names(type(model))
    for attr, hint in _hints(type(model)).items():
        key = names.get(attr) or _camel(attr)
        if isinstance(raw, dict) and key not in raw and not _optional(hint):
            out.append(f"{path}.{key}: missing, and the schema requires it")
            continue
        _check(getattr(model, attr, None), hint, f"{path}.{key}", out,
               raw.get(key) if isinstance(raw, dict) else None)
    if isinstance(model, Panel) and cogruntime.panelcfg_config(model.type_val) is None:
        out.append(f"{path}.type: {model.type_val!r} is not a panel plugin the model knows")


def _lost(original: object, back: object, path: str, out: list[str]) -> None:
    """What the model did not keep: unknown fields, and values it could not represent."""
    if isinstance(original, dict) and isinstance(back, dict):
        for key, value in original.items():
            if key not in back and value is None:
                out.append(f"{path}.{key}: null (the schema has no nulls; leave the field out)")
            elif key not in back:
                out.append(f"{path}.{key}: not a field of Grafana's schema here "
                           f"(value {json.dumps(value)[:40]})")
            else:
                _lost(value, back[key], f"{path}.{key}", out)
    elif isinstance(original, list) and isinstance(back, list) and len(original) == len(back):
        for i, (a, b) in enumerate(zip(original, back, strict=True)):
            _lost(a, b, f"{path}[{i}]", out)
    elif original != back or isinstance(original, bool) != isinstance(back, bool):
        out.append(f"{path}: {json.dumps(original)[:40]} does not survive the model "
                   f"(becomes {json.dumps(back)[:40]})")


_UNREADABLE = (AttributeError, TypeError, KeyError, ValueError, IndexError)


def problems(board: dict[str, Any]) -> list[str]:
    """Everything in `board` that Grafana's dashboard model rejects; [] when it accepts it."""
    if not isinstance(board, dict):
        return [f"dashboard: expected an object, got {_describe(board)}"]
    try:
        model = Dashboard.from_json(board)
    except _UNREADABLE as exc:
        where = "dashboard"
        for i, panel in enumerate(board.get("panels") or []):
            try:
                Panel.from_json(panel)
            except _UNREADABLE:
                where = f"dashboard.panels[{i}] ({_describe(panel.get('title'))})"
                break
        return [f"{where}: the model cannot read it: {type(exc).__name__}: {exc}"]
    out: list[str] = []
    if isinstance(model.schema_version, int) and model.schema_version < SCHEMA_VERSION:
        out.append(f"dashboard.schemaVersion: {model.schema_version} declares a layout older"
                   f" than this model's ({SCHEMA_VERSION}): Grafana would migrate it as one")
    _walk(model, "dashboard", out, board)
    back = json.loads(json.dumps(model, cls=JSONEncoder))
    _lost(board, back, "dashboard", out)
    return out


def main(argv: list[str]) -> int:
    bad = 0
    for name in argv:
        for problem in problems(json.loads(Path(name).read_text())):
            print(f"{name}: {problem}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
