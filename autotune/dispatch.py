"""``allreduce(tensor)``: one call, every registered algorithm, one answer on every rank.

The forced path (``algorithm="dense"``, ``"oktopk"``, ...) needs no profile.
``algorithm="auto"``:
  * with a profile (``init(profile=...)`` or ``AUTOTUNE_PROFILE``), rank 0
    asks the selector, broadcasts the decision, and every rank caches it per
    (name, shape, dtype, P, device);
  * without one, the documented default: ``dense`` (exact Rabenseifner).
A tensor without a name is never given a lossy algorithm: error feedback
needs a stable name to keep its residual under.
"""
from __future__ import annotations

import logging
import os
import time
import zlib
from dataclasses import dataclass

import numpy as np

import collectives
from collectives import ALGORITHMS, validate

from ._convert import as_array

log = logging.getLogger("autotune")

DEFAULT_ALGORITHM = "dense"
DEFAULT_DENSITY = 0.01


@dataclass
class Choice:
    """A cached decision, with what was predicted and what was measured."""

    algorithm: str
    density: float | None
    predicted_s: float | None = None
    measured_s: float | None = None
    calls: int = 0
    explanation: str = ""


_STATE: dict = {"comm": None, "algos": {}, "selector": None, "profile": None, "choices": {},
                "options": {}}


def init(comm=None, *, profile=None, options: dict | None = None):
    """Set up the communicator (MPI world by default) and, optionally, a profile.

    Args:
        comm: a ``collectives.Communicator`` or an ``mpi4py`` communicator.
        profile: path to a profile JSON (or an autotune.profile.Profile) that
            ``algorithm="auto"`` decides from; default ``$AUTOTUNE_PROFILE``.
            Only rank 0's profile matters: it decides and broadcasts.
        options: constructor keywords per algorithm, e.g.
            ``{"oktopk": {"residuals": "owner", "budget": 2.0}}``; they must
            agree across ranks (checked: every rank raises otherwise).  An
            algorithm whose options change starts afresh (its error-feedback
            residuals are dropped), so set them before the first call.
    Returns:
        the Communicator in use.
    """
    if comm is None and _STATE["comm"] is not None and profile is None and options is None:
        return _STATE["comm"]
    if comm is None:
        comm = _STATE["comm"] or collectives.MPICommunicator()
    elif not isinstance(comm, collectives.Communicator):
        comm = collectives.MPICommunicator(comm)
    if comm is not _STATE["comm"]:
        _STATE.update(comm=comm, algos={}, choices={})
    if options is not None:
        _set_options(comm, options)
    profile = profile if profile is not None else os.environ.get("AUTOTUNE_PROFILE")
    if profile is not None and comm.rank == 0:
        from .profile import Profile
        from .selector import Selector

        prof = profile if isinstance(profile, Profile) else Profile.load(profile)
        _STATE["profile"] = prof
        _STATE["selector"] = Selector(prof.data)
        _STATE["choices"] = {}
    return comm


def algorithm_instance(name: str):
    """The per-process instance of a registered algorithm (it holds the
    error-feedback states of all tensors that use it)."""
    comm = init()
    algos = _STATE["algos"]
    if name not in algos:
        if name not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {name!r}; registered: {sorted(ALGORITHMS)}")
        algos[name] = ALGORITHMS[name](comm, **_STATE["options"].get(name, {}))
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
    problem = ""
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        problem = "options must map algorithm names to dicts of keywords"
    else:
        unknown = sorted(set(options) - set(ALGORITHMS))
        if unknown:
            problem = f"options for unknown algorithms {unknown}; registered: {sorted(ALGORITHMS)}"
    canon = repr(sorted((a, sorted(kw.items())) for a, kw in options.items())) if not problem else ""
    mine = [zlib.crc32(canon.encode()), int(bool(problem))]
    table = comm.allgather_ints(mine) if comm.size > 1 else np.asarray([mine], dtype=np.int64)
    if table[:, 1].any():
        raise ValueError(problem or f"algorithm options invalid on ranks "
                                    f"{np.flatnonzero(table[:, 1]).tolist()}")
    if (table[:, 0] != table[0, 0]).any():
        raise ValueError(f"algorithm options differ across ranks (rank {comm.rank}: {options!r})")
    # the constructors' own checks (the same on every rank), then the new instances
    built = {name: ALGORITHMS[name](comm, **kw) for name, kw in options.items()}
    for name in set(options) | set(_STATE["options"]):
        if options.get(name, {}) != _STATE["options"].get(name, {}):
            _STATE["algos"].pop(name, None)
            if name in built:
                _STATE["algos"][name] = built[name]
    _STATE["options"] = {name: dict(kw) for name, kw in options.items()}


def decisions() -> dict:
    """The cached auto decisions: key -> Choice (predicted and measured time)."""
    return dict(_STATE["choices"])


