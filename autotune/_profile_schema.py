"""The profile's schema: field-by-field validation and versioned migrations.

Parsing uses :mod:`json` only (no code runs); every problem raises one
:class:`ProfileError` naming the file and the field.  A file of an older schema
version is brought to the current one by :func:`migrate`, one step per version.
"""
from __future__ import annotations

import json
from typing import Any

from ._profile_model import PRIMITIVES, model_string

SCHEMA = "autotune-profile"
VERSION = 2


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the file and the problem."""

    def __init__(self, path, what: str):
        self.path = str(path)
        self.what = what
        super().__init__(f"{self.path}: {what}")


# -- validation --------------------------------------------------------------------
class _Opt:
    """Nullable: None or the inner spec."""

    def __init__(self, spec):
        self.spec = spec


class _List:
    def __init__(self, spec):
        self.spec = spec


class _Map:
    """A JSON object with free keys, each value of one spec."""

    def __init__(self, spec):
        self.spec = spec


class _Enum:
    def __init__(self, *values):
        self.values = values


NUM, INT, STR = "number", "integer", "string"
_NONNEG = "nonneg"  # a number >= 0

_FIT = {"c0_s": _NONNEG, "c1_s_per_elem": _NONNEG}

SPEC = {
    "schema": STR,
    "version": INT,
    "created": STR,
    "source": _Enum("measured", "published"),
    "fingerprint": {
        "hosts": _List(STR),
        "cpu_model": _Opt(STR),
        "gpu_model": _Opt(STR),
        "mpi_library": _Opt(STR),
        "nccl_version": _Opt(STR),
        "P": INT,
        "device": _Enum("cpu", "gpu"),
        "network": STR,
    },
    "primitives": _Map({
        "alpha_s": _NONNEG,
        "beta_s_per_byte": _NONNEG,
        "alpha_stderr": _Opt(_NONNEG),
        "beta_stderr": _Opt(_NONNEG),
        "model": STR,
        "heldout_median_rel_err": _Opt(_NONNEG),
        "samples": _List({"bytes": INT, "P": INT, "times_s": _List(_NONNEG)}),
    }),
    "compute": {
        "device": _Enum("cpu", "gpu"),
        "topk": _FIT,
        "threshold": _FIT,
        "reduce": _FIT,
        "samples": _List({"kernel": STR, "n": INT, "times_s": _List(_NONNEG)}),
    },
    "runs": _List({
        "algorithm": STR,
        "n": INT,
        "P": INT,
        "density": _Opt(NUM),
        "times_s": _List(_NONNEG),
        "median_s": _NONNEG,
        "bytes_sent_max": _Opt(INT),
        "split_s": _Map(NUM),
    }),
    "xi": {
        "source": STR,
        "by_density": _Map(_Opt(_NONNEG)),
        "median": _Opt(_NONNEG),
    },
}


# A shaped link's token bucket (optional: profiles of one CPU host; profiler.measure_burst).
_BURST = {"bytes": INT, "link_s_per_byte": _NONNEG, "drained_s": _NONNEG, "fresh_s": _NONNEG,
          "pause_s": _NONNEG, "link_bytes": INT}

# One protocol regime of a primitive (see segment_at).
_SEGMENT = {"from_bytes": INT, "alpha_s": _NONNEG, "beta_s_per_byte": _NONNEG}


_TYPENAMES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
              (list, "list"), (dict, "object"))


def _typename(v) -> str:
    if v is None:
        return "null"
    for cls, name in _TYPENAMES:
        if isinstance(v, cls):
            return name
    return type(v).__name__


def _check(value, spec, where: str) -> str | None:
    """None when ``value`` fits ``spec``, else the one message saying why."""
    if isinstance(spec, _Opt):
        return None if value is None else _check(value, spec.spec, where)
    if isinstance(spec, _Enum):
        if value not in spec.values:
            return f"field '{where}' must be one of {list(spec.values)}, got {value!r}"
        return None
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"field '{where}' should be an object, got {_typename(value)}"
        for key, sub in spec.items():
            w = f"{where}.{key}" if where else key
            if key not in value:
                return f"missing field '{w}'"
            msg = _check(value[key], sub, w)
            if msg:
                return msg
        return None
    if isinstance(spec, (_Map, _List)):
        is_map = isinstance(spec, _Map)
        if not isinstance(value, dict if is_map else list):
            return (f"field '{where}' should be {'an object' if is_map else 'a list'}, "
                    f"got {_typename(value)}")
        for key, v in (value.items() if is_map else enumerate(value)):
            msg = _check(v, spec.spec, f"{where}.{key}" if is_map else f"{where}[{key}]")
            if msg:
                return msg
        return None
    if spec == STR:
        ok = isinstance(value, str)
    elif spec == INT:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif spec in (NUM, _NONNEG):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and spec == _NONNEG and value < 0:
            return f"field '{where}' must be >= 0, got {value!r}"
    else:  # pragma: no cover - a bug in SPEC
        raise AssertionError(spec)
    if not ok:
        want = {NUM: "a number", _NONNEG: "a number", INT: "an integer", STR: "a string"}[spec]
        return f"field '{where}' should be {want}, got {_typename(value)} ({value!r:.40})"
    return None


def _reject_constant(name):
    raise ValueError(f"non-finite number {name} (JSON has no NaN/Infinity)")


def _parse(text: str, path) -> Any:
    if not text.strip():
        raise ProfileError(path, "empty file (expected a JSON profile)")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()):
            raise ProfileError(path, f"truncated: the JSON ends before the document is "
                                     f"complete ({e.msg} at line {e.lineno}, column {e.colno}); "
                                     "the file was cut short — measure again") from None
        raise ProfileError(path, f"not valid JSON: {e.msg} at line {e.lineno}, "
                                 f"column {e.colno}") from None
    except ValueError as e:
        raise ProfileError(path, str(e)) from None


def validate(data, path="<profile>") -> None:
    """Raise ProfileError (one message) unless ``data`` is a valid profile dict."""
    migrate(data, path)  # the checks of schema and version only (data is not changed)
    msg = _check(data, SPEC, "")
    if msg:
        raise ProfileError(path, msg)
    if "link_burst" in data:  # optional (profiles of one CPU host from 2026-11-29 on)
        msg = _check(data["link_burst"], _BURST, "link_burst")
        if msg:
            raise ProfileError(path, msg)
    for name, prim in data["primitives"].items():
        if name not in PRIMITIVES:
            raise ProfileError(path, f"unknown primitive 'primitives.{name}' "
                                     f"(known: {', '.join(PRIMITIVES)})")
        if prim["model"] != model_string(name):
            raise ProfileError(path, f"field 'primitives.{name}.model' is {prim['model']!r}, "
                                     f"expected {model_string(name)!r}")
        if "segments" in prim:  # optional (files written before regime-aware fits lack it)
            where = f"primitives.{name}.segments"
            msg = _check(prim["segments"], _List(_SEGMENT), where)
            if not msg and not prim["segments"]:
                msg = f"field '{where}' is empty (omit it for a single alpha-beta line)"
            if not msg:
                starts = [seg["from_bytes"] for seg in prim["segments"]]
                if any(b <= a for a, b in zip(starts, starts[1:])):
                    msg = f"field '{where}' must be sorted by from_bytes, got {starts}"
            if msg:
                raise ProfileError(path, msg)


# -- migrations ----------------------------------------------------------------------
def _v1_to_v2(data: dict) -> dict:
    """v1 -> v2: fill in the optional fields older files lack, with the values
    readers assumed when they were absent (so predictions do not change).

    fingerprint: ``cores_per_host`` and ``ranks_per_host`` None (unknown: no
    core-sharing scaling; ``backend`` stays absent: unknown); primitives:
    ``shared_medium`` False; compute: ``units`` {}; xi: ``relative_to_accumulator``
    and ``captured_norm`` None (not measured); top level: ``settings`` {},
    ``skipped`` [], ``notes`` "".  ``segments`` stays optional (absent: one line).
    """
    data = dict(data)
    if isinstance(data.get("fingerprint"), dict):
        fp = data["fingerprint"] = dict(data["fingerprint"])
        fp.setdefault("cores_per_host", None)
        fp.setdefault("ranks_per_host", None)
    if isinstance(data.get("primitives"), dict):
        data["primitives"] = {
            name: ({"shared_medium": False, **rec} if isinstance(rec, dict) else rec)
            for name, rec in data["primitives"].items()}
    if isinstance(data.get("compute"), dict):
        data["compute"] = {"units": {}, **data["compute"]}
    if isinstance(data.get("xi"), dict):
        data["xi"] = {"relative_to_accumulator": None, "captured_norm": None, **data["xi"]}
    data.setdefault("settings", {})
    data.setdefault("skipped", [])
    data.setdefault("notes", "")
    data["version"] = 2
    return data


# version -> the step to version + 1.  A new version adds its step here.
MIGRATIONS = {1: _v1_to_v2}


def migrate(data, path="<profile>") -> dict:
    """``data`` brought to the current :data:`VERSION`, one step per version
    (the input is not modified).  Raises ProfileError for a document that is
    not a profile, or whose version is invalid or newer than this autotune's."""
    if not isinstance(data, dict):
        raise ProfileError(path, f"not a profile: the top level is a {_typename(data)}, "
                                 "expected an object")
    schema = data.get("schema")
    if schema != SCHEMA:
        raise ProfileError(path, f"not an autotune profile: schema is {schema!r}, "
                                 f"expected {SCHEMA!r}")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ProfileError(path, f"invalid schema version {version!r} (expected {VERSION})")
    if version > VERSION:
        raise ProfileError(path, f"schema version {version} is newer than this autotune "
                                 f"understands ({VERSION}); upgrade autotune-collectives")
    while data["version"] < VERSION:
        data = MIGRATIONS[data["version"]](data)
    return data
