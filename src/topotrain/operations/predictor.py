"""A "fails within H hours" classifier on GPU telemetry (:mod:`.telemetry`), trained and judged on time.

**Features** (:func:`features`), per sample, from the GPU's current board only (a window never reaches
into the previous board's life) over trailing windows (6 h and 24 h by default): the current temperatures,
power, clock and utilization; per window the mean temperature and its drift above the board's mean so
far, the SM-clock drop below the board's mean so far, the correctable and uncorrectable ECC errors added
(running counts differenced), XID events of any kind and precursor XIDs (:data:`.telemetry.PRECURSOR_XIDS`);
the board's age. Only the past of a sample enters its features.

**Label**: the board fails within ``(t, t + H]``. A sample whose next ``H`` hours are not all observed
(the record ends first, with no failure) has no label and is left out; failure samples themselves are the
events, not prediction points.

**Split by time, no leakage** (:func:`evaluate`): the last ``test_fraction`` of the record's time span is
the test period; training samples are those whose label window ends before it starts (``t + H ≤ split``),
so no training label looks into the test period. The decision threshold is chosen (best F1) on the last
quarter of the training period by a model fitted on the earlier three quarters, then the model is refitted
on the whole training period. Classifier: scikit-learn's ``HistGradientBoostingClassifier`` (gradient-
boosted trees, Ke et al. 2017's histogram method as scikit-learn implements it), fixed iterations (no
early stopping, no random subsampling: deterministic for a seed).

**Measures** on the test period: per sample precision, recall, F1 at the threshold, average precision and
ROC AUC, against two baselines (always "fails": precision = prevalence; a rule: any precursor XID or a
correctable ECC error in the last 24 h); per event, what proactive migration needs: the share of failures
with an alarm in the ``H`` hours before them (*event recall*) and how long before (*lead time*), and the
share of alarms (a run of positive samples of a board) followed by a failure within ``H`` (*alarm
precision*). :meth:`Evaluation.migration` hands those to the long-run simulation (:mod:`.longrun`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score

from topotrain.operations.longrun import Migration
from topotrain.operations.telemetry import HOUR_S, PRECURSOR_XIDS, Telemetry
from topotrain.util.errors import ConfigError

DEFAULT_WINDOWS_S = (6 * HOUR_S, 24 * HOUR_S)


@dataclass(frozen=True)
class Features:
    """The feature matrix of every sample, with the labels (−1: unknown) and the sample's time and board."""

    names: tuple[str, ...]
    X: np.ndarray
    y: np.ndarray
    time_s: np.ndarray
    life: np.ndarray
    #: time of the board's failure (inf: the record ends with the board alive)
    fail_s: np.ndarray
    is_failure: np.ndarray


def _life_cumsum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Running sums that restart with every life (a sample's sum holds its own life's past only, so later
    samples or other boards cannot change it, not even by rounding)."""
    out = np.empty(values.size)
    for a, b in zip(starts, [*starts[1:], values.size], strict=True):
        out[a:b] = np.cumsum(values[a:b])
    return out


def _window_sums(key_t: np.ndarray, width_s: float, values: np.ndarray, starts: np.ndarray,
                 first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum of ``values`` over each sample's trailing window ``(t − width, t]`` of its own life, and the
    sample count (``key_t``: time offset by life so that windows never cross lives; sorted)."""
    c = _life_cumsum(values, starts)
    lo = np.searchsorted(key_t, key_t - width_s, side="right")
    hi = np.arange(key_t.size)
    before = np.where(lo > first, c[np.maximum(lo - 1, 0)], 0.0)
    return c - before, (hi - lo + 1).astype(float)


