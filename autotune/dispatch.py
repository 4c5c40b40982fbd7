"""``allreduce(tensor)``: one call, every registered algorithm, one answer on every rank.

The forced path (``algorithm="dense"``, ``"oktopk"``, ...) needs no profile.
``algorithm="auto"``:
  * with a profile (``init(profile=...)``), rank 0
    asks the selector, broadcasts the decision, and every rank caches it per
    (name, shape, dtype, P, device);
  * without one, the documented default: ``dense`` (exact Rabenseifner), on
    an NCCL communicator ``nccl`` (ncclAllReduce).
A tensor without a name is never given a lossy algorithm: error feedback
needs a stable name to keep its residual under.
"""
from __future__ import annotations

import functools
import json
import logging
import time
import warnings
import zlib
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

import collectives
from collectives import ALGORITHMS, agree, validate

from ._convert import as_array

log = logging.getLogger("autotune")

DEFAULT_ALGORITHM = "dense"
DEFAULT_DENSITY = 0.01


class Key(NamedTuple):
    """What an auto decision is cached under."""

    name: str | None
    shape: tuple
    dtype: str
    P: int
    device: str


@dataclass
class Choice:
    """A cached decision, with what was predicted and what was measured.

    ``str(choice)`` is one readable line; ``explanation`` (the selector's
    table of candidates) is left out of the repr.
    """

    algorithm: str
    density: float | None
    predicted_s: float | None = None
    measured_s: float | None = None
    calls: int = 0
    explanation: str = field(default="", repr=False)

    def __str__(self) -> str:
        ms = lambda s: "-" if s is None else f"{1e3 * s:.3f} ms"  # noqa: E731
        dens = "" if self.density is None else f" at density {self.density:g}"
        return (f"{self.algorithm}{dens}: predicted {ms(self.predicted_s)}, "
                f"measured {ms(self.measured_s)} over {self.calls} call(s)")


class Context:
    """Everything the library holds in a process, in one place (one instance, ``_CTX``).

    ``comm``: the library's Communicator (its own duplicate of the caller's);
    ``algos``: one instance per algorithm, holding the error-feedback states of
    every tensor that uses it; ``options``: their constructor keywords;
    ``profile`` / ``selector``: what ``algorithm="auto"`` decides from (rank 0);
    ``choices``: the cached decisions.  A new communicator drops the instances
    and the decisions (their states belong to the old one); a new profile drops
    the decisions.
    """

    __slots__ = ("comm", "algos", "options", "profile", "selector", "choices")

    def __init__(self):
        self.comm = None
        self.algos: dict = {}
        self.options: dict = {}
        self.profile = None
        self.selector = None
        self.choices: dict = {}

    def bind(self, comm) -> None:
        if comm is not self.comm:
            self.comm, self.algos, self.choices = comm, {}, {}

    def use_profile(self, profile, selector) -> None:
        self.profile, self.selector, self.choices = profile, selector, {}


_CTX = Context()

def communicator():
    """The library's Communicator, set up on first use (``init()`` with no
    arguments: a duplicate of MPI's world communicator).  Collective the first time."""
    if _CTX.comm is None:
        init()
    return _CTX.comm


def init(comm=None, *, profile=None, options: dict | None = None):
    """Set up the communicator (MPI world by default) and, optionally, a profile.

    Collective: every rank calls it, with the same arguments.  Whatever must
    agree across ranks is checked here, and a problem on any rank raises the
    same error on every rank: the profile (loaded and validated by rank 0,
    which decides; ranks given a profile must give the same one, ranks given
    none use rank 0's) and the options.

    Args:
        comm: a ``collectives.Communicator`` or an ``mpi4py`` communicator
            (default ``MPI.COMM_WORLD``).  An mpi4py communicator is
            duplicated once here: the library never talks on the caller's.
        profile: path to a profile JSON (or an autotune.profile.Profile) that
            ``algorithm="auto"`` decides from (default: none, or the one
            set by an earlier call).
            A profile measured on another machine is used, with a warning
            (rank 0, once).
        options: constructor keywords per algorithm, e.g.
            ``{"oktopk": {"residuals": "owner", "budget": 2.0}}``; they must
            agree across ranks (checked: every rank raises otherwise).  An
            algorithm whose options change starts afresh (its error-feedback
            residuals are dropped), so set them before the first call.
    Returns:
        the Communicator in use.

    Raises:
        ProfileError: the profile is missing, unreadable or invalid (on any rank).
        ValueError: profiles or options differ across ranks.
    """
    if comm is None:
        comm = _CTX.comm or collectives.MPICommunicator()
    elif not isinstance(comm, collectives.Communicator):
        comm = collectives.MPICommunicator(comm)
    _CTX.bind(comm)
    _agree_setup(comm, profile)
    if options is not None:
        _set_options(comm, options)
    return comm


