"""Checking a call's inputs on every rank: one small allgather per call.

``validate`` is the gate every allreduce passes before its first message: each
rank contributes a problem code and a fingerprint of what must agree (size,
dtype, shape, name, algorithm and op, parameters), so that every rank raises
the same error, or every rank goes on.  The fingerprint and the static checks
are computed once per distinct signature and cached; a call repeats only the
allgather of two integers.  Only on a problem is a second, detailed exchange
made, to name what differs and on which ranks.

Non-finite values: a host (numpy) input is scanned on the spot; a device
(cupy) input is scanned by one kernel into a device flag (``DeviceFlags``),
never read back per call, and reported by ``report_nonfinite`` on every rank
(``autotune.synchronize()``; the DDP hook calls it at the end of each step).

``agree`` is the same gate for arbitrary values (constructor arguments,
options).
"""
from __future__ import annotations

import zlib

import numpy as np

import kernels

from ._comm import Communicator

__all__ = ["SUPPORTED_DTYPES", "DeviceFlags", "agree", "check_intervals", "report_nonfinite",
           "validate"]

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

_BAD_DTYPE, _NONCONTIG, _NONFINITE, _EMPTY, _BAD_DENSITY, _PROBLEM = 1, 2, 4, 8, 16, 32
_REASONS = {
    _BAD_DTYPE: ("TypeError", "unsupported dtype (supported: float32, float64; float16 and "
                              "bfloat16 through autotune.allreduce)"),
    _NONCONTIG: ("ValueError", "tensor is not contiguous"),
    _NONFINITE: ("ValueError", "tensor holds NaN or Inf"),
    _EMPTY: ("ValueError", "tensor is empty"),
    _BAD_DENSITY: ("ValueError", "density must be in (0, 1]"),
}


