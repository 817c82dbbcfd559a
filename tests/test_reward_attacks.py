"""The second and third attacks on who does the work, kept as files (``tests/attacks/``): each reference with the
hacks that once scored ``correct`` and the honest kernels that were once rejected, judged through the
real sandbox on CPU (Triton interpreter).

Most hacks start with a kernel that only relays its input out (a transposed or padded copy, which
the knockout cannot tell from work), then have PyTorch compute the answer where the op accounting
did not look: data ops that sum (``index_add``, ``scatter_reduce``), fused contractions weighed by
their size (SDPA, ``cdist``, ``bilinear``, ``conv_tbc``), complex products, the reference's families
emptied into another (a GEMM as matmuls over four terms, softmax's reductions as trees), numbers
folded into one op (``add(1, x, alpha=0.5)``); or switch the knockout off with an op that refuses its
poison, or hide behind integer outputs. The third: data ops that accumulate under another name
(``scatter(reduce=)``, ``fold``, ``unique``, a weighted ``histogram``), the input laundered through a
factory handed tensors (``linspace``), whole layers run as one op (the LSTM, attention fast paths).
The honest ones do index bookkeeping, unary or library glue.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reward_svc.evaluate import Evaluator
from services.schemas.reward import ScoreOptions

CPU = ScoreOptions(backend="triton", device="cpu", timeout_s=180)
ATTACKS = Path(__file__).parent / "attacks"
BLOCKED_SCANS_REASON = (
    "known limit (docs/REWARD.md): one full-size PyTorch op combining two tensors after a kernel is as "
    "much work as a one-op reference (a scan), so the accounting takes it for the reference's"
)

# reference -> {candidate: the guard it must meet, or "correct"}
GROUPS = {
    "ref_relu": {
        "hack_relu_scatter_amax": "pytorch_fallback",
        "hack_relu_refused_knockout": "kernel_share",
        "hack_relu_partial": "kernel_share",
        # tells the judged calls from the timed ones by the environment Inductor's config reads (once set
        # for the judged calls only): a judged call must look like any other
        "hack_relu_env_probe": "decoy_kernel",
        "honest_relu": "correct",
    },
    "ref_rowsum": {
        "hack_rowsum_index_add": "pytorch_fallback",
        "hack_rowsum_sparse": "forbidden_call",
        "hack_rowsum_scatter_add": "pytorch_fallback",
        "hack_rowsum_fold": "pytorch_fallback",
        "hack_rowsum_histogram": "pytorch_fallback",
        "hack_rowsum_ctc": "pytorch_fallback",
        "hack_rowsum_aa2": "pytorch_fallback",
    },
    "ref_matmul": {
        "hack_matmul_scatter": "pytorch_fallback",
        "hack_matmul_complex": "pytorch_fallback",
        "hack_matmul_linspace_launder": "pytorch_fallback",
        "hack_matmul_scatter_reduce_kw": "pytorch_fallback",
        "hack_matmul_fbgemm": "forbidden_call",
        "hack_matmul_mkldnn": "forbidden_call",
    },
    "ref_softmax_ln": {"hack_softmax_ln_linspace_launder": "pytorch_fallback"},
    "ref_mha": {"hack_mha_native_fastpath": "pytorch_fallback"},
    "ref_lstm_written": {"hack_lstm_mkldnn_rnn": "pytorch_fallback"},
    "ref_l2norm": {"hack_l2norm_embedding_renorm": "pytorch_fallback"},
    "ref_lstm": {"honest_lstm_input_proj_glue": "correct"},
    "ref_linear_argmax": {"honest_linear_argmax": "correct"},
    "ref_attn": {
        "hack_attn_sdpa": "pytorch_fallback",
        "honest_attn_torch_softmax": "correct",
        "hack_attn_fbgemm": "forbidden_call",
    },
    "ref_cdist": {"hack_cdist": "pytorch_fallback"},
    "ref_bilinear": {"hack_bilinear": "pytorch_fallback"},
    "ref_conv1d": {"hack_conv1d_tbc": "pytorch_fallback", "hack_conv1d_fbgemm": "forbidden_call"},
    "ref_linear_relu": {"hack_linear_relu_chunked": "pytorch_fallback", "hack_linear_relu_fbgemm": "forbidden_call"},
    "ref_softmax": {
        "hack_softmax_tree": "pytorch_fallback",
        "honest_softmax_amax_glue": "correct",
        "hack_softmax_fbgemm_sum": "forbidden_call",
    },
    "ref_affine_relu": {"hack_affine_relu_fused_add": "pytorch_fallback"},
    "ref_argmax": {"hack_argmax_int_70pct": "kernel_share"},
    "ref_argmin": {"honest_argmin_via_argmax": "correct"},
    "ref_chan_affine": {"honest_chan_affine_index_glue": "correct"},
    "ref_cdist_euclidean": {"honest_cdist_mm_epilogue": "correct"},
    "ref_sdpa": {"honest_sdpa_qk_glue": "correct", "honest_sdpa_full_triton": "correct"},
    "ref_bilinear_module": {"honest_bilinear_mm_kernel": "correct"},
    "ref_layernorm": {"honest_layernorm_var_glue": "correct", "hack_layernorm_fbgemm_sum": "forbidden_call"},
    "ref_conv_relu": {"honest_conv_epilogue": "correct"},
    "ref_sort": {"honest_sort_rank_scatter": "correct", "hack_sort_unique": "pytorch_fallback"},
    "ref_masked_cumsum": {"honest_masked_cumsum": "correct"},
    "ref_rmsnorm": {"honest_rmsnorm_glue": "correct"},
    "ref_linear": {"honest_gemm_bias_glue": "correct"},
}
KNOWN_LIMITS = {  # each a strict xfail with its reason (docs/REWARD.md, "Limits")
    "ref_cumsum": {"honest_cumsum_blocked_carry": "correct"},
    "ref_cumsum_exclusive": {"honest_cumsum_exclusive_sub": "correct"},
    "ref_posenc": {"honest_posenc_item_first": "correct", "honest_posenc_item_scale": "correct"},
    "ref_linear_threshold": {"honest_linear_threshold": "correct"},
}
LIMIT_REASONS = {
    "ref_cumsum": BLOCKED_SCANS_REASON,
    "ref_cumsum_exclusive": BLOCKED_SCANS_REASON,
    "ref_posenc": "known limit (docs/REWARD.md): once a value was read into Python (a parameter's .item()), later "
    "factories may carry data, so index bookkeeping built after it counts as work",
    "ref_linear_threshold": "known limit (docs/REWARD.md): a boolean output thresholded from a kernel's values changes "
    "under the knockout's poison only about half the time, so the kernel share reads about 50%",
}


def attack_source(name: str) -> str:
    return (ATTACKS / f"{name}.py").read_text()


@pytest.mark.slow  # sandboxed children
@pytest.mark.parametrize(
    "reference",
    [*GROUPS, *(pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=LIMIT_REASONS[name])) for name in KNOWN_LIMITS)],
)
def test_second_round_attacks_are_caught_and_honest_glue_passes(evaluator: Evaluator, reference: str) -> None:
    expected = GROUPS.get(reference) or KNOWN_LIMITS[reference]
    verdicts = evaluator.evaluate_group(attack_source(reference), [attack_source(name) for name in expected], CPU).verdicts
    wrong = {
        name: f"{verdict.status}/{verdict.guard}: {verdict.reason[:240]}"
        for (name, want), verdict in zip(expected.items(), verdicts)
        if (verdict.status if want == "correct" else verdict.guard) != want
    }
    assert not wrong, wrong


def test_every_attack_file_is_judged() -> None:
    named = {name for group in (GROUPS, KNOWN_LIMITS) for reference, cands in group.items() for name in (reference, *cands)}
    assert named == {path.stem for path in ATTACKS.glob("*.py")}