def _profile_digest(data) -> int:
    return zlib.crc32(json.dumps(data, sort_keys=True).encode()) & 0x7FFFFFFF


def _agree_setup(comm, profile) -> None:
    """Load the profile (rank 0) and agree on it in one allgather; every rank
    raises the same error or every rank goes on.  Rank 0 builds its selector
    (the costly part: fits) only once every rank has agreed, and tells every
    rank whether that failed."""
    from .profile import Profile, ProfileError, migrate

    prof = selector = error = None
    digest = 0
    if profile is not None:
        try:
            if comm.rank == 0:
                from .profile import local_fingerprint

                prof = profile if isinstance(profile, Profile) else Profile.load(
                    profile, current=local_fingerprint())
                digest = _profile_digest(prof.data)
            elif isinstance(profile, Profile):
                digest = _profile_digest(profile.data)
            else:
                # the migrated document, as rank 0's (Profile.load migrates)
                digest = _profile_digest(migrate(Profile.read_json(profile)))
        except (ProfileError, ValueError, TypeError, OSError) as e:
            error = e
    mine = [int(profile is not None), digest, int(error is not None)]
    table = comm.allgather_ints(mine) if comm.size > 1 else np.asarray([mine], dtype=np.int64)
    bad = np.flatnonzero(table[:, 2])
    if bad.size:
        first = int(bad[0])
        msg = (str(getattr(error, "path", profile)), getattr(error, "what", str(error))) \
            if comm.rank == first else None
        path, what = comm.bcast_obj(msg, first) if comm.size > 1 else msg
        where = f" (on rank {first})" if comm.size > 1 else ""
        raise ProfileError(path, what + where)
    given = np.flatnonzero(table[:, 0])
    if given.size and table[0, 0] == 0:
        raise ValueError(f"autotune.init: a profile was given on rank(s) {given.tolist()} but not "
                         f"on rank 0, which decides")
    differ = [int(r) for r in given if table[r, 1] != table[0, 1]]
    if differ:
        raise ValueError(f"autotune.init: the profile differs from rank 0's on rank(s) {differ} "
                         f"(this rank: {profile})")
    if table[0, 0]:
        failed = None
        if comm.rank == 0:
            from .selector import Selector

            try:
                selector = Selector(prof)
            except Exception as e:  # noqa: BLE001 -- raised on every rank, below
                failed = (str(prof.path), f"no selector could be built from it: "
                                          f"{type(e).__name__}: {e}")
        failed = comm.bcast_obj(failed, 0) if comm.size > 1 else failed
        if failed:
            raise ProfileError(*failed)
    if prof is not None:
        _CTX.use_profile(prof, selector)
        if prof.foreign and prof.path not in _WARNED:
            _WARNED.add(prof.path)
            warnings.warn(f"autotune: profile {prof.path} was measured on another machine ("
                          + "; ".join(prof.foreign) + "): its decisions may not suit this one",
                          stacklevel=3)


_WARNED: set = set()


def algorithm_instance(name: str):
    """The per-process instance of a registered algorithm (it holds the
    error-feedback states of all tensors that use it)."""
    comm = communicator()
    algos = _CTX.algos
    if name not in algos:
        if name not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {name!r}; registered: {sorted(ALGORITHMS)}")
        algos[name] = ALGORITHMS[name](comm, **_CTX.options.get(name, {}))
    return algos[name]


