"""Variable-length sequences padded per micro-batch with LDDL's sequence binning
(:mod:`topotrain.training.length_binning`): the padded-length law against hand-computed cases, the
Wikipedia histogram against the figures its paper states, the expected layer time, and bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from topotrain.compute.roofline import RooflineModel
from topotrain.scenario.load import scenario_from_dict
from topotrain.training.length_binning import (
    WIKIPEDIA_BERT_512,
    LengthBinning,
    LengthHistogram,
    PaddedLengthCompute,
    mean_padded_length,
    padded_length_distribution,
)
from topotrain.training.simulate import simulate
from topotrain.util.errors import ConfigError
from topotrain.workload.zoo import get_model

# four groups of 8 tokens: 1 sequence of 1-8 tokens, 1 of 9-16, 2 of 17-24, none of 25-32
TINY = LengthHistogram("tiny", 8, (1, 1, 2, 0), "test")


def test_one_sequence_per_batch_is_the_histogram() -> None:
    """n = 1: the padded length is the sequence's own length rounded up to 8: P = counts / total."""
    assert padded_length_distribution(TINY, 1) == pytest.approx({8: 0.25, 16: 0.25, 24: 0.5})


def test_longest_of_two_without_bins() -> None:
    """n = 2, one bin: P(L ≤ ℓ) = F(ℓ)²; F = (1/4, 1/2, 1, 1) → F² = (1/16, 1/4, 1, 1)."""
    assert padded_length_distribution(TINY, 2) == pytest.approx({8: 1 / 16, 16: 3 / 16, 24: 3 / 4})


def test_longest_of_two_in_16_token_bins() -> None:
    """Bins (0, 16] (half the sequences, F = (1/2, 1)) and (16, 32] (the other half, all at 24): the first
    bin pads to 8 with probability 1/2 · 1/4 and to 16 with 1/2 · 3/4; the second always to 24."""
    got = padded_length_distribution(TINY, 2, bin_size=16)
    assert got == pytest.approx({8: 1 / 8, 16: 3 / 8, 24: 1 / 2})
    assert mean_padded_length(got) == pytest.approx(8 / 8 + 16 * 3 / 8 + 12)


def test_bins_as_narrow_as_the_alignment_keep_the_histogram() -> None:
    """With bins of one alignment step every batch pads to its bin's end, whatever its size."""
    assert padded_length_distribution(TINY, 7, bin_size=8) == pytest.approx({8: 0.25, 16: 0.25, 24: 0.5})


def test_coarser_alignment() -> None:
    """Alignment 16: lengths 1-16 (half) pad to 16, 17-32 to 32; n = 1."""
    assert padded_length_distribution(TINY, 1, alignment=16) == pytest.approx({16: 0.5, 32: 0.5})


def test_wikipedia_histogram_as_published() -> None:
    """Graphcore's histogram: 16,279,552 sequences (their README's "Packed 16279552 sequences"), and at
    sequence length 512 padding is half of all tokens (Krell et al. 2021: "in excess of 50%"; their
    theoretical packing speed-up 2.0013 is 512 over the mean length)."""
    h = WIKIPEDIA_BERT_512
    assert h.sequences == 16_279_552 and h.max_len == 512
    # the mean length from the group counts, each group at its upper end, bounds the true mean from above
    upper = sum((j + 1) * 8 * c for j, c in enumerate(h.counts)) / h.sequences
    assert 512 / upper == pytest.approx(2.0013, rel=0.02)
    assert upper == pytest.approx(512 / 2.0013, abs=8)


