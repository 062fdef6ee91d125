"""The memory model's activation bytes against the bytes torch really saves for the backward of a block.

``benchmarks/activation_memory.py`` builds a Megatron-style transformer block in plain torch (bf16 on the CPU)
and counts, under ``torch.autograd.graph.saved_tensors_hooks``, the distinct storages autograd keeps; here every
one of its 144 variants (GPT and Llama-like blocks, MHA and GQA, eager and fused attention, dropout on and off,
tp 1 / tp 2 / tp 2 with sequence parallelism, recompute none / selective / full) must match
:func:`topotrain.training.memory.block_activation_bytes` within 5% (Korthikanti et al., MLSys 2023, §4;
FlashAttention-2's saved set). The figures are in docs/validation.md §9.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from topotrain.training.memory import (
    MemoryPlan,
    _grouped_query_copy_bytes,
    block_activation_bytes,
    korthikanti_activation_bytes,
)

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def am(monkeypatch_module: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch_module.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import activation_memory

    return activation_memory


@pytest.fixture(scope="module")
def monkeypatch_module():  # type: ignore[no-untyped-def]
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_every_variant_within_5_percent(am) -> None:  # type: ignore[no-untyped-def]
    assert len(am.VARIANTS) == 144
    off = {}
    for v in am.VARIANTS:
        m = am.measure(v)
        if abs(m.ratio - 1.0) > 0.05:
            off[v.name] = round(m.ratio, 4)
    assert off == {}


def test_korthikanti_block_measured(am) -> None:  # type: ignore[no-untyped-def]
    """The paper's own case (GPT block, MHA, eager attention, dropout): its closed form is the model's count,
    and the measured bytes exceed it only by the norms' per-token statistics (mean and rstd)."""
    for tp, sp, rc in ((1, False, "none"), (2, False, "none"), (2, True, "none"), (2, True, "selective"),
                       (1, False, "full")):
        v = next(x for x in am.VARIANTS if x.name == f"gpt eager dropout tp{tp}{' sp' if sp else ''} {rc}")
        closed = korthikanti_activation_bytes(v.seq_len, v.micro_batch, v.hidden, v.heads, tp=tp,
                                              sequence_parallel=sp, recompute=rc)
        assert am.modelled_bytes(v) == pytest.approx(closed, rel=1e-12)
        measured = am.measured_bytes(v)
        stats = 0 if rc == "full" else 2 * 2 * 2 * v.micro_batch * v.seq_len / (tp if sp else 1)
        assert measured == pytest.approx(closed + stats, rel=1e-12)


def test_grouped_kv_expanded_in_unfused_attention(am) -> None:  # type: ignore[no-untyped-def]
    """Eager attention expands grouped K and V to every head before its GEMMs: the stash of a GQA block is the
    MHA block's (measured and modelled); selective recomputation keeps only the unexpanded q, k, v."""
    gqa = next(x for x in am.VARIANTS if x.name == "gpt-gqa eager dropout tp2 none")
    mha = next(x for x in am.VARIANTS if x.name == "gpt eager dropout tp2 none")
    assert am.modelled_bytes(gqa) == am.modelled_bytes(mha)
    assert am.measured_bytes(gqa) == am.measured_bytes(mha)
    sel = next(x for x in am.VARIANTS if x.name == "gpt-gqa eager dropout tp2 selective")
    sel_mha = next(x for x in am.VARIANTS if x.name == "gpt eager dropout tp2 selective")
    kv_saving = 2 * 2 * sel.micro_batch * sel.seq_len * (sel.hidden - sel.hidden * sel.kv_heads // sel.heads) / 2
    assert am.modelled_bytes(sel_mha) - am.modelled_bytes(sel) == pytest.approx(kv_saving)


def test_grouped_query_copy_with_several_groups_per_rank(am) -> None:  # type: ignore[no-untyped-def]
    """Megatron-Core's grouped QKV layout copies the queries when a rank holds several KV groups (tp 1, 2
    groups) and not when it holds one (tp 2): the fused attention keeps one query tensor more at tp 1."""
    model = am.model_of(next(x for x in am.VARIANTS if x.name == "llama flash no-dropout tp1 none"))
    q = 2 * 64 * 128 * 2  # dtype · s · h · b
    one = block_activation_bytes(model, MemoryPlan(micro_batch=2), block=1)
    plain = sum(lay.activation_bytes for lay in model.layers if lay.block == 1) * 2
    assert one - plain == pytest.approx(q)
    layers = [lay for lay in model.layers if lay.block == 1]
    assert _grouped_query_copy_bytes(model, layers, MemoryPlan(micro_batch=2)) == pytest.approx(q / 2)
    assert _grouped_query_copy_bytes(model, layers, MemoryPlan(tp=2, micro_batch=2)) == 0.0
    assert _grouped_query_copy_bytes(model, layers, MemoryPlan(recompute="full", micro_batch=2)) == 0.0


def test_measured_block_runs_backward(am) -> None:  # type: ignore[no-untyped-def]
    """The emulated functions (checkpoint, SP GEMM, fused RMSNorm and SwiGLU) are a working backward."""
    for name in ("llama eager dropout tp2 sp selective", "gpt flash no-dropout tp2 sp full",
                 "llama-mha flash dropout tp1 none"):
        v = next(x for x in am.VARIANTS if x.name == name)
        assert am.measured_bytes(v, backward=True) == am.measured_bytes(v)