def features(tel: Telemetry, horizon_s: float, windows_s: tuple[float, ...] = DEFAULT_WINDOWS_S) -> Features:
    """Trailing-window features and "fails within ``horizon_s``" labels of every sample (module docstring)."""
    if not (horizon_s > 0 and math.isfinite(horizon_s)):
        raise ConfigError("--horizon", f"must be a positive duration, got {horizon_s!r} s", "e.g. 24h")
    if not windows_s or any(not (w > 0 and math.isfinite(w)) for w in windows_s):
        raise ConfigError("--windows", f"must be positive durations, got {windows_s!r}", "e.g. 6h,24h")
    t = tel.time_s
    life = tel.life
    n_life = int(life[-1]) + 1 if life.size else 0
    span = float(t.max() - t.min()) if t.size else 0.0
    key = t + life * (span + 2 * max(windows_s) + 1.0)  # lives far apart: windows stay inside one life
    starts = np.searchsorted(life, np.arange(n_life))
    first = starts[life]
    idx = np.arange(t.size)
    count_so_far = (idx - first + 1).astype(float)

    def life_cumsum(v: np.ndarray) -> np.ndarray:
        return _life_cumsum(v, starts)

    def delta(counter: np.ndarray) -> np.ndarray:  # increments of a running count (0 at a life's start)
        d = np.diff(counter.astype(float), prepend=np.nan)
        d[starts] = 0.0
        return np.clip(d, 0.0, None)

    temp, clock = tel.gpu_temp_c, tel.sm_clock_mhz
    temp_mean_life = life_cumsum(temp) / count_so_far
    clock_mean_life = life_cumsum(clock) / count_so_far
    sbe, dbe = delta(tel.ecc_sbe_total), delta(tel.ecc_dbe_total)
    any_xid = (tel.xid > 0).astype(float)
    pre_xid = np.isin(tel.xid, PRECURSOR_XIDS).astype(float)
    cols = {"gpu_temp_c": temp, "mem_temp_c": tel.mem_temp_c, "power_w": tel.power_w, "sm_clock_mhz": clock,
            "gpu_util_pct": tel.gpu_util_pct, "age_h": (t - t[first]) / HOUR_S}
    for w in windows_s:
        tag = f"{w / HOUR_S:g}h"
        s_temp, n = _window_sums(key, w, temp, starts, first)
        s_clock, _ = _window_sums(key, w, clock, starts, first)
        cols[f"temp_mean_{tag}"] = s_temp / n
        cols[f"temp_drift_{tag}"] = s_temp / n - temp_mean_life
        cols[f"clock_drop_{tag}"] = clock_mean_life - s_clock / n
        cols[f"sbe_{tag}"] = _window_sums(key, w, sbe, starts, first)[0]
        cols[f"dbe_{tag}"] = _window_sums(key, w, dbe, starts, first)[0]
        cols[f"xid_{tag}"] = _window_sums(key, w, any_xid, starts, first)[0]
        cols[f"xid_precursor_{tag}"] = _window_sums(key, w, pre_xid, starts, first)[0]
    # label: the board's failure time and the end of its observed life
    ends = np.concatenate((starts[1:], [t.size])) - 1
    fail_of_life = np.where(tel.failed[ends] == 1, t[ends], np.inf)
    fail_s = fail_of_life[life]
    last_s = t[ends][life]
    is_failure = tel.failed == 1
    y = np.where(fail_s - t <= horizon_s, 1, np.where(last_s - t >= horizon_s, 0, -1))
    y[is_failure] = -1
    names = tuple(cols)
    X = np.column_stack([cols[c] for c in names])
    return Features(names, X, y.astype(np.int64), t, life, fail_s, is_failure)


@dataclass(frozen=True)
class Scores:
    """Per-sample measures at a threshold."""

    precision: float
    recall: float
    f1: float
    positives: int
    samples: int

    @staticmethod
    def of(y: np.ndarray, pred: np.ndarray) -> Scores:
        tp = int((pred & (y == 1)).sum())
        fp = int((pred & (y == 0)).sum())
        fn = int((~pred & (y == 1)).sum())
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        return Scores(p, r, 2 * p * r / (p + r) if p + r else 0.0, int((y == 1).sum()), int(y.size))


