"""The search loop: choose points (grid or optuna), screen them, confirm the best, store every result.

- ``grid`` enumerates the whole space in a fixed order (:func:`topotrain.search.space.grid`).
- ``tpe`` / ``nsga2`` ask optuna (Bergstra et al., NeurIPS 2011; Deb et al., IEEE TEC 2002) for batches of
  ``search.batch`` points, evaluate them in parallel and tell the results in asking order. The sampler is
  rebuilt before each batch with the seed ``seed + trials so far``, so the sequence of points depends only
  on the seed and the stored history: the same on one worker or many, and after a resume. optuna's study
  lives in ``optuna.sqlite`` beside the results; a round is recorded in it once asked whole, and on resume
  its trials asked but not told are finished from the stored result (or evaluated, if it never arrived),
  while the trials of a round killed while it was being asked are abandoned and the round asked again.
- Every point is screened with ``search.screen_network`` (``analytical`` by default); the best
  ``search.confirm_top`` (a fraction, or a count) of the feasible points by the first objective are timed
  again with ``search.confirm_network`` (``flow``).

Results go to ``results.sqlite`` (:class:`~topotrain.search.store.ResultStore`) as they arrive.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topotrain.search.cost import price_catalog
from topotrain.search.evaluate import Task
from topotrain.search.executors import Executor
from topotrain.search.space import MINIMIZE, Scalar, Space, grid, point_key, realize
from topotrain.search.store import ResultStore
from topotrain.util.errors import ConfigError

SCREEN, CONFIRM = "screen", "confirm"
#: progress callback: (stage, done, total, best value of the first objective so far or None)
Progress = Callable[[str, int, int, float | None], None]


@dataclass(frozen=True)
class Outcome:
    """What a search did (counts of this run; every result is in the store)."""

    out_dir: Path
    points: int
    evaluated: int
    reused: int
    confirmed: int


def fingerprint(space: Space) -> str:
    """Identity of a space and its settings (a resume must continue the same search); the number of trials
    is left out, so that a resume may ask for more."""
    from dataclasses import replace

    body = {"doc": space.doc, "settings": repr(replace(space.settings, trials=0)), "costs": space.costs}
    return hashlib.sha1(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _value(rec: dict[str, Any], objective: str) -> float:
    v = rec["metrics"].get(objective)
    if rec["status"] != "ok" or v is None:
        return math.inf
    return float(v) if MINIMIZE[objective] else -float(v)


class _Runner:
    def __init__(self, space: Space, out_dir: Path, executor: Executor, resume: bool, base_dir: Path,
                 progress: Progress | None) -> None:
        self.space, self.s = space, space.settings
        self.out_dir = out_dir
        self.executor = executor
        self.store = ResultStore(out_dir / "results.sqlite", fingerprint(space), resume)
        self.prices = price_catalog(space.costs)
        self.base_dir = base_dir
        self.progress = progress
        self.evaluated = 0
        self.reused = 0
        self.best: float | None = None
        self.done_count = 0
        self.total = 0

    def task(self, key: str, seq: int, point: dict[str, Any], choices: dict[str, Any], stage: str) -> Task:
        c = self.s.constraints
        net = self.s.screen_network if stage == SCREEN else self.s.confirm_network
        return Task(key, seq, stage, point, net, self.prices, c.gpus, c.budget_usd, c.max_power_kw,
                    self.s.train_tokens, self.s.train_samples, str(self.base_dir), choices)

    def _tick(self, stage: str, rec: dict[str, Any] | None) -> None:
        self.done_count += 1
        if rec is not None:
            v = _value(rec, self.s.objectives[0])
            if math.isfinite(v):
                v = v if MINIMIZE[self.s.objectives[0]] else -v
                better = (self.best is None or (v < self.best if MINIMIZE[self.s.objectives[0]] else v > self.best))
                if better:
                    self.best = v
        if self.progress is not None:
            self.progress(stage, self.done_count, self.total, self.best)

    def evaluate(self, tasks: list[Task], stage: str) -> dict[str, dict[str, Any]]:
        """Evaluate the tasks not stored yet; every record (stored or new) by key."""
        out: dict[str, dict[str, Any]] = {}
        todo: list[Task] = []
        done = self.store.done(stage)
        seen: set[str] = set()
        for t in tasks:
            if t.key in seen:
                continue
            seen.add(t.key)
            if t.key in done:
                rec = self.store.get(t.key, stage)
                assert rec is not None
                out[t.key] = rec
                self.reused += 1
                self._tick(stage, rec)
            else:
                todo.append(t)
        for rec in self.executor.run(todo):
            self.store.add(rec)
            self.evaluated += 1
            out[rec["key"]] = rec
            self._tick(stage, rec)
        return out

    # ---- point choosers -------------------------------------------------------------------------------------
    def run_grid(self) -> list[dict[str, Any]]:
        tasks: list[Task] = []
        for seq, (choices, point) in enumerate(grid(self.space.doc, self.s.max_grid + 1)):
            if seq >= self.s.max_grid:
                raise ConfigError("search.optimizer", f"the space has more than {self.s.max_grid} points",
                                  "use optimizer: tpe (or nsga2) with trials: N, or raise search.max_grid")
            tasks.append(self.task(point_key(point), seq, point, choices, SCREEN))
        self.total = len({t.key for t in tasks})
        recs = self.evaluate(tasks, SCREEN)
        return [recs[k] for k in dict.fromkeys(t.key for t in tasks)]

    def run_optuna(self) -> list[dict[str, Any]]:
        import optuna
        from optuna.trial import TrialState

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = f"sqlite:///{(self.out_dir / 'optuna.sqlite').resolve()}"
        objs = self.s.objectives if self.s.optimizer == "nsga2" else self.s.objectives[:1]
        directions: list[Any] = ["minimize" if MINIMIZE[o] else "maximize" for o in objs]

        def sampler(n_done: int) -> Any:
            seed = self.s.seed + n_done
            if self.s.optimizer == "nsga2":
                return optuna.samplers.NSGAIISampler(population_size=max(2, self.s.batch), seed=seed)
            with warnings.catch_warnings():  # multivariate/group are flagged experimental; they suit conditional spaces
                warnings.simplefilter("ignore")
                return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, self.s.trials),
                                                  multivariate=True, group=True)

        path = self.out_dir / "optuna.sqlite"
        if path.exists():
            _check_optuna_store(path)
        try:
            study = optuna.create_study(study_name="search", storage=storage, directions=directions,
                                        load_if_exists=True, sampler=sampler(0))
        except Exception as e:  # optuna/SQLAlchemy's errors for a damaged or foreign file: one line
            raise ConfigError("--resume", f"{path} cannot be opened as the search's optuna study "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                              "choose another --out, or remove optuna.sqlite and results.sqlite") from None
        self.total = self.s.trials
        records: list[dict[str, Any]] = []

        def finish(items: list[tuple[int, int, dict[str, int], dict[str, Any]]]) -> None:
            tasks = [self.task(point_key(p), seq, p, ch, SCREEN) for _num, seq, ch, p in items]
            recs = self.evaluate(tasks, SCREEN)
            for (num, _seq, _ch, _p), t in zip(items, tasks, strict=True):
                rec = recs[t.key]
                records.append(rec)
                vals = [_value(rec, o) for o in objs]
                if all(math.isfinite(v) for v in vals):
                    study.tell(num, [v if MINIMIZE[o] else -v for v, o in zip(vals, objs, strict=True)])
                else:
                    study.tell(num, state=TrialState.FAIL)

        # A round is asked whole, then recorded (one study attribute: its trial numbers), then evaluated and
        # told. Trials of a round that was not recorded (killed while asking) are abandoned (told FAIL, which
        # no sampler reads) and the round is asked again with the same seed and the same history, so it asks
        # the same points: a resume continues the uninterrupted sequence. ``seq`` counts recorded trials only.
        rounds = _rounds(study)
        kept = {num for nums in rounds for num in nums}
        by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
        for t in by_number.values():
            if t.number not in kept and not t.state.is_finished():
                study.tell(t.number, state=TrialState.FAIL)
        stale: list[tuple[int, int, dict[str, int], dict[str, Any]]] = []
        seq = 0
        for nums in rounds:
            for num in nums:
                t = by_number[num]
                if t.state == TrialState.RUNNING:
                    stale.append((num, seq, self._choices(t.params), self._replay(t.params)))
                else:
                    rec = self.store.get(point_key(self._replay(t.params)), SCREEN)
                    if rec is not None:
                        records.append(rec)
                        self.reused += 1
                        self._tick(SCREEN, rec)
                seq += 1
        if stale:
            finish(stale)
        n = seq
        while n < self.s.trials:
            study.sampler = sampler(n)
            batch: list[tuple[int, int, dict[str, int], dict[str, Any]]] = []
            for j in range(min(self.s.batch, self.s.trials - n)):
                trial = study.ask()
                pick = _TrialPick(trial)
                point = realize(self.space.doc, pick)
                batch.append((trial.number, n + j, pick.chosen, point))
            study.set_user_attr(f"{_ROUND_ATTR}{n}", [b[0] for b in batch])
            finish(batch)
            n += len(batch)
        records.sort(key=lambda r: r["seq"])
        return list({r["key"]: r for r in records}.values())

    def _replay(self, params: dict[str, Any]) -> dict[str, Any]:
        point = realize(self.space.doc, _Replay(params))
        assert isinstance(point, dict)
        return point

    def _choices(self, params: dict[str, Any]) -> dict[str, int]:
        r = _Replay(params)
        realize(self.space.doc, r)
        return r.chosen

    def run_alternate(self) -> list[dict[str, Any]]:
        """Co-optimization in the spirit of TopoOpt (Wang et al., NSDI 2023), which alternates between the
        network's topology and the parallelization strategy: hold the plan (every dimension outside
        ``cluster``) and search every cluster choice exhaustively, then hold the best cluster and search the
        plan, for ``search.rounds`` rounds or until neither move improves the first objective."""
        obj = self.s.objectives[0]
        hold: dict[str, int] = {}
        seq = 0
        seen: dict[str, dict[str, Any]] = {}
        best_v = math.inf
        groups: list[Callable[[str], bool]] = [lambda n: n.startswith("cluster"),
                                               lambda n: not n.startswith("cluster")]
        self.total = 0
        for _round in range(self.s.rounds):
            improved = False
            for vary in groups:
                cands = list(grid(self.space.doc, self.s.max_grid, hold=hold, vary=vary))
                tasks = []
                for choices, point in cands:
                    k = point_key(point)
                    tasks.append(self.task(k, seen[k]["seq"] if k in seen else seq, point, choices, SCREEN))
                    if k not in seen:
                        seq += 1
                self.total += len({t.key for t in tasks} - set(seen))
                recs = self.evaluate([t for t in tasks if t.key not in seen], SCREEN)
                seen.update(recs)
                scored = sorted(((_value(seen[t.key], obj), seen[t.key]["seq"], t) for t in tasks),
                                key=lambda x: (x[0], x[1]))
                if scored and math.isfinite(scored[0][0]):
                    v, _s, t = scored[0]
                    if v < best_v - 1e-15:
                        best_v, improved = v, True
                    hold = dict(t.choices)
            if not improved:
                break
        return sorted(seen.values(), key=lambda r: r["seq"])

    # ---- confirmation -----------------------------------------------------------------------------------------
    def confirm(self, screened: list[dict[str, Any]]) -> int:
        if self.s.confirm_network is None or self.s.confirm_top == 0:
            return 0
        ok = [r for r in screened if r["status"] == "ok"]
        ok.sort(key=lambda r: (_value(r, self.s.objectives[0]), r["seq"]))
        top = self.s.confirm_top
        n = int(top) if top >= 1 else max(1, math.ceil(top * len(ok)))
        chosen = ok[:n]
        self.done_count, self.total, self.best = 0, len(chosen), None
        tasks = [self.task(r["key"], r["seq"], r["point"], r["choices"], CONFIRM) for r in chosen]
        self.evaluate(tasks, CONFIRM)
        return len(chosen)


#: Study user attribute ``topotrain_round_N``: the trial numbers of the round that starts at recorded trial N.
_ROUND_ATTR = "topotrain_round_"


def _rounds(study: Any) -> list[list[int]]:
    """The recorded rounds of a study, in order (each a list of trial numbers)."""
    attrs = study.user_attrs
    starts = sorted(int(k[len(_ROUND_ATTR):]) for k in attrs if k.startswith(_ROUND_ATTR))
    return [list(attrs[f"{_ROUND_ATTR}{s}"]) for s in starts]


def _ordinal(labels: list[Scalar]) -> bool:
    """Whether a dimension's values are numbers (then optuna sees their index as an ordered integer)."""
    return all(isinstance(x, int | float) and not isinstance(x, bool) for x in labels)


