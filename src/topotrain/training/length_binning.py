"""Variable-length sequences padded per micro-batch, with LDDL's sequence binning.

A BERT pre-training corpus is not made of full-length sequences: the sample builder of Google's
``create_pretraining_data.py`` — which NVIDIA's LDDL preprocessor re-implements line for line
(``lddl/dask/bert/pretrain.py``, ``create_pairs_from_document``: ``short_seq_prob`` 0.1, a chunk ends at
the end of its document) — leaves many sequences shorter than ``max_seq_length``. On Wikipedia at 512
tokens about half of all tokens would be padding (Krell et al., "Efficient Sequence Packing without
Cross-contamination", arXiv 2107.02027, 2021, abstract; their published length histogram, below).

NVIDIA DeepLearningExamples' PyTorch BERT (the 21.11 figures, docs/sources.md §2c) reads phase 2 through
LDDL with ``bin_size=64``; LDDL's loader then (NVIDIA/LDDL README, "Sequence binning"; ``lddl/torch/bert.py``
``_to_encoded_inputs``):

1. cuts the lengths into bins of ``bin_size`` tokens: bin ``k`` holds lengths ``((k-1)·B, k·B]``;
2. at each iteration draws one bin with the probability of its share of the dataset's sequences, and
   feeds every rank a micro-batch from that bin;
3. pads the micro-batch only to its longest sequence, rounded up to a multiple of
   ``sequence_length_alignment`` (8: "TC doesn't like it otherwise").

So a micro-batch of ``n`` sequences drawn from bin ``k`` (probability ``p_k``) is padded to ``ℓ`` (a
multiple of the alignment ``a``) with probability

    P(L = ℓ) = p_k · (F_k(ℓ)^n − F_k(ℓ − a)^n)

where ``F_k`` is the dataset's length CDF inside bin ``k`` (the longest of ``n`` independent draws is ≤ ℓ
iff all are; LDDL's 16,384-sample shuffle buffer over millions of sequences makes the draws nearly
independent). Without binning (``bin_size`` None) the whole length range is one bin. The GPU's time per
micro-batch is then the expectation over ``L`` of its time at ``L`` tokens (:class:`PaddedLengthCompute`):
the GEMMs scale with ``L``, the attention matrices with ``L²``, so it is not the time at the mean length.

The length histogram (:data:`WIKIPEDIA_BERT_512`) is Graphcore's published Wikipedia pre-training
histogram at ``max_sequence_length`` 512 (16,279,552 sequences; graphcore/examples,
``tutorials/blogs_code/packedBERT/histograms.py``, the data of Krell et al.), summed over groups of 8 tokens
(all the padding rule needs with an alignment of 8). It is a proxy for the data of NVIDIA's runs: the same
sample-building algorithm on English Wikipedia, but another dump and another sentence splitter (LDDL
splits with NLTK's Punkt) — docs/sources.md §2d.

Memory is unchanged: the longest bin still holds full-length micro-batches, and the memory model
sizes for ``seq_len``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from topotrain.util.errors import ConfigError
from topotrain.util.fields import PositiveInt
from topotrain.util.problems import config_dataclass, several
from topotrain.workload.layer import Model


@dataclass(frozen=True)
class LengthHistogram:
    """Sequence counts of a dataset by length: ``counts[j]`` sequences have ``j·group + 1`` to
    ``(j+1)·group`` tokens (the last group ends at ``max_len``)."""

    name: str
    group: int
    counts: tuple[int, ...]
    source: str

    @property
    def max_len(self) -> int:
        return self.group * len(self.counts)

    @property
    def sequences(self) -> int:
        return sum(self.counts)


#: English Wikipedia as BERT pre-training samples of at most 512 tokens: Graphcore's published histogram
#: (graphcore/examples ``tutorials/blogs_code/packedBERT/histograms.py``, ``wikipedia_histogram``, the data
#: of Krell et al. 2021), **derived** here by summing its per-length counts over groups of 8 tokens
#: (lengths 1–8, 9–16, …, 505–512; 3,815,044 of the last group's 3,879,431 are exactly 512).
WIKIPEDIA_BERT_512 = LengthHistogram(
    name="wikipedia-bert-512",
    group=8,
    counts=(
        6331, 45532, 176473, 356499, 515880, 583728, 598874, 579762, 535062, 485161, 435864, 397233, 361800,
        333886, 310569, 291229, 274868, 260125, 245659, 233778, 223291, 214357, 205922, 197542, 190531,
        183496, 175456, 170890, 165235, 159303, 154216, 150438, 144900, 140902, 135907, 132496, 128725,
        125382, 122962, 118932, 116597, 113641, 111253, 108284, 106349, 103576, 101256, 98553, 96660, 94630,
        92876, 91106, 89016, 87822, 85960, 84448, 82601, 80691, 79754, 78348, 77153, 76062, 74289, 3879431,
    ),
    source="Krell et al. 2021 (arXiv 2107.02027); graphcore/examples packedBERT/histograms.py",
)

#: The length histograms a scenario can name (``plan.length_binning.lengths``).
LENGTH_HISTOGRAMS: Mapping[str, LengthHistogram] = {WIKIPEDIA_BERT_512.name: WIKIPEDIA_BERT_512}


@config_dataclass("plan.length_binning")
class LengthBinning:
    """How a run's data loader pads variable-length sequences (module docstring): the dataset's length
    histogram (by name), the bin size (None: no binning, each micro-batch padded to its longest sequence)
    and the padding alignment (LDDL's ``sequence_length_alignment``, 8)."""

    lengths: Literal["wikipedia-bert-512"]
    bin_size: PositiveInt | None = None
    alignment: Annotated[int, Field(strict=True, gt=0)] = 8

    @model_validator(mode="after")
    def _shapes(self) -> LengthBinning:
        hist = LENGTH_HISTOGRAMS[self.lengths]
        found = []
        if self.alignment % hist.group:
            found.append(ConfigError("alignment", f"must be a multiple of {hist.group} (the histogram of "
                                     f"{hist.name} counts lengths in groups of {hist.group})", "use alignment: 8"))
        if self.bin_size is not None and (self.bin_size % self.alignment or self.bin_size > hist.max_len):
            found.append(ConfigError("bin_size", f"must be a multiple of the alignment ({self.alignment}) and at "
                                     f"most {hist.max_len} tokens", "use e.g. bin_size: 64"))
        if found:
            raise several(found)
        return self

    @property
    def histogram(self) -> LengthHistogram:
        return LENGTH_HISTOGRAMS[self.lengths]

    def padded_lengths(self, micro_batch: int) -> dict[int, float]:
        """Probability of each padded length (tokens) of a micro-batch of ``micro_batch`` sequences."""
        return padded_length_distribution(self.histogram, micro_batch, self.bin_size, self.alignment)


def padded_length_distribution(hist: LengthHistogram, micro_batch: int, bin_size: int | None = None,
                               alignment: int = 8) -> dict[int, float]:
    """``{ℓ: P(L = ℓ)}``: the padded length of a micro-batch of ``micro_batch`` sequences drawn from one
    length bin chosen by its share of the sequences, padded to its longest rounded up to ``alignment``
    (module docstring). ``bin_size`` None: one bin over all lengths."""
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise ConfigError("micro_batch", f"must be a positive integer, got {micro_batch!r}", "give e.g. 32")
    if alignment % hist.group:
        raise ConfigError("alignment", f"must be a multiple of {hist.group}", "use alignment: 8")
    width = hist.max_len if bin_size is None else bin_size
    if width % alignment:
        raise ConfigError("bin_size", f"must be a multiple of the alignment {alignment}", "use e.g. 64")
    per_align = alignment // hist.group
    counts = np.asarray(hist.counts, dtype=np.float64).reshape(-1, per_align).sum(axis=1)
    per_bin = width // alignment
    total = counts.sum()
    out: dict[int, float] = {}
    for start in range(0, len(counts), per_bin):
        c = counts[start:start + per_bin]
        n_bin = c.sum()
        if n_bin <= 0:
            continue
        cdf_n = (np.cumsum(c) / n_bin) ** micro_batch
        p_max = np.diff(np.concatenate(([0.0], cdf_n)))
        for j, p in enumerate(p_max):
            if p > 0:
                ell = (start + j + 1) * alignment
                out[ell] = out.get(ell, 0.0) + float(n_bin / total * p)
    return out


def mean_padded_length(dist: Mapping[int, float]) -> float:
    """Expected padded length of a :func:`padded_length_distribution`."""
    return sum(ell * p for ell, p in dist.items())


class PaddedLengthCompute:
    """A compute model (:class:`topotrain.compute.roofline.ComputeModel`) for micro-batches of varying padded
    length: each layer's time is the expectation over the padded length of its time in the model built at
    that length (module docstring). ``model_at(ℓ)`` builds the model at ``ℓ`` tokens (same layers, same
    order); lengths below ``min_probability`` are dropped and the rest renormalized."""

    def __init__(self, inner: object, binning: LengthBinning, model_at: Callable[[int], Model],
                 min_probability: float = 1e-6) -> None:
        self.inner = inner
        self.binning = binning
        self.model_at = model_at
        self.min_probability = min_probability
        self._models: dict[int, Model] = {}
        self._memo: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def _model(self, ell: int, like: Model) -> Model:
        m = self._models.get(ell)
        if m is None:
            m = self.model_at(ell)
            if [lay.name for lay in m.layers] != [lay.name for lay in like.layers]:
                raise ConfigError("plan.length_binning", f"{like.name} at {ell} tokens has other layers",
                                  "length binning needs a transformer whose layers do not depend on seq_len")
            self._models[ell] = m
        return m

    def weights(self, micro_batch: int) -> dict[int, float]:
        """The padded lengths this model averages over, with their renormalized probabilities."""
        dist = {ell: p for ell, p in self.binning.padded_lengths(micro_batch).items() if p >= self.min_probability}
        s = sum(dist.values())
        return {ell: p / s for ell, p in sorted(dist.items())}

    def layer_times(self, model: Model, batch: int, tp: int) -> tuple[np.ndarray, np.ndarray]:
        key = (int(batch), int(tp))
        hit = self._memo.get(key)
        if hit is None:
            n = len(model.layers)
            fwd, bwd = np.zeros(n), np.zeros(n)
            for ell, p in self.weights(int(batch)).items():
                f, b = self.inner.layer_times(self._model(ell, model), batch, tp)  # type: ignore[attr-defined]
                fwd += p * f
                bwd += p * b
            hit = self._memo[key] = (fwd, bwd)
        return hit[0].copy(), hit[1].copy()


def check_model(binning: LengthBinning, model: Model) -> list[ConfigError]:
    """Problems of using ``binning`` with ``model`` (fields relative to the plan)."""
    hist = binning.histogram
    if model.sample_kind != "sequence" or model.seq_len != hist.max_len:
        return [ConfigError("length_binning.lengths", f"{hist.name} has sequences of up to {hist.max_len} tokens, "
                            f"but {model.name} trains on "
                            + (f"{model.seq_len}" if model.sample_kind == "sequence" else "images"),
                            f"set the model's seq_len to {hist.max_len}, or drop length_binning")]
    return []


__all__ = ["LENGTH_HISTOGRAMS", "WIKIPEDIA_BERT_512", "LengthBinning", "LengthHistogram", "PaddedLengthCompute",
           "check_model", "mean_padded_length", "padded_length_distribution"]
