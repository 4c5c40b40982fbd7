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
import gzip
import json
import math
import os
import platform
import socket
import tempfile
from pathlib import Path

__all__ = [
    "SCHEMA",
    "VERSION",
    "PRIMITIVES",
    "COMPUTE_KERNELS",
    "MACHINE_KEYS",
    "Profile",
    "ProfileError",
    "Link",
    "Linear",
    "PrimitiveFit",
    "migrate",
    "model_terms",
    "model_time",
    "concurrency",
    "wire_bytes",
    "local_fingerprint",
    "segment_at",
]

from ._profile_model import (COMPUTE_KERNELS, MESSAGE_MEANING, PRIMITIVES, Linear, Link,  # noqa: F401
                             PrimitiveFit, concurrency, model_string, model_terms, model_time,
                             segment_at, wire_bytes)
from ._profile_schema import SCHEMA, VERSION, ProfileError, _parse, migrate, validate  # noqa: F401

# The first bytes of a gzip stream (RFC 1952): a compressed JSON file is read as its text.
GZIP_MAGIC = b"\x1f\x8b"


# -- fingerprint -------------------------------------------------------------------
# Keys that identify the machine (compared by matches_current).  Hosts and P
# are recorded but not compared: a cluster hands out different nodes, and the
# same machine is profiled at several P.
# ``cpu_id`` came later: a profile without it is not compared on it.
MACHINE_KEYS = ("cpu_model", "cpu_id", "gpu_model", "mpi_library", "nccl_version", "device",
                "network")


def _cpuinfo() -> dict:
    """The first processor's fields in /proc/cpuinfo, keys lower-cased ({} elsewhere)."""
    out = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                out[key.strip().lower()] = " ".join(value.split())
    except OSError:
        pass
    return out


def cpu_model() -> str | None:
    return _cpuinfo().get("model name") or platform.processor() or None


def cpu_id() -> str | None:
    """Vendor, family, model and stepping, e.g. ``AuthenticAMD family 26 model 2
    stepping 1``: cloud VMs often show only a generic model name ("AMD EPYC") for
    CPUs of different generations, whose caches and memory differ; None where
    /proc/cpuinfo does not say (not Linux on x86)."""
    info = _cpuinfo()
    if "cpu family" not in info or "model" not in info:
        return None
    parts = [info.get("vendor_id", ""), f"family {info['cpu family']}", f"model {info['model']}"]
    if "stepping" in info:
        parts.append(f"stepping {info['stepping']}")
    return " ".join(p for p in parts if p)


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
    fp = {"hosts": [socket.gethostname()], "cpu_model": cpu_model(), "cpu_id": cpu_id()}
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


