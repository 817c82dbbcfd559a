"""The op accounting's parts, in process (no sandbox): what PyTorch's work weighs, what of it is index
bookkeeping, what can stand for another family's, and how the knockout goes on past an op that refuses
its poison. The sandboxed verdicts these feed are in test_reward_work.py and test_reward_attacks.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from reward_svc.harness.instrument import LaunchCounter
from reward_svc.verify import pytorch_covers_reference
from services.children.ops import OpRecorder, Work
from tests.template_cases import problem


def work_of(forward, *inputs: torch.Tensor) -> Work:  # type: ignore[no-untyped-def]
    with OpRecorder() as recorder:
        forward(*inputs)
    return recorder.work()


X = torch.randn(4, 8, 16, 16)


@pytest.mark.parametrize(
    "bookkeeping",
    [
        lambda x: (torch.arange(x.numel()) // (x.shape[2] * x.shape[3])) % x.shape[1],  # each element's channel
        lambda x: torch.ones(64, 64).tril().bool().logical_not(),  # a causal mask
        lambda x: (torch.arange(64)[:, None] >= torch.arange(64)[None, :]).float() * 2.0,
        lambda x: torch.linspace(0, 1, x.shape[-1]).exp().cumsum(0),
        lambda x: torch.full_like(x, 3.0).mul_(2).add_(1),
    ],
)
def test_index_bookkeeping_from_data_free_factories_is_no_work(bookkeeping) -> None:  # type: ignore[no-untyped-def]
    assert work_of(bookkeeping, X)["families"] == {}


@pytest.mark.parametrize(
    "laundering",
    [
        lambda x: torch.zeros_like(x).copy_(x) * 2,  # the input copied into a zeros buffer
        lambda x: torch.zeros(x.numel()).index_put_((torch.arange(x.numel()),), x.reshape(-1)) * 2,
        lambda x: torch.mul(x, 1.0, out=torch.zeros_like(x)) * 2,
        lambda x: torch.empty_like(x).fill_(1.0) * 2,  # empty: its memory may hold a freed tensor's values
        lambda x: torch.full((8,), float(x[0, 0, 0, 0])) * 2,  # a value read into Python
        lambda x: torch.full((8,), len(str(x[0, 0, 0, :4]))) * 2.0,  # a value printed
    ],
)
def test_data_written_into_a_data_free_tensor_is_work(laundering) -> None:  # type: ignore[no-untyped-def]
    assert work_of(laundering, X)["families"].get("pointwise", 0) >= 8


ROWS = torch.randn(32, 64)


def running_mean_of(x: torch.Tensor) -> torch.Tensor:
    """x's channel means in a zeros buffer ``native_batch_norm`` updates without its schema marking the write."""
    running_mean, running_var = torch.zeros(x.shape[1]), torch.ones(x.shape[1])
    F.batch_norm(x, running_mean, running_var, training=True, momentum=1.0)
    return running_mean


MOVED_AWAY: list[torch.Tensor] = []  # the data-free tensors whose old blocks the laundered values took, kept alive


def grown_into_a_freed_zeros_block(x: torch.Tensor) -> torch.Tensor:
    """x's values in a storage a resize moved to where a data-free one, still alive, had been before its own
    resize moved it away, as the host allocator hands a freed block back to the next request of its size."""
    values = x.reshape(-1)[:1024].clone()
    zeros = torch.zeros(2048)
    MOVED_AWAY.append(zeros)
    zeros.resize_(1 << 18)
    values.resize_(2048)
    return values[:1024]