def _decide(comm, key, n: int, name, density) -> Choice:
    sel = _STATE["selector"]
    if comm.rank == 0:
        if sel is None:
            choice = Choice(DEFAULT_ALGORITHM, None, explanation="no profile: default dense")
        else:
            runnable = [a for a in sel.algorithms if a in ALGORITHMS and ALGORITHMS[a].supports(comm)]
            d = sel.choose(n, comm.size, density or DEFAULT_DENSITY, lossy_ok=name is not None,
                           candidates=runnable)
            lossy = ALGORITHMS[d.algorithm].lossy
            choice = Choice(d.algorithm, (density or DEFAULT_DENSITY) if lossy else None,
                            d.predicted_s[d.algorithm], explanation=d.explain())
        msg = (choice.algorithm, choice.density, choice.predicted_s, choice.explanation)
    else:
        msg = None
    algorithm, dens, pred, why = comm.bcast_obj(msg, 0)
    return Choice(algorithm, dens, pred, explanation=why)


def _key(comm, name, arr):
    device = "gpu" if type(arr).__module__.startswith("cupy") else "cpu"
    return (name, tuple(arr.shape), str(arr.dtype), comm.size, device)


def resolve(tensor, *, name: str | None = None, density: float | None = None) -> Choice:
    """What ``allreduce(tensor, name=name, algorithm="auto")`` runs, deciding now
    (at ``density``) if this tensor has no cached decision yet.

    Collective: every rank calls it, as for ``allreduce``.  The decision is
    cached per (name, shape, dtype, P, device), not per density: a caller whose
    density changes from step to step (a density warm-up) resolves once at its
    target density first, and later calls reuse that algorithm at their own
    density.
    """
    arr, adapter = as_array(tensor)
    comm = init()
    validate(comm, arr, density=density, tag=name or "", source=adapter.source,
             contiguous=adapter.contiguous)
    return _resolve_validated(comm, arr, name, density)


def _resolve_validated(comm, arr, name, density) -> Choice:
    key = _key(comm, name, arr)
    choice = _STATE["choices"].get(key)
    if choice is None:
        choice = _STATE["choices"][key] = _decide(comm, key, arr.size, name, density)
        log.info("autotune: %s %s -> %s (predicted %s s)", name, arr.shape, choice.algorithm,
                 choice.predicted_s)
    return choice


def allreduce(tensor, *, name: str | None = None, algorithm: str = "auto",
              density: float | None = None, op: str = "sum", tau_prime: int | None = None,
              tau: int | None = None):
    """Sum ``tensor`` over all ranks (``op="mean"`` divides by P).

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
    arr, adapter = as_array(tensor)
    out = reduce_array(arr, name=name, algorithm=algorithm, density=density, op=op,
                       tau_prime=tau_prime, tau=tau, source=adapter.source,
                       contiguous=adapter.contiguous)
    return adapter.back(out)


def reduce_array(arr, *, name: str | None = None, algorithm: str = "auto",
                 density: float | None = None, op: str = "sum", tau_prime: int | None = None,
                 tau: int | None = None, source: str | None = None,
                 contiguous: bool | None = None):
    """``allreduce`` on a numpy or cupy array (``as_array``'s output), result
    as an array of the same dtype.  ``source`` / ``contiguous``: the caller's
    dtype and contiguity when ``arr`` is a widened copy of a half-precision
    tensor (``autotune._convert.Adapter``), checked across ranks instead of
    ``arr``'s."""
    if op not in ("sum", "mean"):
        raise ValueError(f"op must be 'sum' or 'mean', got {op!r}")
    comm = init()
    extra = {"tau": tau, "tau_prime": tau_prime}
    validated = False
    choice = None
    seen = {"source": source, "contiguous": contiguous}
    if algorithm == "auto":
        # validate first (collectively, name included), so that every rank
        # reaches the decision broadcast below, or every rank raises
        validate(comm, arr, density=density, tag=name or "", params=extra, **seen)
        validated = True
        choice = _resolve_validated(comm, arr, name, density)
        algorithm = choice.algorithm
        # the call's density wins over the one the decision was made at (a lossy
        # choice); an exact choice takes none
        density = None if choice.density is None else (density or choice.density)
    algo = algorithm_instance(algorithm)
    if source is not None and not validated:
        # a widened half-precision input: the caller's dtype and contiguity are
        # checked (as the algorithm would check its own input's)
        validate(comm, arr, density=density if algo.lossy else None,
                 check_finite=algo.check_finite, params=extra if algo.lossy else None, **seen)
        validated = True
    t0 = time.perf_counter()
    out = algo(arr, name=name, density=density, validated=validated,
               **(extra if algo.lossy else {}))
    if choice is not None:
        choice.calls += 1
        dt = time.perf_counter() - t0
        choice.measured_s = dt if choice.measured_s is None else 0.9 * choice.measured_s + 0.1 * dt
    if op == "mean":
        out /= algo.comm.size
    return out.reshape(arr.shape)