def _comparable(v):
    """A parameter as compared across ranks: numbers as floats (8, 8.0 and
    numpy's 8 agree), anything else by its repr (never raises)."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return repr(v)


def _crc(text) -> int:
    return zlib.crc32(str(text).encode()) & 0x7FFFFFFF


def check_intervals(**intervals) -> None:
    """Refresh intervals (tau, tau_prime) must be integers >= 1; None means unset.

    Raises:
        ValueError: naming the first bad one.
    """
    for what, v in intervals.items():
        ok = isinstance(v, (int, np.integer)) and not isinstance(v, bool)
        if isinstance(v, float) and v.is_integer():
            ok = True
        if v is not None and not (ok and v >= 1):
            raise ValueError(f"{what} must be an integer >= 1, got {v!r}")


class _Missing:
    """Stands in for an input that could not be read as an array on this rank."""

    dtype = np.dtype(np.uint8)
    size = 0
    shape = ()

    class flags:
        c_contiguous = True


def _local_code(x, density, contiguous) -> int:
    """The problems a signature has in itself (dtype, contiguity, size, density)."""
    code = 0
    dt = np.dtype(x.dtype)
    if dt not in SUPPORTED_DTYPES:
        code |= _BAD_DTYPE
    if not (x.flags.c_contiguous if contiguous is None else contiguous):
        code |= _NONCONTIG
    if x.size == 0:
        code |= _EMPTY
    if density is not None and not (isinstance(density, (int, float, np.floating, np.integer))
                                    and not isinstance(density, bool) and 0.0 < density <= 1.0):
        code |= _BAD_DENSITY
    return code


def validate(comm: Communicator, x, *, density: float | None = None, check_finite: bool = True,
             tag: str = "", params: dict | None = None, source: str | None = None,
             contiguous: bool | None = None, call: str = "",
             problem: BaseException | None = None, checked: bool = False):
    """Check ``x`` on every rank and agree on the verdict.

    One small allgather carries each rank's problem code and a fingerprint
    of its size, dtype, shape, ``tag``, ``call`` and parameters, so every
    rank raises the same error (naming the offending ranks) instead of some
    ranks entering a collective the others never reach.

    ``tag`` (e.g. the tensor's name), ``call`` (what the caller runs, e.g.
    ``"oktopk/sum"``: algorithm and op) and the parameters (``density`` and
    ``params``, e.g. ``{"tau": 64, "tau_prime": 8}``; None values count as
    unset) must also agree across ranks: ranks running different algorithms
    or selecting different k would exchange messages the others never expect.
    Refresh intervals in ``params`` (``tau``, ``tau_prime``) are checked too.

    ``check_finite``: a host input holding NaN or Inf raises now; a device
    input is flagged on the device and reported by :func:`report_nonfinite`
    (no read-back per call).

    ``source`` and ``contiguous`` describe the caller's tensor when ``x`` is
    a widened copy of it (a half-precision input reduced in float32): its
    dtype name is what must agree across ranks, and its contiguity is what
    is checked.

    ``problem``: an error this rank found before the call (an unknown
    algorithm, an input that is no array; ``x`` may then be None).  The
    lowest such rank's error is sent to every rank, which all raise it.

    ``checked``: the caller had this signature agreed by an earlier call and
    its calls follow each other in the same order with the same arguments on
    every rank by construction (the DDP hook's pieces).  A device input that
    passes the local checks then skips the exchange (its NaN / Inf scan is
    still enqueued); anything else is checked as usual.

    Raises:
        TypeError: unsupported dtype (or a ``problem`` that is one) on some rank.
        ValueError: any other problem on some rank, or shapes/dtypes/names/
            algorithms/parameters differing.
    """
    if params:
        if problem is None:
            try:
                check_intervals(tau=params.get("tau"), tau_prime=params.get("tau_prime"))
            except ValueError as e:
                problem = e
        params = tuple(sorted((k, _comparable(v)) for k, v in params.items() if v is not None))
    else:
        params = ()
    if problem is not None or x is None:
        code, fp = _PROBLEM, 0
    else:
        code, fp = _signature(x, density, params, tag, source, contiguous, call)
        if check_finite:
            if isinstance(x, np.ndarray):
                if not code & (_BAD_DTYPE | _EMPTY) and not np.isfinite(x).all():
                    code |= _NONFINITE
            elif not code and x.flags.c_contiguous:  # the kernel reads a flat float array
                _device_flags(comm).note(x, tag)
        if checked and not code and not isinstance(x, np.ndarray):
            return
    flat = _exchange(comm, (code, fp)).ravel().tolist()
    if not any(flat[0::2]) and flat[1::2].count(fp) == comm.size:
        return
    _explain(comm, x, code, density, params, tag, source, call, problem)


def _exchange(comm: Communicator, mine) -> np.ndarray:
    """Every rank's ``mine`` (ints): the (P, len(mine)) table of this module's checks."""
    if comm.size == 1:
        return np.asarray([mine], dtype=np.int64)
    with comm.phase("control:validate"):
        return comm.allgather_ints(mine)


_SIGNATURES: dict = {}


def _signature(x, density, params, tag, source, contiguous, call) -> tuple[int, int]:
    """(static problem code, fingerprint) of a call's signature, cached."""
    contig = bool(x.flags.c_contiguous) if contiguous is None else bool(contiguous)
    key = (tag, call, source, contig, x.dtype, x.shape, _comparable(density), params)
    try:
        hit = _SIGNATURES.get(key)
    except TypeError:  # an unhashable parameter: computed afresh each time
        key, hit = None, None
    if hit is None:
        shown = source or str(np.dtype(x.dtype))
        hit = (_local_code(x, density, contig),
               _crc(repr((int(x.size), shown, tuple(x.shape), tag, _comparable(density),
                          params, call))))
        if key is not None:
            if len(_SIGNATURES) >= 4096:
                _SIGNATURES.clear()
            _SIGNATURES[key] = hit
    return hit


def _explain(comm, x, code, density, params, tag, source, call, problem) -> None:
    """The detailed exchange after a problem (``code``: this rank's, from the
    first exchange): every rank raises the same error."""
    if x is None:
        x = _Missing()
    shown = source or str(np.dtype(x.dtype))
    param_hash = _crc(repr((_comparable(density), *params)))
    table = _exchange(comm, [code, int(x.size), _crc(shown), _crc(repr(tuple(x.shape))),
                             _crc(tag), param_hash, _crc(call)])
    codes = table[:, 0]
    if codes.any():
        _raise_problem(comm, table, problem)
        for bit, (kind, why) in _REASONS.items():
            ranks = [int(r) for r in np.flatnonzero(codes & bit)]
            if ranks:
                exc = TypeError if kind == "TypeError" else ValueError
                raise exc(f"allreduce: {why} on rank(s) {ranks}"
                          + (f" (dtype {shown})" if bit == _BAD_DTYPE and code & bit else ""))
    here = f"(this rank: shape {tuple(x.shape)}, dtype {shown}, name {tag!r}, call {call!r})"
    for col, what in ((1, "size"), (2, "dtype"), (3, "shape"), (4, "name"),
                      (6, "algorithm or op")):
        if (table[:, col] != table[0, col]).any():
            bad = [int(r) for r in np.flatnonzero(table[:, col] != table[0, col])]
            raise ValueError(f"allreduce: tensor {what} differs across ranks (rank(s) {bad} "
                             f"differ from rank 0) " + here)
    if (table[:, 5] != table[0, 5]).any():
        bad = [int(r) for r in np.flatnonzero(table[:, 5] != table[0, 5])]
        raise ValueError(f"allreduce: parameters differ from rank 0's on rank(s) {bad} "
                         f"(this rank: density={density!r}"
                         + "".join(f", {k}={v!r}" for k, v in params) + ")")


def agree(comm: Communicator, problem: BaseException | None = None, *, value=None,
          what: str = "arguments") -> None:
    """Raise the same error on every rank unless all ranks are fine and agree.

    ``problem``: an error found on this rank alone (e.g. a bad constructor
    argument); if any rank has one, the lowest such rank's error is raised
    everywhere.  ``value``: anything whose repr must be the same on every
    rank (e.g. a list of shapes); otherwise every rank raises a ValueError
    saying ``what`` differs and on which ranks.  Collective: one allgather
    of two ints (plus one broadcast on the error path).
    """
    table = _exchange(comm, [_PROBLEM if problem is not None else 0, _crc(repr(value))])
    _raise_problem(comm, table, problem)
    differ = [int(r) for r in np.flatnonzero(table[:, 1] != table[0, 1])]
    if differ:
        raise ValueError(f"{what} differ across ranks (rank(s) {differ} differ from rank 0; "
                         f"this rank: {value!r:.200})")


def _raise_problem(comm: Communicator, table, problem) -> None:
    """If some rank reported a ``problem``, raise the lowest such rank's on every rank."""
    bad = np.flatnonzero(table[:, 0] & _PROBLEM)
    if not bad.size:
        return
    first = int(bad[0])
    mine = (type(problem).__name__, str(problem)) if comm.rank == first else None
    kind, text = comm.bcast_obj(mine, first) if comm.size > 1 else mine
    exc = {"TypeError": TypeError, "ValueError": ValueError}.get(kind, RuntimeError)
    where = f" on rank {first}" if comm.size > 1 else ""
    others = [int(r) for r in bad[1:]]
    raise exc(f"{text}{where}" + (f" (and a problem on rank(s) {others})" if others else ""))



# -- non-finite values on the device ----------------------------------------------
class DeviceFlags:
    """Non-finite inputs seen on the device since the last report.

    One uint64 bit mask per device; each tensor name gets a bit (the first 63
    names in order of appearance, the same on every rank since names agree;
    later ones share bit 63).  ``note`` launches one kernel that sets the
    tensor's bit if any value is NaN or Inf; nothing is read back until
    ``collect``.
    """

    def __init__(self):
        self.masks: dict = {}
        self.bits: dict = {}

    def note(self, x, tag: str, stream=None) -> None:
        """Enqueue the scan of ``x`` on ``stream`` (default: the current one)."""
        dev = x.device.id
        mask = self.masks.get(dev)
        if mask is None:
            with x.device:
                mask = self.masks[dev] = kernels.array_module(x).zeros(1, dtype=np.uint64)
                x.device.synchronize()  # once: before scans on any stream set bits
        bit = self.bits.get(tag)
        if bit is None:
            bit = self.bits[tag] = min(len(self.bits), 63)
        kernels.flag_nonfinite(x, 1 << bit, mask, stream)

    def collect(self) -> int:
        """The OR of every device's mask (a read-back per device on the current
        stream, which must follow the scans), then zeroed before any later scan."""
        found = 0
        for mask in self.masks.values():
            with mask.device:
                found |= int(mask.get()[0])
                mask.fill(0)
                mask.device.synchronize()  # the next scan may be on another stream
        return found

    def names(self, mask: int) -> list[str]:
        out = [tag.removeprefix("str:") or "(unnamed)" for tag, bit in self.bits.items()
               if mask >> bit & 1 and bit < 63]
        if mask >> 63 & 1:
            out.append("(other tensors)")
        return out


def _device_flags(comm: Communicator) -> DeviceFlags:
    if comm.device_flags is None:
        comm.device_flags = DeviceFlags()
    return comm.device_flags


def report_nonfinite(comm: Communicator) -> None:
    """Raise on every rank if any rank's device inputs held NaN or Inf since
    the last report (flags are read back, one device sync, and cleared).

    Collective: one allgather of one integer.

    Raises:
        ValueError: naming the ranks and tensors.
    """
    flags = comm.device_flags
    mine = flags.collect() if flags is not None else 0
    signed = int(np.array(mine, dtype=np.uint64).view(np.int64))
    table = _exchange(comm, [signed])[:, 0]
    ranks = [int(r) for r in np.flatnonzero(table)]
    if ranks:
        names = flags.names(int(np.bitwise_or.reduce(table).view(np.uint64))) \
            if flags is not None else []
        raise ValueError(f"allreduce: tensor holds NaN or Inf on rank(s) {ranks}: "
                         f"{', '.join(repr(n) for n in names) or '(unknown)'} (found on the "
                         f"device since the last check; every rank received a result computed "
                         f"from it)")