class _TrialPick:
    """Picks through an optuna trial: numeric dimensions as an ordinal index, the rest as categories."""

    def __init__(self, trial: Any) -> None:
        self.trial = trial
        self.chosen: dict[str, int] = {}

    def pick(self, name: str, labels: list[Scalar]) -> int:
        if len(labels) == 1:
            i = 0
        elif _ordinal(labels):
            i = int(self.trial.suggest_int(name, 0, len(labels) - 1))
        else:
            i = labels.index(self.trial.suggest_categorical(name, labels))
        self.chosen[name] = i
        return i


class _Replay:
    """Picks what an optuna trial's stored params say (as :class:`_TrialPick` wrote them)."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.chosen: dict[str, int] = {}

    def pick(self, name: str, labels: list[Scalar]) -> int:
        if len(labels) == 1 or name not in self.params:
            i = 0
        elif _ordinal(labels):
            i = int(self.params[name])
        else:
            i = labels.index(self.params[name])
        self.chosen[name] = i
        return i


def _check_optuna_store(path: Path) -> None:
    """An existing ``optuna.sqlite`` must be an optuna database (read only: a foreign file is not changed)."""
    try:
        db = sqlite3.connect(path, timeout=30)
        try:
            tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            db.close()
    except sqlite3.Error as e:
        raise ConfigError("--resume", f"{path} is not an optuna study ({e})",
                          "choose another --out, or remove optuna.sqlite and results.sqlite") from None
    if not {"studies", "trials"} <= tables:
        raise ConfigError("--resume", f"{path} is not an optuna study",
                          "choose another --out, or remove optuna.sqlite and results.sqlite")


def parallel_points(space: Space, cap: int) -> int:
    """The most points of ``space`` evaluated at once, counted up to ``cap`` (workers beyond it would idle):
    a round of ``batch`` trials for tpe/nsga2, else the points of the grid."""
    s = space.settings
    if s.optimizer in ("tpe", "nsga2"):
        return max(1, min(cap, s.batch, s.trials))
    return max(1, sum(1 for _ in grid(space.doc, max(1, cap))))


def run_search(space: Space, out_dir: str | Path, executor: Executor, *, resume: bool = False,
               base_dir: str | Path = ".", progress: Progress | None = None) -> Outcome:
    """Run (or resume) the search of ``space``; every result lands in ``out_dir/results.sqlite``."""
    out = Path(out_dir)
    study_file = out / "optuna.sqlite"
    study_existed = study_file.exists()
    r = _Runner(space, out, executor, resume, Path(base_dir), progress)
    screened: list[dict[str, Any]] = []
    try:
        opt = space.settings.optimizer
        screened = r.run_grid() if opt == "grid" else r.run_alternate() if opt == "alternate" else r.run_optuna()
        confirmed = r.confirm(screened)
        _refuse_if_all_invalid(screened, r.store.created)
    except BaseException:
        if r.store.created and (r.evaluated == 0 or _all_invalid(screened)):  # refused: write nothing
            r.store.remove()
            if not study_existed:
                for suffix in ("", "-wal", "-shm", "-journal"):
                    Path(f"{study_file}{suffix}").unlink(missing_ok=True)
        raise
    finally:
        r.store.close()
    return Outcome(out, len(screened), r.evaluated, r.reused, confirmed)


def _all_invalid(screened: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(field, reason) when every screened point is invalid for one and the same reason, else None."""
    causes = {(rec.get("field", ""), rec.get("reason", "")) for rec in screened if rec.get("status") == "invalid"}
    if screened and len(causes) == 1 and all(rec.get("status") == "invalid" for rec in screened):
        return next(iter(causes))
    return None


def _refuse_if_all_invalid(screened: list[dict[str, Any]], new_store: bool) -> None:
    """A new search whose every point is invalid for one reason is bad input, not a study: a field that every
    point shares is wrong (e.g. ``cluster.servers: .inf``). It is refused with that field (and the caller
    removes the store it created); a resumed search keeps its store and reports the points as usual."""
    cause = _all_invalid(screened)
    if cause is not None and new_store:
        field, reason = cause
        raise ConfigError(field or "space", f"every point of the space is invalid: {reason}",
                          "fix the field (it is the same in every point)")


def load_records(out_dir: str | Path) -> list[dict[str, Any]]:
    """Every stored record of a search folder, in search order."""
    db = Path(out_dir) / "results.sqlite"
    if not db.exists():
        raise ConfigError("--out", f"{db} does not exist", "run `topotrain search SPACE.yaml --out DIR` first")
    st = ResultStore.existing(db)
    try:
        return st.records()
    finally:
        st.close()
