"""Semantic verifier of a :class:`~topotrain.collectives.schedule.Schedule`: does it compute its collective?

Symbolic execution: ``state[rank][chunk]`` is the set of ranks whose contribution that rank holds for that
chunk, kept as a Python int used as a bitset (bit ``r`` = rank ``r``). Initially, for a chunk with
``chunk_src == -1`` every rank ``r`` holds ``{r}``; otherwise only rank ``chunk_src`` holds
``{chunk_src}``. All transfers of a phase read the state from before the phase (the barrier semantics of
:class:`~topotrain.collectives.schedule.Phase`). A reduce adds the sender's set to the receiver's (an
overlap would count a contribution twice); a copy overwrites the receiver's set. At the end every target
rank (all ranks if ``chunk_dst == -1``, else ``chunk_dst``) must hold the full set (all ranks if
``chunk_src == -1``, else ``{chunk_src}``).

This is the usual correctness argument for collective schedules (e.g. the chunk-ownership invariants of
Thakur, Rabenseifner & Gropp, IJHPCA 2005), checked mechanically.
"""

from __future__ import annotations

import numpy as np

from topotrain.collectives.schedule import CollectiveOp, Schedule


class ScheduleError(ValueError):
    """A schedule that does not compute its collective (or is malformed)."""


def _ranks_of(bits: int, limit: int = 6) -> str:
    out: list[str] = []
    r = 0
    while bits and len(out) < limit:
        if bits & 1:
            out.append(str(r))
        bits >>= 1
        r += 1
    more = "…" if bits else ""
    return "{" + ", ".join(out) + more + "}"


def _check_arrays(s: Schedule) -> None:
    p, nc = s.num_ranks, s.num_chunks
    if p < 1:
        raise ScheduleError(f"{s.algorithm}/{s.op}: schedule has no ranks")
    if s.chunk_src.shape != (nc,) or s.chunk_dst.shape != (nc,):
        raise ScheduleError(f"{s.algorithm}/{s.op}: chunk_src/chunk_dst must have one entry per chunk ({nc})")
    if nc and (np.any(s.chunk_bytes < 0)):
        raise ScheduleError(f"{s.algorithm}/{s.op}: negative chunk size")
    # all-to-all: the chunk space is every rank's send buffer (p·size); otherwise the one buffer
    want = int(s.size_bytes) * (p if s.op is CollectiveOp.ALLTOALL else 1)
    total = s.chunk_bytes.sum()
    # fractional chunks (``split_bytes`` of a size its parts do not divide) sum to the buffer up to rounding
    if (total != want) if s.chunk_bytes.dtype.kind in "iu" else abs(float(total) - want) > 1e-9 * max(want, 1):
        raise ScheduleError(f"{s.algorithm}/{s.op}: chunks sum to {total} bytes, not {want}")
    for name, arr in (("chunk_src", s.chunk_src), ("chunk_dst", s.chunk_dst)):
        if nc and (arr.min() < -1 or arr.max() >= p):
            raise ScheduleError(f"{s.algorithm}/{s.op}: {name} out of range [-1, {p})")
    for k, ph in enumerate(s.phases):
        n = len(ph)
        for name in ("dst", "chunk_lo", "chunk_hi", "reduce"):
            if getattr(ph, name).shape != (n,):
                raise ScheduleError(f"{s.algorithm}/{s.op}: phase {k}: array {name} has the wrong length")
        if n == 0:
            continue
        if ph.src.min() < 0 or ph.src.max() >= p or ph.dst.min() < 0 or ph.dst.max() >= p:
            raise ScheduleError(f"{s.algorithm}/{s.op}: phase {k}: rank index out of range [0, {p})")
        bad = np.flatnonzero(ph.src == ph.dst)
        if bad.size:
            i = int(bad[0])
            raise ScheduleError(f"{s.algorithm}/{s.op}: phase {k}: transfer {i} sends rank {int(ph.src[i])} "
                                "to itself")
        bad = np.flatnonzero((ph.chunk_lo < 0) | (ph.chunk_hi > nc) | (ph.chunk_lo >= ph.chunk_hi))
        if bad.size:
            i = int(bad[0])
            raise ScheduleError(f"{s.algorithm}/{s.op}: phase {k}: transfer {i} has chunk range "
                                f"[{int(ph.chunk_lo[i])}, {int(ph.chunk_hi[i])}) (need 0 <= lo < hi <= {nc})")


def check_schedule(s: Schedule) -> None:
    """Raise :class:`ScheduleError` unless ``s`` computes its collective exactly (no double counting)."""
    _check_arrays(s)
    p, nc = s.num_ranks, s.num_chunks
    full_all = (1 << p) - 1
    csrc = s.chunk_src.tolist()
    cdst = s.chunk_dst.tolist()
    # state[r][c]
    state: list[list[int]] = []
    for r in range(p):
        bit = 1 << r
        state.append([bit if cs == -1 else (bit if cs == r else 0) for cs in csrc])
    for k, ph in enumerate(s.phases):
        # gather every (transfer, chunk) read from the pre-phase state
        incoming: dict[tuple[int, int], list[tuple[int, bool, int]]] = {}
        for i, (a, b, lo, hi, red) in enumerate(zip(ph.src.tolist(), ph.dst.tolist(), ph.chunk_lo.tolist(),
                                                    ph.chunk_hi.tolist(), ph.reduce.tolist(), strict=True)):
            row = state[a]
            for c in range(lo, hi):
                val = row[c]
                if not val:
                    raise ScheduleError(f"{s.algorithm}/{s.op}: phase {k}: transfer {i} ({a}->{b}) sends "
                                        f"chunk {c}, which rank {a} does not hold yet")
                incoming.setdefault((b, c), []).append((val, red, i))
        for (b, c), ins in incoming.items():
            if len(ins) > 1 and not all(red for _, red, _ in ins):
                who = ", ".join(str(i) for _, _, i in ins[:4])
                raise ScheduleError(f"{s.algorithm}/{s.op}: phase {k}: rank {b} chunk {c} is written by "
                                    f"several transfers ({who}) in one phase, one of them a copy")
            if not ins[0][1]:
                state[b][c] = ins[0][0]
                continue
            acc = state[b][c]
            for val, _, i in ins:
                if acc & val:
                    raise ScheduleError(f"{s.algorithm}/{s.op}: phase {k}: transfer {i} reduces chunk {c} "
                                        f"into rank {b} twice from ranks {_ranks_of(acc & val)} "
                                        "(double counting)")
                acc |= val
            state[b][c] = acc
    for c in range(nc):
        want = full_all if csrc[c] == -1 else 1 << csrc[c]
        targets = range(p) if cdst[c] == -1 else (cdst[c],)
        for r in targets:
            got = state[r][c]
            if got != want:
                missing = want & ~got
                extra = got & ~want
                parts = ([f"misses ranks {_ranks_of(missing)}"] if missing else []) + \
                        ([f"has foreign ranks {_ranks_of(extra)}"] if extra else [])
                raise ScheduleError(f"{s.algorithm}/{s.op} on {p} ranks: at the end rank {r} chunk {c} "
                                    f"{' and '.join(parts)}")
