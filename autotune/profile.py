"""The machine profile: one JSON file, a versioned schema, validated on load.

A profile records what ``autotune profile`` measured (or, for a machine we
cannot reach, what was published about it): alpha/beta of point-to-point and
of each native collective, the local cost of selection and sparse reduction,
the time of every registered allreduce algorithm on a grid of (n, P, density),
and the observed xi of the paper's Assumption 1.  docs/PROFILES.md describes
every field.

Loading never executes code: the file is parsed with :mod:`json` only and
checked field by field; each problem raises one :class:`ProfileError` naming
the file and the field.  A profile measured on another machine loads (its
numbers may still be useful) but :meth:`Profile.matches_current` lists how
the machines differ, and ``strict=True`` turns that into an error.

Example::

    from autotune.profile import Profile
    prof = Profile.load("profiles/cpu_shm_p4.json")
    t = prof.predict("allreduce", 4 << 20)      # seconds, at the profile's P
    t8 = prof.predict("allreduce", 4 << 20, P=8)
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import platform
import socket
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "SCHEMA",
    "VERSION",
    "PRIMITIVES",
    "COMPUTE_KERNELS",
    "MACHINE_KEYS",
    "Profile",
    "ProfileError",
    "model_terms",
    "concurrency",
    "local_fingerprint",
    "segment_at",
]

SCHEMA = "autotune-profile"
VERSION = 1


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the file and the problem."""

    def __init__(self, path, what: str):
        self.path = str(path)
        self.what = what
        super().__init__(f"{self.path}: {what}")


# -- the alpha-beta model shapes ----------------------------------------------------
def _log2c(P: int) -> int:
    return max(0, math.ceil(math.log2(P))) if P > 1 else 0


# name -> (model string, alpha coefficient A(P), beta coefficient B(P) per byte of m)
_SHAPES = {
    "p2p": ("a + b*m", lambda P: 1.0, lambda P: 1.0),
    "allgather": ("a*ceil(log2 P) + b*m*(P-1)", lambda P: _log2c(P), lambda P: P - 1.0),
    "allgatherv": ("a*ceil(log2 P) + b*m*(P-1)", lambda P: _log2c(P), lambda P: P - 1.0),
    "alltoallv": ("a*(P-1) + b*m*(P-1)", lambda P: P - 1.0, lambda P: P - 1.0),
    "allreduce": ("2a*ceil(log2 P) + 2b*m*(P-1)/P", lambda P: 2.0 * _log2c(P),
                  lambda P: 2.0 * (P - 1) / P),
    "bcast": ("a*ceil(log2 P) + b*m*ceil(log2 P)", lambda P: _log2c(P), lambda P: _log2c(P)),
}
PRIMITIVES = tuple(_SHAPES)
# Local compute kernels a profile times ("stream" is absent from older profiles).
COMPUTE_KERNELS = ("topk", "threshold", "reduce", "scatter_add", "stream")

# What m means per primitive (docs and `show`).
MESSAGE_MEANING = {
    "p2p": "bytes each rank sends to its partner (sendrecv, all pairs at once)",
    "allgather": "bytes per rank",
    "allgatherv": "bytes per rank",
    "alltoallv": "bytes to each peer",
    "allreduce": "bytes of the vector",
    "bcast": "bytes of the vector",
}


def model_terms(primitive: str, P: int) -> tuple[float, float]:
    """(A, B) such that the model's time is ``alpha*A + beta*m*B`` at P ranks."""
    try:
        _, a, b = _SHAPES[primitive]
    except KeyError:
        raise ValueError(f"unknown primitive {primitive!r}; known: {list(_SHAPES)}") from None
    return float(a(P)), float(b(P))


def model_string(primitive: str) -> str:
    return _SHAPES[primitive][0]


