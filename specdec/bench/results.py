"""The typed results of the bench's suites and harnesses: `Result`, the base of each suite's dataclasses, writes
one as JSON and reads it back with every field checked against its declared type. The shapes themselves live
beside the report that renders them (hardware/kernels_report, hardware/long_context_report, serving/serve_report,
engines/map_weights; engines/model_runs for one model measured by specdec and by llama.cpp, and `real-models`);
Spec-Bench's are in specdec.bench.records, the load test's in serving/load_types.

A field that is a dataclass, a list or a dict of them, or optional, is read recursively; a key the class does not
declare, a missing field without a default, or a value of the wrong type is one line naming the file and the path
to the field (`long-context.json: passes[2].step_s: expected a number, got 'x'`). A field whose JSON key is not a
Python name (a goal's "pass") says so in its metadata: `field(metadata={"json": "pass"})`."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, Union

from specdec.atomic import write_text_atomic
from specdec.errors import SpecdecError
from specdec.inputs import read_json

R = TypeVar("R", bound="Result")


class Result:
    """A mixin for a suite's result dataclasses: to_json, from_json (checked), load and save."""

    def to_json(self) -> dict:
        return encode(self)

    @classmethod
    def from_json(cls: type[R], data, where: str | None = None) -> R:
        return decode(cls, data, where or cls.__name__)

    @classmethod
    def load(cls: type[R], path: str | Path) -> R:
        return cls.from_json(read_json(str(path)), Path(path).name)

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _key(f: dataclasses.Field) -> str:
    return f.metadata.get("json", f.name)


def encode(obj):
    """obj as JSON: dataclasses as objects (keys as their metadata names them), tuples as lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {_key(f): encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    return obj


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _at(where: str, path: tuple[str, ...]) -> str:
    """'file.json: passes[2].step_s'."""
    text = "".join(part if part.startswith("[") else "." + part for part in path).lstrip(".")
    return f"{where}: {text}" if text else where


def decode(tp, value, where: str, path: tuple[str, ...] = ()):
    """value (parsed JSON) as type tp, checked; SpecdecError naming `where` and the path to the field otherwise."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)

    def bad(expected: str) -> SpecdecError:
        return SpecdecError(f"{_at(where, path)}: expected {expected}, got {_describe(value)}")

    if tp is Any or tp is object:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options[:-1]:
            try:
                return decode(option, value, where, path)
            except SpecdecError:
                continue
        return decode(options[-1], value, where, path)
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, value, where, path)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, list):
            raise bad("a list")
        inner = args[0] if args else Any
        items = [decode(inner, v, where, (*path, f"[{i}]")) for i, v in enumerate(value)]
        return tuple(items) if tuple in (origin, tp) else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise bad("an object")
        inner = args[1] if args else Any
        return {k: decode(inner, v, where, (*path, k)) for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise bad(("an " if tp is int else "a ") + tp.__name__)
        return value
    raise TypeError(f"{_at(where, path)}: results.decode cannot read the type {tp!r}")  # a shape it does not know


def _decode_dataclass(cls: type, value, where: str, path: tuple[str, ...]):
    if not isinstance(value, dict):
        raise SpecdecError(f"{_at(where, path)}: expected an object, got {_describe(value)}")
    fields = {_key(f): f for f in dataclasses.fields(cls)}
    unknown = [k for k in value if k not in fields]
    if unknown:
        raise SpecdecError(f"{_at(where, path)}: unknown field {_describe(unknown[0])} (a {cls.__name__} has "
                           f"{', '.join(fields)})")
    hints, kwargs = _hints(cls), {}
    for key, f in fields.items():
        if key in value:
            kwargs[f.name] = decode(hints[f.name], value[key], where, (*path, key))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise SpecdecError(f"{_at(where, path)}: missing field {key!r}")
    return cls(**kwargs)
