"""A model's session state as a JSON tree plus named arrays, and back.

The state is walked generically (dataclasses, lists, tuples, string-keyed dicts, scalars, None,
MLX and numpy arrays) rather than by the field names of today's cache classes: the classes
change as the models do. Each dataclass is recorded by module, qualified name and field names;
loading refuses a tree whose class no longer exists or whose fields no longer match, so a file
written by another version of the code is never half-understood. Only dataclasses of ``ds4mlx``
modules are rebuilt: a file never gets to import arbitrary code.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import mlx.core as mx
import numpy as np

# Modules whose dataclasses a state may hold.
_TRUSTED_PREFIX = "ds4mlx."


class StateFormatError(ValueError):
    """A state tree that cannot be written, or rebuilt by this version of the code."""


def encode_state(state: Any) -> tuple[Any, dict[str, mx.array]]:
    """``state`` as a JSON-serialisable tree whose arrays are references into the returned
    dict of named arrays."""
    arrays: dict[str, mx.array] = {}

    def walk(obj: Any) -> Any:
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, (int, float)):
            return obj
        if isinstance(obj, (np.integer, np.floating, np.bool_)):
            return {"numpy_scalar": str(obj.dtype), "value": obj.item()}
        if isinstance(obj, mx.array):
            return {"array": _add(arrays, obj)}
        if isinstance(obj, np.ndarray):
            return {"ndarray": _add(arrays, mx.array(obj))}
        if isinstance(obj, list):
            return {"list": [walk(item) for item in obj]}
        if isinstance(obj, tuple):
            return {"tuple": [walk(item) for item in obj]}
        if isinstance(obj, dict):
            if not all(isinstance(key, str) for key in obj):
                raise StateFormatError("a state dict with non-string keys cannot be saved")
            return {"dict": {key: walk(value) for key, value in obj.items()}}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            cls = type(obj)
            return {
                "class": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f.name: walk(getattr(obj, f.name)) for f in dataclasses.fields(obj)},
            }
        raise StateFormatError(f"a session state holding {type(obj).__qualname__} cannot be saved")

    return walk(state), arrays


def decode_state(tree: Any, arrays: dict[str, mx.array]) -> Any:
    """The state ``encode_state`` described; StateFormatError when a class or field no
    longer matches or an array is missing."""

    def array(name: Any) -> mx.array:
        if not isinstance(name, str) or name not in arrays:
            raise StateFormatError(f"the state refers to a missing array {name!r}")
        return arrays[name]

    def walk(node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not isinstance(node, dict) or len(node) not in (1, 2):
            raise StateFormatError(f"unexpected node in a state tree: {str(node)[:80]}")
        if "array" in node:
            return array(node["array"])
        if "ndarray" in node:
            return np.array(array(node["ndarray"]))
        if "numpy_scalar" in node:
            return np.dtype(node["numpy_scalar"]).type(node["value"])
        if "list" in node:
            return [walk(item) for item in node["list"]]
        if "tuple" in node:
            return tuple(walk(item) for item in node["tuple"])
        if "dict" in node:
            return {key: walk(value) for key, value in node["dict"].items()}
        if "class" in node:
            return _rebuild(node["class"], {k: walk(v) for k, v in node["fields"].items()})
        raise StateFormatError(f"unexpected node in a state tree: {str(node)[:80]}")

    return walk(tree)


def _add(arrays: dict[str, mx.array], value: mx.array) -> str:
    name = f"a{len(arrays)}"
    arrays[name] = value
    return name


def _rebuild(qualified: str, values: dict[str, Any]) -> Any:
    module_name, _, qualname = qualified.partition(":")
    if not module_name.startswith(_TRUSTED_PREFIX) or not qualname:
        raise StateFormatError(f"the state names a class outside ds4mlx: {qualified}")
    try:
        cls: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError):
        raise StateFormatError(f"the state's class {qualified} no longer exists") from None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise StateFormatError(f"the state's class {qualified} is no longer a dataclass")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if set(fields) != set(values):
        raise StateFormatError(
            f"the fields of {qualified} changed: the file has "
            f"{sorted(values)}, the code {sorted(fields)}"
        )
    obj = cls(**{name: values[name] for name, f in fields.items() if f.init})
    for name, f in fields.items():
        if not f.init:  # a field the constructor derives: restore the saved value as it was
            object.__setattr__(obj, name, values[name])
    return obj