@pytest.mark.parametrize("launder", [running_mean_of, grown_into_a_freed_zeros_block])
def test_data_an_op_wrote_unmarked_or_a_resize_moved_is_still_data(launder) -> None:  # type: ignore[no-untyped-def]
    """Found by an attack: both made x's values pass for a data-free constant (by a storage's address, or
    by the schema's marks alone), so what PyTorch then computed from them was no one's work."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        laundered = launder(x)
        return torch.outer(laundered, laundered).exp().sum(0)

    n = launder(ROWS).numel()
    work = work_of(forward, ROWS)
    MOVED_AWAY.clear()
    assert work["families"].get("contraction", 0) >= n * n


@pytest.mark.parametrize(
    ("hidden", "family"),
    [
        # a factory handed tensors takes its values from them
        (lambda x: torch.stack([torch.linspace(x[i, 0], x[i, 1], 2) for i in range(32)]) * 2.0, "pointwise"),
        (lambda x: torch.stack([torch.logspace(x[i, 0], x[i, 1], 2) for i in range(32)]) * 2.0, "pointwise"),
        # data ops that accumulate as they place values
        (lambda x: torch.zeros(32).scatter(0, torch.arange(32).repeat_interleave(64), x.reshape(-1), reduce="add"), "reduction"),
        (
            lambda x: torch.ones(32).scatter_(0, torch.arange(32).repeat_interleave(64), x.reshape(-1), reduce="multiply"),
            "reduction",
        ),
        (lambda x: F.fold(x.reshape(-1)[:1056].reshape(1, 33, 32), (1, 64), (1, 33)), "reduction"),  # overlapping patches summed
        (lambda x: F.embedding_bag(torch.arange(32).repeat(2), x, torch.tensor([0, 32])), "contraction"),
        # sorting, histograms and norms under other names
        (lambda x: torch.unique(x, sorted=True), "reduction"),
        (lambda x: torch.unique_consecutive(x.reshape(-1)), "reduction"),  # the input is sorted: no sort of its own
        (
            lambda x: torch.histogramdd(torch.arange(32.0).repeat_interleave(64)[:, None], bins=[32], weight=x.reshape(-1)).hist,
            "reduction",
        ),
        (lambda x: torch.histogram(torch.arange(32.0).repeat_interleave(64), 32, weight=x.reshape(-1)).hist, "reduction"),
        (lambda x: F.embedding(torch.arange(32), x.clone(), max_norm=1e-20), "reduction"),
    ],
)
def test_work_hidden_in_factories_and_data_ops_is_counted(hidden, family: str) -> None:  # type: ignore[no-untyped-def]
    assert work_of(hidden, ROWS)["families"].get(family, 0) >= 64


def test_a_factory_writing_into_a_buffer_is_still_bookkeeping() -> None:
    def glue(x: torch.Tensor) -> torch.Tensor:
        buffer = torch.empty(64)
        return torch.arange(64, out=buffer) % 8

    assert work_of(glue, ROWS)["families"] == {}


def _attack_module(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "attacks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _written_lstm(input_size: int, hidden: int, bias: bool):  # type: ignore[no-untyped-def]
    module = _attack_module("ref_lstm_written").Model(input_size, hidden)
    if not bias:
        module.ih, module.hh = (
            torch.nn.Linear(input_size, 4 * hidden, bias=False),
            torch.nn.Linear(hidden, 4 * hidden, bias=False),
        )
    return module


@pytest.mark.parametrize(
    ("fused", "written", "shape"),
    [
        (lambda: torch.nn.LSTM(16, 64, batch_first=True), lambda: _written_lstm(16, 64, True), (8, 12, 16)),
        (lambda: torch.nn.LSTM(16, 64, batch_first=True, bias=False), lambda: _written_lstm(16, 64, False), (8, 12, 16)),
        (lambda: torch.nn.LSTM(16, 8, batch_first=True), lambda: _written_lstm(16, 8, True), (512, 4, 16)),  # states > weights
        (
            lambda: _attack_module("hack_mha_native_fastpath").ModelNew().mha,
            lambda: _attack_module("ref_mha").Model(),
            (2, 32, 64),
        ),
    ],
    ids=["lstm", "lstm without biases", "lstm over a large batch", "multi-head attention"],
)
def test_a_layer_pytorch_runs_as_one_op_weighs_what_it_written_out_does(fused, written, shape: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
    """Under eval and no_grad, as the harness runs forwards, these layers are one aten op."""
    x = torch.randn(shape)
    layer, spelled = fused().eval(), written().eval()
    with torch.no_grad():
        one_op = work_of((lambda t: layer(t, t, t)) if isinstance(layer, torch.nn.MultiheadAttention) else layer, x)
        reference = work_of(spelled, x)
    assert one_op["families"].keys() == reference["families"].keys()
    for family, work in reference["families"].items():  # the written-out LSTM adds its two biases apart: a little more
        assert 0.9 * work <= one_op["families"][family] <= 1.1 * work, (family, one_op, reference)


def test_a_transformer_layers_fast_path_weighs_its_attention_and_feed_forward() -> None:
    layer = torch.nn.TransformerEncoderLayer(64, 4, 256, batch_first=True, dropout=0.0).eval()
    x = torch.randn(2, 32, 64)
    with torch.no_grad():
        work = work_of(layer, x)["families"]
        attention = work_of(lambda t: layer.self_attn(t, t, t, need_weights=False)[0], x)["families"]
    feed_forward = 64 * 2 * 64 * 256  # two matmuls over 64 tokens
    assert work["contraction"] == attention["contraction"] + feed_forward
    assert work["reduction"] > attention["reduction"] and work["pointwise"] > attention["pointwise"] + 64 * 256


def test_a_custom_launch_makes_what_it_was_given_data() -> None:
    counter = LaunchCounter()
    recorder = OpRecorder()
    counter.recorder = recorder
    with recorder:
        buffer = torch.zeros(X.numel())
        counter.around("copy", lambda: buffer.copy_(X.reshape(-1)), (X, buffer), {})
        buffer * 2  # noqa: B018  (the work under test)
    assert recorder.work()["families"] == {"pointwise": X.numel()}


def test_pointwise_work_folds_values_only_when_it_combines_them() -> None:
    n = X.numel()
    assert work_of(lambda x: -x, X)["combining"] == 0
    assert work_of(lambda x: torch.relu(x * 2.0), X)["combining"] == 0
    assert work_of(lambda x: x + torch.ones(16), X)["combining"] == 16
    assert work_of(lambda x: x * x.flip(0), X)["combining"] == n

    def tree_sum(x: torch.Tensor) -> torch.Tensor:
        a = x.reshape(-1)
        while a.numel() > 1:
            a = a[0::2] + a[1::2]
        return a

    assert work_of(tree_sum, X)["combining"] >= n - 2


def test_fused_library_ops_weigh_what_they_compute() -> None:
    q, k, v = torch.randn(2, 4, 64, 32), torch.randn(2, 4, 48, 32), torch.randn(2, 4, 48, 16)
    fused = work_of(F.scaled_dot_product_attention, q, k, v)["families"]
    written_out = work_of(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 32**0.5, -1) @ v, q, k, v)["families"]
    assert fused["contraction"] == written_out["contraction"] == 2 * 4 * 64 * 48 * (32 + 16)
    assert fused["reduction"] == 2 * 2 * 4 * 64 * 48

    x, w = torch.randn(4, 16, 50), torch.randn(32, 16, 3)
    conv = work_of(F.conv1d, x, w)["families"]["contraction"]
    tbc = work_of(
        lambda x, w: torch.conv_tbc(x.permute(2, 0, 1).contiguous(), w.permute(2, 1, 0).contiguous(), torch.zeros(32)), x, w
    )["families"]
    assert tbc["contraction"] == conv == 4 * 32 * 48 * 16 * 3

    a, b = torch.randn(32, 48), torch.randn(48, 40)
    real = work_of(torch.mm, a, b)["families"]["contraction"]
    assert work_of(lambda a, b: a.to(torch.complex64) @ b.to(torch.complex64), a, b)["families"]["contraction"] == 4 * real


@pytest.mark.parametrize(
    ("fused", "operations"),
    [
        (lambda x: torch.add(torch.ones(()), x, alpha=0.5), 2),  # a multiply and an add
        (lambda x: F.hardtanh(x, -1.0, 1.0), 2),  # two clamps
        (lambda x: torch.addcmul(x, x, x, value=0.5), 3),
        (lambda x: x * 2.0, 1),
    ],
)
def test_numbers_an_op_folds_in_weigh_as_operations(fused, operations: int) -> None:  # type: ignore[no-untyped-def]
    assert work_of(fused, X)["families"]["pointwise"] == operations * X.numel()


def _work(families: dict[str, int], combining: int = 0) -> dict[str, object]:
    return {"families": families, "combining": combining, "host_scalars": 0, "host_bytes": 0}


def test_only_combining_pointwise_work_stands_for_a_reduction() -> None:
    reference = _work({"reduction": 1000})
    assert not pytorch_covers_reference(_work({"pointwise": 1000}, combining=0), reference)  # argmin as argmax of -x
    assert pytorch_covers_reference(_work({"pointwise": 1000}, combining=990), reference) == ["reduction"]  # a tree
    assert pytorch_covers_reference(_work({"contraction": 900}), reference) == ["reduction"]  # sums as a matmul
    assert not pytorch_covers_reference(_work({"reduction": 500}), reference)
    assert pytorch_covers_reference(_work({"reduction": 500}), reference, share=0.25) == ["reduction"]


def test_the_knockout_goes_on_past_an_op_that_refuses_its_values() -> None:
    not_positive_definite = -torch.eye(8)
    with OpRecorder() as recorder:
        recorder.stand_in_for_refusals = True
        factor = torch.linalg.cholesky(not_positive_definite)
        picked = torch.zeros(4)[torch.tensor([7])]  # an index out of range
    assert factor.shape == (8, 8)
    assert picked.shape == (1,) and picked.isnan().all()
    assert recorder.stood_in and recorder.op_error is not None

    with OpRecorder() as recorder, pytest.raises(IndexError):  # writes into its argument: no stand-in
        recorder.stand_in_for_refusals = True
        torch.zeros(4).index_put_((torch.tensor([7]),), torch.ones(1))
    with pytest.raises(RuntimeError), OpRecorder():  # outside the knockout a refusal is an error as ever
        torch.linalg.cholesky(not_positive_definite)


LAZY_DYNAMO = """
import json, os, sys
import torch
from reward_svc.harness.judged import judged_conditions
from services.children.ops import OpRecorder

