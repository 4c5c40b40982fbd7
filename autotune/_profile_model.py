"""The alpha-beta model of the primitives: one table of shapes, and the links.

Each primitive's time is alpha * A(P) + beta * m * B(P) for m bytes (the
model's m: per rank, per peer or in total, as MESSAGE_MEANING says), with the
(alpha, beta) of the size regime covering m (:class:`Link`).  The profile
(:mod:`autotune.profile`), its fits (:mod:`autotune.profiler`) and the cost
model (:mod:`autotune.costmodel`) all use this one table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collectives import ceil_log2

# -- the alpha-beta model shapes ----------------------------------------------------
@dataclass(frozen=True)
class _Shape:
    """One primitive's model: ``time = alpha*A(P) + beta*m*B(P)``.

    ``time`` is that sum, written with the grouping the cost model has always
    used (so its predictions stay bitwise what they were); it equals
    ``alpha*A + beta*m*B`` up to rounding (tested).
    """

    model: str
    A: Any
    B: Any
    time: Any


# THE table of model shapes: the profiler fits in it, Profile.predict and the cost
# model (costmodel.Machine.t_*) predict with it.
_SHAPES = {
    "p2p": _Shape("a + b*m", lambda P: 1.0, lambda P: 1.0,
                  lambda a, b, m, P: a + b * m),
    "allgather": _Shape("a*ceil(log2 P) + b*m*(P-1)", lambda P: ceil_log2(P), lambda P: P - 1.0,
                        lambda a, b, m, P: a * ceil_log2(P) + b * m * (P - 1)),
    "allgatherv": _Shape("a*ceil(log2 P) + b*m*(P-1)", lambda P: ceil_log2(P), lambda P: P - 1.0,
                         lambda a, b, m, P: a * ceil_log2(P) + b * m * (P - 1)),
    "alltoallv": _Shape("a*(P-1) + b*m*(P-1)", lambda P: P - 1.0, lambda P: P - 1.0,
                        lambda a, b, m, P: a * (P - 1) + b * m * (P - 1)),
    "allreduce": _Shape("2a*ceil(log2 P) + 2b*m*(P-1)/P", lambda P: 2.0 * ceil_log2(P),
                        lambda P: 2.0 * (P - 1) / P,
                        lambda a, b, m, P: 2 * a * ceil_log2(P) + 2 * b * m * (P - 1) / P),
    "bcast": _Shape("a*ceil(log2 P) + b*m*ceil(log2 P)", lambda P: ceil_log2(P),
                    lambda P: ceil_log2(P), lambda a, b, m, P: ceil_log2(P) * (a + b * m)),
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
    shape = _shape(primitive)
    return float(shape.A(P)), float(shape.B(P))


def _shape(primitive: str) -> _Shape:
    try:
        return _SHAPES[primitive]
    except KeyError:
        raise ValueError(f"unknown primitive {primitive!r}; known: {list(_SHAPES)}") from None


def model_time(primitive: str, alpha: float, beta: float, m: float, P: int) -> float:
    """The model's time (s) of ``primitive`` with m bytes at P ranks, given (alpha, beta)."""
    return _shape(primitive).time(alpha, beta, m, P)


def model_string(primitive: str) -> str:
    return _SHAPES[primitive].model


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
    return wire_bytes(primitive, P) / B


def wire_bytes(primitive: str, P: int) -> float:
    """Bytes all P ranks together put on the wire per byte of the model's m."""
    return float({
        "p2p": 2 * (P // 2),
        "allgather": P * (P - 1),
        "allgatherv": P * (P - 1),
        "alltoallv": P * (P - 1),
        "allreduce": 2 * (P - 1),
        "bcast": P - 1,
    }[primitive])


def _covering(segments, size: float, line: tuple) -> tuple[float, float]:
    """The two coefficients of the segment ``(from, x, y)`` covering ``size`` (the first
    also covers everything below it); ``line`` without segments."""
    out = line
    for i, (start, x, y) in enumerate(segments):
        if i == 0 or size >= start:
            out = (x, y)
        else:
            break
    return out


@dataclass(frozen=True)
class Link:
    """A primitive's alpha (s) and beta (s/byte) and its size regimes.

    ``segments``: tuples ``(from_bytes, alpha, beta)``, ascending: contiguous
    size ranges (protocol regimes: eager/rendezvous, algorithm switches,
    cache -> DRAM, a token bucket's burst), each with its own alpha and beta
    in the primitive's model shape.  Segment j covers ``from_bytes[j] <= m <
    from_bytes[j+1]``; the first also covers everything below, the last
    everything above.  Without segments (profiles written before them,
    published profiles) the single line ``alpha``/``beta`` covers every size.
    """

    alpha: float
    beta: float
    segments: tuple = ()

    def at(self, m: float) -> tuple[float, float]:
        """(alpha, beta) for a message of m bytes (the model's m): THE segment lookup."""
        return _covering(self.segments, m, (self.alpha, self.beta))

    @classmethod
    def of(cls, rec: dict) -> "Link":
        """From a profile's primitive record (``alpha_s``, ``beta_s_per_byte``, ``segments``)."""
        segs = tuple((int(sg["from_bytes"]), float(sg["alpha_s"]), float(sg["beta_s_per_byte"]))
                     for sg in rec.get("segments") or ())
        return cls(float(rec["alpha_s"]), float(rec["beta_s_per_byte"]), segs)


@dataclass(frozen=True)
class PrimitiveFit(Link):
    """``Profile.primitive(name)``: the fitted link plus what else the record says."""

    name: str = ""
    shared_medium: bool = False
    record: dict | None = None  # the JSON record (errors, samples, sources ...)

    @property
    def samples(self) -> list:
        return self.record.get("samples") or []


@dataclass(frozen=True)
class Linear:
    """A local compute kernel's fit, ``t = c0 + c1 * elements``, and its size regimes.

    ``segments``: tuples ``(from_elems, c0, c1)``, ascending, as :class:`Link`'s:
    a kernel's rate changes as its vectors leave each cache level (a CPU's
    threshold scan 0.3 ns / element in L2, 0.75 at 2^22, more from DRAM).
    Without segments the single line covers every size.
    """

    c0: float
    c1: float
    segments: tuple = ()

    def at(self, elems: float) -> tuple[float, float]:
        """(c0, c1) of the regime covering ``elems``."""
        return _covering(self.segments, elems, (self.c0, self.c1))

    def rate(self, elems: float) -> float:
        """Seconds per element in the regime covering ``elems``."""
        return self.at(elems)[1]

    def __call__(self, elems: float) -> float:
        c0, c1 = self.at(elems)
        return c0 + c1 * max(elems, 0.0)

    def scaled(self, f: float) -> "Linear":
        return Linear(self.c0 * f, self.c1 * f,
                      tuple((m, s0 * f, s1 * f) for m, s0, s1 in self.segments))


def segment_at(rec: dict, m: float) -> tuple[float, float]:
    """(alpha, beta) of a primitive's record for a message of m bytes (see :class:`Link`)."""
    return Link.of(rec).at(m)


# JSON type names for messages (bool before int: a bool is an int in Python)