def concurrency(primitive: str, P: int) -> float:
    """Bytes all ranks together put on the wire, per byte of the model's beta term.

    On a single shared medium (every rank of one host behind one loopback or
    one memory system) the time is total bytes / link rate, so the beta fitted
    in the model shape is ``concurrency * beta_link``.  It is P for p2p (all
    pairs), allgather(v), alltoallv and allreduce; (P-1)/ceil(log2 P) for bcast.
    """
    _, B = model_terms(primitive, P)
    if B == 0:
        return 1.0
    total = {
        "p2p": 2 * (P // 2),
        "allgather": P * (P - 1),
        "allgatherv": P * (P - 1),
        "alltoallv": P * (P - 1),
        "allreduce": 2 * (P - 1),
        "bcast": P - 1,
    }[primitive]
    return total / B


# -- fingerprint -------------------------------------------------------------------
# Keys that identify the machine (compared by matches_current).  Hosts and P
# are recorded but not compared: a cluster hands out different nodes, and the
# same machine is profiled at several P.
MACHINE_KEYS = ("cpu_model", "gpu_model", "mpi_library", "nccl_version", "device", "network")


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or None


def gpu_model(device: str = "cpu") -> str | None:
    """The GPU's name when profiling on a GPU (cupy), else None."""
    if device != "gpu":
        return None
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return None


def nccl_version(device: str = "cpu") -> str | None:
    if device != "gpu":
        return None
    try:
        from cupy.cuda import nccl

        v = int(nccl.get_version())
        return f"{v // 10000}.{(v // 100) % 100}.{v % 100}" if v >= 10000 else str(v)
    except Exception:
        return None


def local_fingerprint(*, device: str | None = None, network: str | None = None,
                      mpi_library: str | None = None) -> dict:
    """What this process can tell about the machine without starting ranks.

    Keys left None are unknown and not compared.
    """
    fp = {"hosts": [socket.gethostname()], "cpu_model": cpu_model()}
    if device is not None:
        fp["device"] = device
        fp["gpu_model"] = gpu_model(device)
        fp["nccl_version"] = nccl_version(device)
    if network is not None:
        fp["network"] = network
    if mpi_library is None:
        mpi_library = _mpi_library_quiet()
    fp["mpi_library"] = mpi_library
    return fp


def _mpi_library_quiet() -> str | None:
    try:
        from collectives import mpi_library_version

        return mpi_library_version()
    except Exception:
        return None


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


# One protocol regime of a primitive (see segment_at).
_SEGMENT = {"from_bytes": INT, "alpha_s": _NONNEG, "beta_s_per_byte": _NONNEG}


def segment_at(rec: dict, m: float) -> tuple[float, float]:
    """(alpha, beta) of a primitive's record for a message of m bytes (the model's m).

    A record may carry ``segments``: contiguous size ranges (protocol regimes:
    eager/rendezvous, algorithm switches, cache -> DRAM, a token bucket's
    burst), each with its own alpha and beta in the primitive's model shape.
    Segment j covers ``from_bytes[j] <= m < from_bytes[j+1]``; the first also
    covers everything below, the last everything above.  Without segments
    (profiles written before them, published profiles) the single line
    ``alpha_s``/``beta_s_per_byte`` covers every size.
    """
    segs = rec.get("segments")
    if not segs:
        return float(rec["alpha_s"]), float(rec["beta_s_per_byte"])
    seg = segs[0]
    for s in segs[1:]:
        if m < s["from_bytes"]:
            break
        seg = s
    return float(seg["alpha_s"]), float(seg["beta_s_per_byte"])


def _typename(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "object"
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
    if isinstance(spec, _Map):
        if not isinstance(value, dict):
            return f"field '{where}' should be an object, got {_typename(value)}"
        for key, v in value.items():
            msg = _check(v, spec.spec, f"{where}.{key}")
            if msg:
                return msg
        return None
    if isinstance(spec, _List):
        if not isinstance(value, list):
            return f"field '{where}' should be a list, got {_typename(value)}"
        for i, v in enumerate(value):
            msg = _check(v, spec.spec, f"{where}[{i}]")
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
    msg = _check(data, SPEC, "")
    if msg:
        raise ProfileError(path, msg)
    for name, prim in data["primitives"].items():
        if name not in _SHAPES:
            raise ProfileError(path, f"unknown primitive 'primitives.{name}' "
                                     f"(known: {', '.join(_SHAPES)})")
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


# -- the record --------------------------------------------------------------------
def _round_floats(obj, digits: int = 5):
    """Shorter JSON: floats to ``digits`` significant digits (measurements are
    not more precise than that)."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}") if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _round_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_round_floats(v, digits) for v in obj]
    return obj


class Profile:
    """A validated machine profile.

    Attributes:
        data: the JSON document (a dict), as described in docs/PROFILES.md.
        path: where it was loaded from (or None).
        foreign: differences from the current machine found at load time
            (empty when it matches or when no comparison was asked for).
    """

    def __init__(self, data: dict, path=None, *, check: bool = True):
        if check:
            validate(data, path or "<profile>")
        self.data = data
        self.path = str(path) if path is not None else None
        self.foreign: list[str] = []

    # -- construction --------------------------------------------------------
    @classmethod
    def new(cls, *, source: str, fingerprint: dict, primitives: dict, compute: dict,
            runs: list, xi: dict, **extra) -> "Profile":
        data = {
            "schema": SCHEMA,
            "version": VERSION,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "source": source,
            "fingerprint": fingerprint,
            "primitives": primitives,
            "compute": compute,
            "runs": runs,
            "xi": xi,
        }
        data.update(extra)
        return cls(data)

    @classmethod
    def load(cls, path, *, current: dict | None = None, strict: bool = False) -> "Profile":
        """Read and validate a profile.

        Args:
            path: the JSON file.
            current: the current machine's fingerprint (e.g.
                :func:`local_fingerprint`); when given, differences are kept in
                ``profile.foreign``.
            strict: with ``current``, raise ProfileError on any difference.

        Raises:
            ProfileError: unreadable, corrupt, truncated, wrong schema or
                version, missing or mistyped field, or (strict) foreign.
        """
        prof = cls(cls.read_json(path), path)
        if current is not None:
            prof.foreign = prof.matches_current(current)
            if strict and prof.foreign:
                raise ProfileError(path, "profile is from another machine: "
                                         + "; ".join(prof.foreign))
        return prof

    @staticmethod
    def read_json(path):
        """The JSON document in ``path``, parsed but not validated (never executes code).

        Raises:
            ProfileError: missing, unreadable, not UTF-8, empty, truncated or not JSON.
        """
        path = Path(path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise ProfileError(path, "no such file") from None
        except IsADirectoryError:
            raise ProfileError(path, "is a directory, expected a JSON profile") from None
        except OSError as e:
            raise ProfileError(path, f"cannot read: {e.strerror}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProfileError(path, "not a text file (not UTF-8): is it a JSON profile?") from None
        return _parse(text, path)

    def to_json(self) -> str:
        return json.dumps(_round_floats(self.data), indent=1, allow_nan=False) + "\n"

    def save(self, path) -> Path:
        """Write atomically (a reader never sees half a file)."""
        path = Path(path)
        validate(self.data, path)
        text = self.to_json()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a profile is not
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.path = str(path)
        return path

    # -- queries ---------------------------------------------------------------
    @property
    def fingerprint(self) -> dict:
        return self.data["fingerprint"]

    @property
    def P(self) -> int:
        return int(self.fingerprint["P"])

    @property
    def primitives(self) -> dict:
        return self.data["primitives"]

    @property
    def runs(self) -> list:
        return self.data["runs"]

    def matches_current(self, current: dict) -> list[str]:
        """Differences between this profile's machine and ``current``.

        Only MACHINE_KEYS present (not None) in ``current`` are compared, so a
        partial fingerprint (e.g. no device known) compares what it can.
        Returns an empty list when nothing differs.
        """
        diffs = []
        mine = self.fingerprint
        for key in MACHINE_KEYS:
            if key not in current:
                continue
            here, there = current.get(key), mine.get(key)
            if here is None and key not in ("gpu_model", "nccl_version"):
                continue
            if here != there:
                diffs.append(f"{key} is {there!r} in the profile, {here!r} here")
        return diffs

    def predict(self, primitive: str, m: float, P: int | None = None) -> float:
        """Model time (s) of ``primitive`` with m bytes at P ranks.

        The (alpha, beta) of the size segment covering m are used
        (:func:`segment_at`).  At the profile's P they are used as they are.
        At another P on a single shared medium (``shared_medium`` in the
        record), beta is rescaled with :func:`concurrency`, since the measured
        beta already contains the contention of the measured P.
        """
        rec = self.primitives[primitive]
        P = self.P if P is None else int(P)
        A, B = model_terms(primitive, P)
        alpha, beta = segment_at(rec, m)
        if P != self.P and rec.get("shared_medium"):
            beta *= concurrency(primitive, P) / concurrency(primitive, self.P)
        return alpha * A + beta * m * B