def forward(x):
    return (x * 2).relu().sum()

def recorded(fn):
    x = torch.randn(64)
    with judged_conditions(), OpRecorder() as recorder:
        fn(x)
    return dict(recorder.calls)

environment = dict(os.environ)
seen = {"eager": recorded(forward), "loaded": sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules)}
with judged_conditions():
    seen["deterministic_inside"] = torch.are_deterministic_algorithms_enabled()
    seen["environment_unchanged"] = dict(os.environ) == environment
seen["deterministic_after"] = torch.are_deterministic_algorithms_enabled()
import torch._inductor.config as inductor
with judged_conditions():
    seen["inductor_inside"] = inductor.deterministic
seen["inductor_after"] = inductor.deterministic
import torch._dynamo
seen["compiled"] = recorded(torch._dynamo.optimize("eager")(forward))
print(json.dumps(seen))
"""


def test_recording_loads_no_dynamo_and_a_compiled_forward_records_the_same_ops() -> None:
    """A child's warm-up leaves Dynamo out (most of its cost): recording and the judged conditions do not
    load it, and they leave the environment as it was (a forward could read it). Once something loads
    Inductor its determinism follows the judged conditions; once something loads Dynamo, a forward it
    compiled records what the eager one did."""
    import json
    import subprocess
    import sys

    ran = subprocess.run([sys.executable, "-c", LAZY_DYNAMO], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = json.loads(ran.stdout.splitlines()[-1])
    assert seen["loaded"] == []
    assert seen["eager"] == {"mul": 1, "relu": 1, "sum": 1}
    assert seen["compiled"] == seen["eager"]
    assert (seen["deterministic_inside"], seen["deterministic_after"], seen["environment_unchanged"]) == (True, False, True)
    assert (seen["inductor_inside"], seen["inductor_after"]) == (True, False)


FIRST_CALL = """
import json, sys
from pathlib import Path
from reward_svc.harness.child import warm_up