class _Field:
    """A read-only accessor of one field of the profile's JSON: ``path`` is the
    key, or the section and the key.  ``required``: KeyError when absent;
    else ``default`` (a fresh copy of an empty list or dict) where it is absent,
    None or empty.  ``convert`` is applied to a present value."""

    def __init__(self, *path: str, default=None, convert=None, required: bool = False,
                 doc: str = ""):
        self.path, self.default, self.convert, self.required = path, default, convert, required
        self.__doc__ = doc

    def __get__(self, prof, owner=None):
        if prof is None:
            return self
        value = prof.data
        for key in self.path[:-1]:
            value = value.get(key) or {}
        value = value.get(self.path[-1])
        if value is None and self.required:
            raise KeyError(f"profile has no {'.'.join(self.path)!r}")
        if value is None or (self.default is not None and not value):
            return type(self.default)() if isinstance(self.default, (list, dict)) else \
                self.default
        return self.convert(value) if self.convert else value


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
            data = migrate(data, path or "<profile>")
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
        """The JSON document in ``path``, parsed but not validated (never executes code);
        gzip-compressed (``.json.gz``, as docs/data stores its data sets) or not.

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
        if raw[:2] == GZIP_MAGIC:
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError) as e:
                raise ProfileError(path, f"a corrupt or truncated gzip file ({e})") from None
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

    @classmethod
    def of(cls, profile) -> "Profile":
        """``profile`` itself, or a dict (a profile's JSON document, possibly
        edited, possibly of an older version) migrated and wrapped, unchecked."""
        if isinstance(profile, Profile):
            return profile
        if isinstance(profile, dict) and "version" not in profile:
            return cls(profile, check=False)  # a partial document (tests): as it is
        return cls(migrate(profile), check=False)

    # -- queries ---------------------------------------------------------------
    fingerprint = _Field("fingerprint", required=True, doc="where and how it was measured")
    P = _Field("fingerprint", "P", convert=int, required=True,
               doc="the process count it was measured at")
    device = _Field("fingerprint", "device", default="?", doc='"cpu" or "gpu"')
    network = _Field("fingerprint", "network", default="?")
    backend = _Field("fingerprint", "backend",
                     doc='"mpi" or "nccl"; None in profiles made before it was recorded')
    hosts = _Field("fingerprint", "hosts", default=[])
    cores = _Field("fingerprint", "cores_per_host", doc="cores per host (rank 0's), or None")
    source = _Field("source", required=True, doc='"measured" or "published"')
    created = _Field("created", required=True)
    version = _Field("version", convert=int, required=True)
    runs = _Field("runs", default=[],
                  doc="the algorithm runs (dicts: algorithm, n, P, density, times_s, median_s, ...)")
    xi = _Field("xi", default={})
    settings = _Field("settings", default={})
    skipped = _Field("skipped", default=[])
    notes = _Field("notes", default="")
    link_burst = _Field("link_burst", default={},
                        doc="a shaped link's token bucket (profiler.measure_burst), or {}")

    @property
    def measured(self) -> bool:
        return self.source == "measured"

    @property
    def primitives(self) -> dict:
        """The primitive records as JSON (name -> dict); see :meth:`primitive`."""
        return self.data["primitives"]

    def primitive(self, name: str, default=KeyError) -> PrimitiveFit:
        """The fitted ``name`` (alpha, beta, segments, ``at(m)``); ``default``
        when the profile has no such primitive (KeyError unless given)."""
        rec = self.primitives.get(name)
        if rec is None:
            if default is KeyError:
                raise KeyError(f"profile has no {name!r} primitive")
            return default
        link = Link.of(rec)
        return PrimitiveFit(link.alpha, link.beta, link.segments, name=name,
                            shared_medium=bool(rec.get("shared_medium")), record=rec)

    @property
    def compute_device(self) -> str:
        return self.data["compute"]["device"]

    def compute(self, kind: str) -> Linear | None:
        """The ``kind`` kernel's ``t = c0 + c1*n`` (None where not measured:
        ``stream`` in profiles before 2026-11-26 13:00)."""
        c = self.data["compute"].get(kind)
        if c is None:
            return None
        segs = tuple((int(sg["from_elems"]), float(sg["c0_s"]), float(sg["c1_s_per_elem"]))
                     for sg in c.get("segments") or ())
        return Linear(float(c["c0_s"]), float(c["c1_s_per_elem"]), segs)

    def xi_by_density(self, field: str | None = None) -> dict:
        """{density string: value or None}: xi's, or those of ``xi[field]``
        (e.g. ``"captured_norm"``); {} where the profile lacks them."""
        xi = self.xi
        return ((xi.get(field) or {}) if field else xi).get("by_density") or {}

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
            if key == "cpu_id" and key not in mine:  # recorded since 2026-12-02
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
        fit = self.primitive(primitive)
        P = self.P if P is None else int(P)
        alpha, beta = fit.at(m)
        if P != self.P and fit.shared_medium:
            beta *= concurrency(primitive, P) / concurrency(primitive, self.P)
        return model_time(primitive, alpha, beta, m, P)