def test_wikipedia_64_token_bins() -> None:
    """Bins of 64 with 32 sequences a batch: the longest of 32 sits at its bin's end almost surely, so the
    mean padded length is close to Σ p_bin · bin end — the bin shares summed by hand from the group counts
    (0.1759, 0.1935, 0.1140, 0.0829, 0.0645, 0.0528, 0.0444, 0.2720) give 279.3 tokens — and every length
    outside the top group of each bin is rare (1.7% of batches)."""
    dist = padded_length_distribution(WIKIPEDIA_BERT_512, 32, bin_size=64)
    assert sum(dist.values()) == pytest.approx(1.0)
    shares = [0.1759, 0.1935, 0.1140, 0.0829, 0.0645, 0.0528, 0.0444, 0.2720]
    by_hand = sum(s * 64 * (k + 1) for k, s in enumerate(shares))
    assert by_hand == pytest.approx(279.3, abs=0.2)
    assert mean_padded_length(dist) == pytest.approx(by_hand, abs=1.0)
    assert sum(p for ell, p in dist.items() if ell % 64) < 0.02
    # without bins a batch of 32 is padded to 512 all but surely (P(all 32 shorter) = 0.76^32 ≈ 1.5e-4)
    full = padded_length_distribution(WIKIPEDIA_BERT_512, 32)
    assert full[512] == pytest.approx(1 - (1 - 3_879_431 / 16_279_552) ** 32, rel=1e-9)


def test_layer_times_are_the_expectation_over_lengths() -> None:
    """Each layer's time is Σ_ℓ P(ℓ) · its time in the model built at ℓ tokens."""
    binning = LengthBinning(lengths="wikipedia-bert-512", bin_size=64)
    inner = RooflineModel("a100-80gb", "fp16")
    built: dict[int, Any] = {}

    def at(n: int) -> Any:
        built[n] = get_model("bert-large", seq_len=n)
        return built[n]

    mix = PaddedLengthCompute(inner, binning, at)
    model = get_model("bert-large", seq_len=512)
    fwd, bwd = mix.layer_times(model, 8, 1)
    weights = mix.weights(8)
    assert sum(weights.values()) == pytest.approx(1.0)
    want_f = sum(p * inner.layer_times(built[n], 8, 1)[0] for n, p in weights.items())
    want_b = sum(p * inner.layer_times(built[n], 8, 1)[1] for n, p in weights.items())
    np.testing.assert_allclose(fwd, want_f, rtol=1e-12)
    np.testing.assert_allclose(bwd, want_b, rtol=1e-12)
    full_f, full_b = inner.layer_times(model, 8, 1)
    assert fwd.sum() + bwd.sum() < 0.75 * (full_f.sum() + full_b.sum())


def _bert512(plan: dict[str, Any]) -> dict[str, Any]:
    return {"network": "analytical", "cluster": {"server": "nvswitch-8", "servers": 1},
            "model": {"name": "bert-large", "seq_len": 512}, "batch": 256, "plan": {"micro_batch": 32, **plan}}


def test_binning_speeds_up_phase2_and_keeps_memory() -> None:
    """Binned phase 2 runs ~1.8x the full-length samples/s (mean padded length 279 of 512, attention
    quadratic); unbinned batches of 32 are full length (the same time to 0.1%); memory is sized for 512."""
    full = simulate(scenario_from_dict(_bert512({})))
    binned = simulate(scenario_from_dict(_bert512({"length_binning": {"lengths": "wikipedia-bert-512",
                                                                      "bin_size": 64}})))
    unbinned = simulate(scenario_from_dict(_bert512({"length_binning": {"lengths": "wikipedia-bert-512"}})))
    assert binned.samples_per_s / full.samples_per_s == pytest.approx(1.85, rel=0.08)
    assert unbinned.samples_per_s == pytest.approx(full.samples_per_s, rel=1e-3)
    assert binned.peak_memory_bytes == full.peak_memory_bytes


@pytest.mark.parametrize("binning,field", [
    ({"lengths": "wikipedia-bert-512", "bin_size": 60}, "plan.length_binning.bin_size"),
    ({"lengths": "wikipedia-bert-512", "alignment": 12}, "plan.length_binning.alignment"),
    ({"lengths": "wikipedia-bert-512", "bin_size": 1024}, "plan.length_binning.bin_size"),
    ({"lengths": "books"}, "plan.length_binning.lengths"),
])
def test_bad_binning_names_the_field(binning: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(_bert512({"length_binning": binning}))
    assert field in str(e.value)


def test_binning_needs_the_histograms_sequence_length() -> None:
    with pytest.raises(ConfigError) as e:
        scenario_from_dict({**_bert512({"length_binning": {"lengths": "wikipedia-bert-512", "bin_size": 64}}),
                            "model": "bert-large"})
    assert "seq_len" in str(e.value) and "plan.length_binning" in str(e.value)