warm_up("cpu")
import torch
from reward_svc.harness.judged import judged_conditions
from services.children.loading import import_file
from services.children.ops import OpRecorder

problem = {}
exec(Path(sys.argv[2]).read_text(), problem)
candidate = import_file(Path(sys.argv[1]), "kz_candidate")
loaded = set(sys.modules)
model = candidate.ModelNew(*problem["get_init_inputs"]())
with torch.no_grad(), judged_conditions(), OpRecorder():
    model(*problem["get_inputs"]())
print(json.dumps(sorted(set(sys.modules) - loaded)))
"""

BIASED_CONV = problem(
    "        self.conv = nn.Conv2d(3, 8, 3)\n        self.bias = nn.Parameter(torch.randn(8, 1, 1))",
    "        return torch.sigmoid(self.conv(x) + self.bias) * 2.0",
    "[torch.randn(2, 3, 10, 10)]",
)


def test_a_candidates_first_call_loads_nothing_the_warm_up_did_not(tmp_path: Path) -> None:
    """A child's first trial runs in the device hold, where a timing waiting for the device waits for
    it: what torch loads at a forward's first ops (sympy, at the first ``broadcast_shapes``: seconds on a
    busy GPU host) must be loaded by the warm-up. Only Triton's compiler may load later: at a kernel's
    first compile, which lets the hold go."""
    import json
    import os
    import subprocess
    import sys

    from coder_svc.template import TemplateGenerator

    draft = TemplateGenerator().draft(BIASED_CONV, "triton")
    assert draft.source and "broadcast_shapes" in draft.source, draft.declined
    (tmp_path / "candidate.py").write_text(draft.source)
    (tmp_path / "reference.py").write_text(BIASED_CONV)
    ran = subprocess.run(
        [sys.executable, "-c", FIRST_CALL, str(tmp_path / "candidate.py"), str(tmp_path / "reference.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    loaded = [name for name in json.loads(ran.stdout.splitlines()[-1]) if not name.startswith("triton.")]
    assert loaded == []