@dataclass(frozen=True)
class Evaluation:
    """The predictor judged on held-out time (module docstring); times in seconds."""

    source: str
    horizon_s: float
    split_s: float
    train_samples: int
    train_failures: int
    test_failures: int
    threshold: float
    scores: Scores
    average_precision: float
    roc_auc: float
    prevalence: float
    always_positive: Scores
    rule: Scores
    event_recall: float
    alarm_precision: float
    alarms: int
    lead_time_median_s: float
    lead_time_p10_s: float
    top_features: tuple[tuple[str, float], ...]

    def migration(self, migration_s: float, classes: tuple[str, ...] | None = None) -> Migration:
        """The long run's proactive migration from this predictor's event recall and alarm precision."""
        recall = self.event_recall if math.isfinite(self.event_recall) else 0.0
        precision = self.alarm_precision if math.isfinite(self.alarm_precision) else 1.0
        return Migration(recall=recall, precision=max(precision, 1e-6), migration_s=migration_s, classes=classes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["top_features"] = [list(x) for x in self.top_features]
        return d


def _classifier(seed: int) -> HistGradientBoostingClassifier:
    return HistGradientBoostingClassifier(max_iter=100, learning_rate=0.1, max_leaf_nodes=15,
                                          l2_regularization=1.0, early_stopping=False, random_state=seed)


def _best_threshold(y: np.ndarray, p: np.ndarray) -> float:
    """The probability threshold of best F1 on (y, p) (0.5 when y has no positive)."""
    if not (y == 1).any():
        return 0.5
    prec, rec, th = precision_recall_curve(y, p)
    f1 = np.where(prec + rec > 0, 2 * prec * rec / np.maximum(prec + rec, 1e-300), 0.0)[:-1]
    return float(th[int(np.argmax(f1))])


def _events(f: Features, test: np.ndarray, alarm: np.ndarray, horizon_s: float
            ) -> tuple[float, float, int, np.ndarray]:
    """Event recall, alarm precision, alarms and the lead times of the caught failures, in the test period.

    An alarm is a positive sample of a board at least ``H`` after the board's previous alarm (the board is
    migrated off at an alarm: positives in the next ``H`` are the same alarm); a failure is caught if its
    board raised a positive sample in the ``H`` before it."""
    t, life = f.time_s, f.life
    ok = test & ~f.is_failure
    pos = ok & alarm
    starts = np.zeros_like(pos)
    last: dict[int, float] = {}
    for i in np.nonzero(pos)[0]:
        b = int(life[i])
        if t[i] >= last.get(b, -math.inf) + horizon_s:
            starts[i] = True
            last[b] = float(t[i])
    end_s = float(t.max())
    a_t, a_fail = t[starts], f.fail_s[starts]
    known = (a_fail - a_t <= horizon_s) | (end_s - a_t >= horizon_s)
    true_alarm = (a_fail - a_t <= horizon_s)[known]
    fails = f.is_failure & test & (t >= t[test].min() + horizon_s)
    leads = []
    for ft, lf in zip(t[fails], life[fails], strict=True):
        w = pos & (life == lf) & (t >= ft - horizon_s) & (t < ft)
        if w.any():
            leads.append(ft - t[w].min())
    n_f = int(fails.sum())
    return (len(leads) / n_f if n_f else math.nan,
            float(true_alarm.mean()) if true_alarm.size else math.nan, int(true_alarm.size), np.asarray(leads))


def evaluate(tel: Telemetry, horizon_s: float = 24 * HOUR_S, *, test_fraction: float = 0.3, seed: int = 0,
             windows_s: tuple[float, ...] = DEFAULT_WINDOWS_S) -> Evaluation:
    """Train on the earlier part of the record, judge on the later (module docstring)."""
    if not 0.05 <= test_fraction <= 0.8:
        raise ConfigError("--test-fraction", f"must be in [0.05, 0.8], got {test_fraction!r}", "e.g. 0.3")
    f = features(tel, horizon_s, windows_s)
    t0, t1 = float(f.time_s.min()), float(f.time_s.max())
    split = t0 + (1.0 - test_fraction) * (t1 - t0)
    train = (f.y >= 0) & (f.time_s + horizon_s <= split)
    test_all = f.time_s >= split
    test = test_all & (f.y >= 0)
    fit_end = t0 + 0.75 * (split - horizon_s - t0)
    early = train & (f.time_s + horizon_s <= fit_end)
    val = train & (f.time_s >= fit_end)
    n_fail_train = int((f.is_failure & (f.time_s < split)).sum())
    n_fail_test = int((f.is_failure & test_all).sum())
    for what, mask, need in (("training", train, "a longer record or a shorter --horizon"),
                             ("test", test, "a longer record or a larger --test-fraction")):
        ys = f.y[mask]
        for label, kind in ((1, "failure"), (0, "healthy")):
            if not (ys == label).any():
                raise ConfigError(tel.source, f"the {what} period has no labelled {kind} sample", f"give {need}")
    threshold = 0.5
    if (f.y[early] == 1).any() and (f.y[early] == 0).any() and (f.y[val] == 1).any():
        m0 = _classifier(seed).fit(f.X[early], f.y[early])
        threshold = _best_threshold(f.y[val], m0.predict_proba(f.X[val])[:, 1])
    model = _classifier(seed).fit(f.X[train], f.y[train])
    p_all = model.predict_proba(f.X)[:, 1]
    yt, pt = f.y[test], p_all[test]
    scores = Scores.of(yt, pt >= threshold)
    prevalence = float((yt == 1).mean())
    always = Scores.of(yt, np.ones(yt.size, bool))
    col = {n: i for i, n in enumerate(f.names)}
    rule_all = (f.X[:, col["xid_precursor_24h"]] > 0) | (f.X[:, col["sbe_24h"]] > 0) \
        if "xid_precursor_24h" in col else np.zeros(f.y.size, bool)
    rule = Scores.of(yt, rule_all[test])
    recall_e, precision_e, alarms, leads = _events(f, test_all, p_all >= threshold, horizon_s)
    # which features the trees lean on: the drop in average precision when one is shuffled (test period,
    # at most 2,000 samples)
    rng = np.random.default_rng(seed)
    base_ap = float(average_precision_score(yt, pt))
    imp = []
    sub = np.sort(rng.permutation(yt.size)[:2000])
    Xt, ys = f.X[test][sub], yt[sub]
    ap_sub = float(average_precision_score(ys, pt[sub])) if (ys == 1).any() else 0.0
    for j, name in enumerate(f.names):
        Xs = Xt.copy()
        Xs[:, j] = Xs[rng.permutation(Xs.shape[0]), j]
        if (ys == 1).any():
            imp.append((name, ap_sub - float(average_precision_score(ys, model.predict_proba(Xs)[:, 1]))))
    imp.sort(key=lambda x: -x[1])
    return Evaluation(
        source=tel.source, horizon_s=horizon_s, split_s=split, train_samples=int(train.sum()),
        train_failures=n_fail_train, test_failures=n_fail_test, threshold=threshold, scores=scores,
        average_precision=base_ap, roc_auc=float(roc_auc_score(yt, pt)), prevalence=prevalence,
        always_positive=always, rule=rule, event_recall=recall_e, alarm_precision=precision_e, alarms=alarms,
        lead_time_median_s=float(np.median(leads)) if leads.size else math.nan,
        lead_time_p10_s=float(np.percentile(leads, 10)) if leads.size else math.nan,
        top_features=tuple((n, round(v, 4)) for n, v in imp[:5]))