def parse_value(text: str):
    """A command-line option value: true/false, else int, else float, else the text itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_spec(spec: str):
    """``name`` or ``name@key=value+...`` (e.g. ``oktopk@residuals=owner+tau=16``):
    an algorithm and its constructor keywords (values as in :func:`parse_value`)."""
    name, _, rest = spec.partition("@")
    kw = {}
    for item in filter(None, rest.split("+")):
        key, _, val = item.partition("=")
        kw[key] = parse_value(val)
    return name, kw


def parse_options(items) -> dict:
    """``["oktopk.residuals=owner", "oktopk.tau=16"]`` -> ``{"oktopk": {...}}``
    (the ``options`` of :func:`init`, from ALGO.KEY=VALUE strings)."""
    out: dict = {}
    for item in items:
        key, eq, val = item.partition("=")
        algo, dot, opt = key.partition(".")
        if not (eq and dot and algo and opt):
            raise ValueError(f"{item!r}: expected ALGO.KEY=VALUE")
        out.setdefault(algo, {})[opt] = parse_value(val)
    return out


def _set_options(comm, options: dict) -> None:
    """Check ``options`` (same on every rank, known algorithms, accepted by
    their constructors) and install them; every rank raises the same error."""
    problem, canon = None, None
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        problem = ValueError("options must map algorithm names to dicts of keywords")
    elif set(options) - set(ALGORITHMS):
        problem = ValueError(f"options for unknown algorithms {sorted(set(options) - set(ALGORITHMS))}"
                             f"; registered: {sorted(ALGORITHMS)}")
    else:
        canon = sorted((a, sorted(kw.items())) for a, kw in options.items())
    agree(comm, problem, value=canon, what="algorithm options")
    # the constructors' own checks (the same on every rank), then the new instances
    built = {name: ALGORITHMS[name](comm, **kw) for name, kw in options.items()}
    for name in set(options) | set(_CTX.options):
        if options.get(name, {}) != _CTX.options.get(name, {}):
            _CTX.algos.pop(name, None)
            if name in built:
                _CTX.algos[name] = built[name]
    _CTX.options = {name: dict(kw) for name, kw in options.items()}


def synchronize() -> None:
    """Report, on every rank, what the device checks found since the last call.

    Device (cupy / CUDA torch) inputs are scanned for NaN and Inf by a kernel
    that sets a flag on the device, never read back per call (that would stall
    the stream).  This reads the flags back (one device synchronize), agrees
    on them across ranks and raises on every rank if any rank's input held
    NaN or Inf.  The error-feedback residuals that hold non-finite values are
    zeroed (their tensors' results were already computed from them).  The
    DDP hook and ``SparseSGD`` / ``DistributedOptimizer`` call it at the end
    of every step; callers of ``allreduce`` on device arrays call it where a
    step ends.  Host (numpy) inputs are checked on the spot instead.
    Collective: one allgather of one integer.

    Raises:
        ValueError: naming the ranks and tensors.
    """
    comm = communicator()
    try:
        collectives.report_nonfinite(comm)
    except ValueError:
        for algo in _CTX.algos.values():
            if isinstance(algo, collectives.SparseAllreduce):
                algo.drop_nonfinite_residuals()
        raise


def forget(prefix: str) -> list[str]:
    """Free the per-tensor state (error-feedback residuals, Ok-Topk's
    thresholds) of every tensor whose name starts with ``prefix``, e.g. a
    model's that is rebuilt or discarded; returns the names freed.  Their
    next calls start afresh, as at their first.  Cached ``auto`` decisions
    are kept (they hold no memory worth freeing).

    Collective: every rank calls it with the same prefix (checked; every
    rank raises otherwise), so that all ranks start those tensors afresh at
    the same call.

    Raises:
        TypeError: ``prefix`` is not a string (on some rank).
        ValueError: the prefixes differ across ranks.
    """
    problem = None if isinstance(prefix, str) else TypeError(
        f"forget needs a name prefix (str), got {prefix!r}")
    return _forget(prefix, prefix, problem, "forget's prefixes")


def forget_names(names) -> list[str]:
    """:func:`forget` for exactly these tensor names (``SparseSGD.close``).
    Collective; the names must agree across ranks (checked)."""
    names = set(names)
    return _forget(names, sorted(map(str, names)), None, "the names to forget")


def _forget(which, agreed, problem, what) -> list[str]:
    """Drop ``which`` (a prefix or a set of names) from every sparse algorithm,
    once ``agreed`` (its canonical form) agrees across ranks."""
    agree(communicator(), problem, value=agreed, what=what)
    freed = set()
    for algo in list(_CTX.algos.values()):
        if isinstance(algo, collectives.SparseAllreduce):
            freed.update(algo.forget(which))
    return sorted(freed)


def decision(name, arr) -> Choice | None:
    """The cached auto decision for tensor ``name`` given as ``arr`` (a numpy or
    cupy array, as ``reduce_array`` got it), or None: one lookup."""
    return _CTX.choices.get(_key(communicator(), name, arr))


def decisions() -> dict:
    """The cached auto decisions: :class:`Key` -> :class:`Choice` (``str()`` of a
    Choice is one readable line; ``print_decisions()`` prints them all)."""
    return dict(_CTX.choices)


def print_decisions(file=None) -> None:
    """One line per cached decision: tensor, shape, P, device -> choice."""
    for key, choice in _CTX.choices.items():
        print(f"{key.name or '(unnamed)'} {key.shape} {key.dtype} P={key.P} {key.device}: "
              f"{choice}", file=file)


def choose(n: int, *, name: str | None, density: float | None = None) -> Choice:
    """What ``algorithm="auto"`` picks for a tensor of ``n`` elements named
    ``name`` (None: exact algorithms only) at ``density``, without a tensor:
    rank 0 asks the selector, every rank receives its answer; not cached.
    Collective."""
    return _decide(communicator(), int(n), name, density)


def _decide(comm, n: int, name, density) -> Choice:
    """Rank 0 asks the selector and broadcasts; an error there is raised on every rank."""
    sel = _CTX.selector
    msg = None
    if comm.rank == 0:
        try:
            if sel is None:
                default = _default_algorithm(comm)
                choice = Choice(default, None, explanation=f"no profile: default {default}")
            else:
                runnable = [a for a in sel.algorithms
                            if a in ALGORITHMS and ALGORITHMS[a].supports(comm)]
                d = sel.choose(n, comm.size, density or DEFAULT_DENSITY,
                               lossy_ok=name is not None, candidates=runnable)
                lossy = ALGORITHMS[d.algorithm].lossy
                choice = Choice(d.algorithm, (density or DEFAULT_DENSITY) if lossy else None,
                                d.predicted_s[d.algorithm], explanation=d.explain())
            msg = ("ok", choice.algorithm, choice.density, choice.predicted_s, choice.explanation)
        except Exception as e:  # noqa: BLE001 - raised again on every rank below
            msg = ("error", f"{type(e).__name__}: {e}", None, None, None)
    status, algorithm, dens, pred, why = comm.bcast_obj(msg, 0) if comm.size > 1 else msg
    if status != "ok":
        raise RuntimeError(f"autotune: rank 0 could not decide for {name!r}: {algorithm}")
    return Choice(algorithm, dens, pred, explanation=why)


def _default_algorithm(comm) -> str:
    """``auto`` without a profile: NCCL's own allreduce on an NCCL communicator
    (the library's Rabenseifner over NCCL point-to-point runs at 0.6-0.8x of it,
    docs/BENCHMARKS.md "GPU: collectives over NCCL"), else ``dense``."""
    return "nccl" if ALGORITHMS["nccl"].supports(comm) else DEFAULT_ALGORITHM


def _key(comm, name, arr) -> Key:
    device = "gpu" if type(arr).__module__.startswith("cupy") else "cpu"
    return Key(name, tuple(arr.shape), _dtype_name(arr.dtype), comm.size, device)


@functools.cache
def _dtype_name(dtype) -> str:
    return str(dtype)  # numpy's str(dtype) is slow enough to show on a per-tensor path


def _as_array_or_problem(tensor):
    """``as_array``, with an unusable input turned into a problem that
    validation reports on every rank (instead of raising on this rank alone)."""
    try:
        arr, adapter = as_array(tensor)
        return arr, adapter, None
    except TypeError as e:
        return None, None, e


def resolve(tensor, *, name: str | None = None, density: float | None = None) -> Choice:
    """What ``allreduce(tensor, name=name, algorithm="auto")`` runs, deciding now
    (at ``density``) if this tensor has no cached decision yet.

    Collective: every rank calls it, as for ``allreduce``.  The decision is
    cached per (name, shape, dtype, P, device), not per density: a caller whose
    density changes from step to step (a density warm-up) resolves once at its
    target density first, and later calls reuse that algorithm at their own
    density.
    """
    comm = communicator()
    arr, adapter, problem = _as_array_or_problem(tensor)
    validate(comm, arr, density=density, tag=_tag(name), call="auto/resolve", problem=problem,
             source=adapter and adapter.source, contiguous=adapter and adapter.contiguous)
    return _resolve_validated(comm, arr, name, density)


def _tag(name) -> str:
    return "" if name is None else f"{type(name).__name__}:{name}"


def _resolve_validated(comm, arr, name, density) -> Choice:
    key = _key(comm, name, arr)
    choice = _CTX.choices.get(key)
    if choice is None:
        choice = _CTX.choices[key] = _decide(comm, arr.size, name, density)
        log.info("autotune: %s %s -> %s (predicted %s s)", name, arr.shape, choice.algorithm,
                 choice.predicted_s)
    return choice


def allreduce(tensor, *, name: str | None = None, algorithm: str = "auto",
              density: float | None = None, op: str = "sum", tau_prime: int | None = None,
              tau: int | None = None):
    """Sum ``tensor`` over all ranks (``op="mean"`` divides by P).

    Collective: every rank calls it with the same shape, dtype, name,
    algorithm, op and parameters.  A problem on any rank (bad input, a
    disagreement, an unknown algorithm) raises the same error on every rank.

    Args:
        tensor: numpy array, cupy array or torch tensor (any shape; float32 or
            float64; contiguous).  float16 and bfloat16 are reduced in float32
            (a widened copy; sparse residuals are kept in float32) and the
            result is rounded back to the input's dtype.
        name: the tensor's stable name (e.g. the parameter's); required for
            sparse algorithms, which keep its error-feedback residual.
        algorithm: a name from ``collectives.ALGORITHMS`` or ``"auto"``.
        density: fraction of values a sparse algorithm sends (default 1%).
            With ``"auto"`` the algorithm is decided at the first call's
            density and cached; later calls send at their own density.
        op: ``"sum"`` or ``"mean"``.
        tau_prime, tau: a sparse algorithm's threshold and region-boundary
            refresh intervals for this tensor from this call on (default: the
            algorithm's, 32 and 64), e.g. from ``autotune tune``; exact
            algorithms ignore them.  Like the density, they must agree across
            ranks (checked).

    Returns:
        the reduced tensor, identical on every rank, of the input's type,
        shape and device.

    Example::

        import numpy as np, autotune
        g = np.random.default_rng().standard_normal(1 << 20, dtype=np.float32)
        s = autotune.allreduce(g, name="fc1.weight", algorithm="oktopk", density=0.01)
    """
    comm = communicator()
    arr, adapter, problem = _as_array_or_problem(tensor)
    out = reduce_array(arr, name=name, algorithm=algorithm, density=density, op=op,
                       tau_prime=tau_prime, tau=tau, source=adapter and adapter.source,
                       contiguous=adapter and adapter.contiguous, problem=problem, comm=comm)
    return adapter.back(out)


def _call_problem(comm, algorithm, op) -> Exception | None:
    """What is wrong with ``algorithm`` / ``op`` on this rank (reported collectively)."""
    if op not in ("sum", "mean"):
        return ValueError(f"op must be 'sum' or 'mean', got {op!r}")
    if algorithm == "auto":
        return None
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        return ValueError(f"unknown algorithm {algorithm!r}; registered: "
                          f"{sorted(ALGORITHMS)} or 'auto'")
    if not ALGORITHMS[algorithm].supports(comm):
        cls = ALGORITHMS[algorithm]
        return RuntimeError(f"algorithm {algorithm!r} needs a {' or '.join(cls.backends)} "
                            f"communicator, got {comm.backend!r}")
    return None


def reduce_array(arr, *, name: str | None = None, algorithm: str = "auto",
                 density: float | None = None, op: str = "sum", tau_prime: int | None = None,
                 tau: int | None = None, source: str | None = None,
                 contiguous: bool | None = None, problem: Exception | None = None, comm=None,
                 checked: bool = False):
    """``allreduce`` on a numpy or cupy array (``as_array``'s output), result
    as an array of the same dtype.  ``source`` / ``contiguous``: the caller's
    dtype and contiguity when ``arr`` is a widened copy of a half-precision
    tensor (``autotune._convert.Adapter``), checked across ranks instead of
    ``arr``'s.  ``problem``: an error the caller found on this rank (raised
    on every rank).  ``checked``: ``validate``'s (a device input agreed at an
    earlier call skips the host exchange)."""
    comm = comm or communicator()
    extra = {"tau": tau, "tau_prime": tau_prime}
    problem = problem or _call_problem(comm, algorithm, op)
    lossy = algorithm == "auto" or (problem is None and ALGORITHMS[algorithm].lossy)
    check_finite = problem is not None or algorithm == "auto" or \
        algorithm_instance(algorithm).check_finite
    # one collective check of everything that must agree (the algorithm's name and
    # the op included), so that every rank runs the same thing or every rank raises
    validate(comm, arr, density=density if lossy else None, check_finite=check_finite,
             tag=_tag(name), params=extra if lossy else None, source=source,
             contiguous=contiguous, call=f"{algorithm}/{op}", problem=problem, checked=checked)
    choice = None
    if algorithm == "auto":
        choice = _resolve_validated(comm, arr, name, density)
        algorithm = choice.algorithm
        # the call's density wins over the one the decision was made at (a lossy
        # choice); an exact choice takes none
        density = None if choice.density is None else (density or choice.density)
    algo = algorithm_instance(algorithm)
    t0 = time.perf_counter()
    out = algo(arr, name=name, density=density, validated=True,
               **(extra if algo.lossy else {}))
    if choice is not None:
        choice.calls += 1
        dt = time.perf_counter() - t0
        choice.measured_s = dt if choice.measured_s is None else 0.9 * choice.measured_s + 0.1 * dt
    if op == "mean":
        out /= algo.comm.size
    return out.reshape(arr.shape)
