"""reward_svc.compile: the fast, cached load_inline drop-in.

Fast tests use sources without torch headers (nvcc or g++ in about a second); the ones marked
slow run real compiles of torch-header sources (tens of seconds on a 2-core machine).
"""

from __future__ import annotations

import dataclasses
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension as cpp_extension

from cuda_cases import ELEMENTWISE_ADD_CPP as KB_CPP
from cuda_cases import ELEMENTWISE_ADD_CUDA as KB_CUDA
from reward_svc import compile as kzc

PLAIN_CUDA = "__global__ void scale(float* x, float s) { x[threadIdx.x] *= s; }\n"
needs_nvcc = pytest.mark.skipif(kzc._nvcc(kzc._cuda_home(cpp_extension)) is None, reason="nvcc not installed")


@pytest.fixture(autouse=True)
def restore_load_inline():
    """Each test installs the drop-in; put torch's own back afterwards."""
    original = cpp_extension.load_inline
    yield
    cpp_extension.load_inline = original


def kb_request(**overrides) -> kzc.InlineRequest:
    args = dict(
        name="elementwise_add",
        cpp_sources=KB_CPP,
        cuda_sources=KB_CUDA,
        functions=["elementwise_add_cuda"],
        extra_cflags=[""],
        extra_ldflags=[""],
    )
    args.update(overrides)
    return kzc.make_request(**args)


def test_install_replaces_load_inline_for_later_imports(tmp_path: Path) -> None:
    torch_own = cpp_extension.load_inline
    kzc.install_fast_load_inline(tmp_path, compile_only=True)
    from torch.utils.cpp_extension import load_inline

    assert load_inline is cpp_extension.load_inline is not torch_own
    kzc.install_fast_load_inline(tmp_path, compile_only=True)
    assert cpp_extension.load_inline._kz_original is torch_own  # reinstalling never wraps the drop-in


def test_arguments_from_a_newer_torch_go_to_torchs_own_load_inline(tmp_path: Path) -> None:
    kzc.install_fast_load_inline(tmp_path, compile_only=True)
    with pytest.raises(TypeError, match="unexpected keyword"):  # torch 2.13 itself rejects it
        cpp_extension.load_inline(name="newer", cpp_sources="", extra_cuda_dlink_cflags=["-dlto"])


def test_cache_key_changes_with_source_and_flags_and_not_otherwise(tmp_path: Path) -> None:
    builder = kzc.Builder(tmp_path, compile_only=True)
    key = builder.content_hash(kb_request())
    assert builder.content_hash(kb_request()) == key
    assert builder.content_hash(kb_request(extra_cflags=None, extra_ldflags=[])) == key  # empty flags are no flags
    assert builder.content_hash(kb_request(cuda_sources=KB_CUDA + "\n// edit")) != key
    assert builder.content_hash(kb_request(cpp_sources=KB_CPP + " ")) != key
    assert builder.content_hash(kb_request(extra_cuda_cflags=["-O3"])) != key
    assert builder.content_hash(kb_request(extra_cflags=["-O3"])) != key
    assert builder.content_hash(kb_request(functions={"elementwise_add_cuda": "doc"})) != key
    assert kzc.Builder(tmp_path, compile_only=True, arch="sm_80").content_hash(kb_request()) != key
    assert kzc.Builder(tmp_path, compile_only=False, arch="sm_90").content_hash(kb_request()) != key


def test_tiers_swap_umbrella_headers_in_place(tmp_path: Path) -> None:
    request = kb_request()
    toolchain = kzc.Builder(tmp_path, compile_only=True).toolchain
    original, minimal = kzc.cuda_unit(request, "original"), kzc.cuda_unit(request, "minimal")
    assert "torch/extension.h>\n" in original and '#include "kz_cuda.h"' in minimal
    assert len(minimal.splitlines()) == len(original.splitlines())  # diagnostics keep their line numbers
    assert not [line for line in minimal.splitlines() if line.startswith("#include <torch/")]
    header = kzc.prelude(request, toolchain, "minimal", bindings=False)
    assert "#include <ATen/ops/zeros_like.h>" in header and "constexpr auto kFloat32" in header
    assert "pybind" not in header and "ATen/Functions.h" not in header
    assert "#include <torch/csrc/utils/pybind.h>" in kzc.prelude(request, toolchain, "minimal", bindings=True)
    assert kzc.prelude(request, toolchain, "light", bindings=False).count("#include") == 1


def test_minimal_tier_screens_names_that_resolve_differently(tmp_path: Path) -> None:
    toolchain = kzc.Builder(tmp_path, compile_only=True).toolchain
    assert kzc.choose_plan(kb_request(), toolchain).cuda_tiers == ("lean", "minimal", "original")
    risky = kb_request(cuda_sources=KB_CUDA.replace("torch::zeros_like(a)", "torch::tensor({1.0f})"))
    assert kzc.choose_plan(risky, toolchain).cuda_tiers == ("light", "original")
    # words of a message or a comment are not names (a check's "must be a CUDA tensor" cost the light tier, 4x slower)
    said = 'TORCH_CHECK(a.is_cuda(), "a must be a CUDA tensor, not from_blob"); // requires_grad\n    auto size'
    assert kzc.choose_plan(kb_request(cuda_sources=KB_CUDA.replace("auto size", said)), toolchain).cuda_tiers[0] == "lean"
    # nor is a variable named after a screened factory; calling one is, and naming torch's anywhere
    named = kb_request(cuda_sources=KB_CUDA.replace("torch::Tensor a,", "torch::Tensor tensor, torch::Tensor a,"))
    assert kzc.choose_plan(named, toolchain).cuda_tiers[0] == "lean"
    for use in ("torch::from_blob (a.data_ptr(), {size})", "(torch :: tensor)({1.5})", "MAKE({1.5})"):
        called = kb_request(cuda_sources="#define MAKE torch::tensor\n" + KB_CUDA.replace("torch::zeros_like(a)", use))
        assert kzc.choose_plan(called, toolchain).cuda_tiers == ("light", "original"), use
    # a digit separator opens no character literal, a raw string hides no code after it
    assert {"system", "tensor"} <= kzc._identifiers("int a = 1'000; system(); auto r = R\"x(')x\"; tensor(); int b = 2'0;")


def test_lean_tier_leaves_out_the_operators_context_and_screens_what_only_the_context_declares(tmp_path: Path) -> None:
    toolchain = kzc.Builder(tmp_path, compile_only=True).toolchain
    lean = kzc.lean_operator_header(toolchain.torch_include, "zeros_like")
    stock = kzc.operator_header(toolchain.torch_include, "zeros_like").read_text()
    assert all(f"<{h}>" in stock and f"<{h}>" not in lean for h in kzc.OPERATOR_CONTEXT_HEADERS)
    assert "#include <ATen/ops/zeros_like_ops.h>" in lean and "inline at::Tensor zeros_like(" in lean
    include_dir = kzc.write_lean_headers(kb_request(), toolchain, tmp_path)
    assert (include_dir / "ATen" / "ops" / "zeros_like.h").read_text() == lean
    # the lean prelude differs from the minimal one, so a failed lean attempt is followed by a minimal one
    assert kzc.prelude(kb_request(), toolchain, "lean", bindings=False) != kzc.prelude(
        kb_request(), toolchain, "minimal", bindings=False
    )

    # What the context headers declare (the runtime around an operator), through whatever they include.
    for context_use in (
        "const at::OptionalDeviceGuard guard(at::device_of(a));",
        "at::globalContext().setDeterministicAlgorithms(true, false);",
        'at::checkAllSameGPU(__func__, {at::TensorArg(a, "a", 1)});',
        "c10::StreamGuard guard(c10::Stream(c10::Stream::DEFAULT, a.device()));",
    ):
        request = kb_request(cuda_sources=KB_CUDA.replace("auto size = a.numel();", f"auto size = a.numel(); {context_use}"))
        assert kzc.choose_plan(request, toolchain).cuda_tiers == ("minimal", "original"), context_use
    # One screen for every source, worked out before the job: torch generates operator headers from one template.
    includes = kzc.operator_includes(toolchain.torch_include, ["zeros_like"])
    assert kzc.OPERATOR_CONTEXT_HEADERS < includes == kzc.operator_includes(toolchain.torch_include, ["add", "relu", "matmul"])
    kzc.context_only_names.cache_clear()
    kzc.warm_header_screen()
    assert kzc.lean_tier_allowed(kb_request(), toolchain) and kzc.context_only_names.cache_info()[:2] == (1, 1)  # a hit
    # What kernels name all the time stays lean.
    everyday = "size_t void int float bool Tensor TORCH_CHECK data_ptr numel size stream blockIdx at torch c10 std dtype device"
    assert not set(everyday.split()) & kzc.context_only_names(toolchain.torch_include, frozenset(kzc.OPERATOR_CONTEXT_HEADERS))


@needs_nvcc
def test_syntax_error_raises_compile_error_with_nvcc_message_and_is_cached(tmp_path: Path) -> None:
    log = kzc.install_fast_load_inline(tmp_path, compile_only=True)
    broken = "__global__ void scale(float* x, float s) { x[threadIdx.x] *= s }\n"
    for _ in range(2):
        with pytest.raises(kzc.CompileError) as caught:
            cpp_extension.load_inline(name="broken", cpp_sources="", cuda_sources=broken, no_implicit_headers=True)
        assert 'expected a ";"' in caught.value.stderr_tail and "cuda.cu" in str(caught.value)
    first, second = log.entries
    assert not first.ok and not first.cache_hit and 'expected a ";"' in first.stderr_tail
    assert not second.ok and second.cache_hit and second.content_hash == first.content_hash


@needs_nvcc
def test_second_call_is_a_logged_cache_hit(tmp_path: Path) -> None:
    log = kzc.install_fast_load_inline(tmp_path, compile_only=True)
    kwargs = dict(name="plain", cpp_sources="", cuda_sources=PLAIN_CUDA, no_implicit_headers=True)
    module = cpp_extension.load_inline(**kwargs)
    with pytest.raises(RuntimeError, match="compiled only: no GPU here"):
        module.scale_launch()
    cpp_extension.load_inline(**kwargs)
    miss, hit = log.entries
    assert miss.ok and not miss.cache_hit and "cu:" in miss.strategy and "parallel" in miss.strategy
    assert hit.ok and hit.cache_hit and hit.content_hash == miss.content_hash and hit.seconds < 0.5
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("_")] == [miss.content_hash]


def test_concurrent_builds_of_one_hash_publish_once(tmp_path: Path) -> None:
    request = kzc.make_request("same", "int answer() { return 42; }", no_implicit_headers=True)
    builders = [kzc.Builder(tmp_path, compile_only=True) for _ in range(3)]
    threads = [threading.Thread(target=b.load, args=(request,)) for b in builders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    entries = [b.log.entries[0] for b in builders]
    assert all(e.ok for e in entries) and len({e.content_hash for e in entries}) == 1
    published = [p.name for p in tmp_path.iterdir() if not p.name.startswith("_")]
    assert published == [entries[0].content_hash]  # one entry, no temporary directories left


def test_compiled_only_stand_in_for_candidate_bindings() -> None:
    module = kzc.CompiledOnlyModule("own_bindings", [])
    with pytest.raises(RuntimeError, match="compiled only: no GPU here"):
        module.anything(1)
    with pytest.raises(AttributeError):
        _ = module.__wrapped__


@pytest.mark.slow
@needs_nvcc
def test_kernelbench_source_compiles_only_with_real_nvcc(tmp_path: Path) -> None:
    log = kzc.install_fast_load_inline(tmp_path, compile_only=True)
    from torch.utils.cpp_extension import load_inline

    module = load_inline(
        name="elementwise_add",
        cpp_sources=KB_CPP,
        cuda_sources=KB_CUDA,
        functions=["elementwise_add_cuda"],
        verbose=True,
        extra_cflags=[""],
        extra_ldflags=[""],
    )
    (entry,) = log.entries
    assert entry.ok and not entry.cache_hit, entry.stderr_tail
    assert entry.strategy.startswith("cpp:lean(") and " cu:lean(" in entry.strategy and "failed" not in entry.strategy
    with pytest.raises(RuntimeError, match="compiled only: no GPU here"):
        module.elementwise_add_cuda(torch.ones(4), torch.ones(4))


@pytest.mark.slow
def test_light_tier_failure_falls_back_to_the_candidates_headers(tmp_path: Path) -> None:
    # at::globalContext lives in ATen/Context.h: in ATen/ATen.h, not in the minimal prelude.
    source = "#include <ATen/ATen.h>\nbool deterministic() { return at::globalContext().deterministicAlgorithms(); }\n"
    builder = kzc.Builder(tmp_path, compile_only=True)
    builder.load(kzc.make_request("fallback", source, no_implicit_headers=True))
    (entry,) = builder.log.entries
    assert entry.ok, entry.stderr_tail
    assert entry.strategy.startswith("cpp:minimal(") and "failed)>original(" in entry.strategy


def test_a_build_finds_what_a_read_only_layer_holds_and_builds_what_it_lacks_beside_it(tmp_path: Path) -> None:
    """A source's published build is read-only to the child evaluating it again: a load_inline that misses
    there (another name, another machine's arch) builds in the child's own directory, not in the layer."""
    first, second = (kzc.make_request(name, "int answer() { return 42; }", no_implicit_headers=True) for name in ("a", "b"))
    kzc.Builder(tmp_path / "published", compile_only=True).load(first)
    published = sorted(p.name for p in (tmp_path / "published").iterdir())
    builder = kzc.Builder(tmp_path / "own", compile_only=True, layers=[tmp_path / "published"])
    builder.load(first)
    builder.load(second)
    hit, miss = builder.log.entries
    assert hit.cache_hit and not miss.cache_hit and miss.ok
    assert sorted(p.name for p in (tmp_path / "published").iterdir()) == published  # the layer unchanged
    assert (tmp_path / "own" / miss.content_hash / "meta.json").is_file()


def test_the_bindings_header_is_keyed_on_the_torch_it_was_built_for(tmp_path: Path) -> None:
    toolchain = kzc.Builder(tmp_path, compile_only=True).toolchain
    key = kzc.pch_key(kb_request(), toolchain)
    assert kzc.pch_key(kb_request(name="another_name"), toolchain) == key
    assert kzc.pch_key(kb_request(), dataclasses.replace(toolchain, torch_version="2.99")) != key
    assert kzc.pch_key(kb_request(extra_cflags=["-O3"]), toolchain) != key


@pytest.mark.slow
def test_a_broken_source_is_not_compiled_at_the_minimal_tier_after_the_lean_one(tmp_path: Path) -> None:
    source = "#include <torch/extension.h>\nat::Tensor twice(at::Tensor x) { return at::zeros_like(x) + x + }\n"
    builder = kzc.Builder(tmp_path, compile_only=True)
    plan = kzc.Plan(cpp_tiers=("lean", "minimal", "original"), cuda_tiers=())
    with pytest.raises(kzc.CompileError):
        builder.load(kzc.make_request("broken", source, no_implicit_headers=True), plan)
    (entry,) = builder.log.entries
    assert entry.strategy.startswith("cpp:lean(") and "minimal" not in entry.strategy and ">original(" in entry.strategy


@pytest.mark.slow
def test_a_failed_lean_attempt_is_followed_by_the_minimal_tier(tmp_path: Path) -> None:
    # A name the screen would catch, past it by a forced plan: the lean tier lacks ATen/Context.h,
    # which the minimal tier's operator header (zeros_like) brings.
    source = "#include <torch/extension.h>\nbool deterministic(at::Tensor x) { at::zeros_like(x); return at::globalContext().deterministicAlgorithms(); }\n"
    builder = kzc.Builder(tmp_path, compile_only=True)
    plan = kzc.Plan(cpp_tiers=("lean", "minimal", "original"), cuda_tiers=())
    builder.load(kzc.make_request("lean_fallback", source, no_implicit_headers=True), plan)
    (entry,) = builder.log.entries
    assert entry.ok, entry.stderr_tail
    assert entry.strategy.startswith("cpp:lean(") and "failed)>minimal(" in entry.strategy and "original" not in entry.strategy


@pytest.mark.slow
def test_cpp_extension_links_imports_and_runs(tmp_path: Path) -> None:
    # The full path minus CUDA: minimal-tier headers, generated bindings, torch's link flags, import.
    log = kzc.install_fast_load_inline(tmp_path)
    source = 'torch::Tensor add_one(torch::Tensor x) { TORCH_CHECK(x.dim() == 1, "1-d only"); return x.add(1); }'
    module = cpp_extension.load_inline(name="add_one_ext", cpp_sources=source, functions=["add_one"])
    torch.testing.assert_close(module.add_one(torch.zeros(3)), torch.ones(3))
    with pytest.raises(RuntimeError, match="1-d only"):  # torch errors cross the binding as RuntimeError
        module.add_one(torch.zeros(2, 2))
    (entry,) = log.entries
    assert entry.strategy.startswith("cpp:lean(") and "link(" in entry.strategy
    assert (
        cpp_extension.load_inline(name="add_one_ext", cpp_sources=source, functions=["add_one"]).add_one(torch.ones(1)).item()
        == 2
    )
    assert log.entries[1].cache_hit and log.entries[1].seconds < 0.5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_compile_load_run_then_cache_hit(tmp_path: Path) -> None:
    log = kzc.install_fast_load_inline(tmp_path)
    from torch.utils.cpp_extension import load_inline

    kwargs = dict(
        name="elementwise_add",
        cpp_sources=KB_CPP,
        cuda_sources=KB_CUDA,
        functions=["elementwise_add_cuda"],
        extra_cflags=[""],
        extra_ldflags=[""],
    )
    module = load_inline(**kwargs)
    a, b = torch.randn(10_000, device="cuda"), torch.randn(10_000, device="cuda")
    torch.testing.assert_close(module.elementwise_add_cuda(a, b), a + b)
    started = time.perf_counter()
    again = load_inline(**kwargs)
    assert time.perf_counter() - started < 0.5
    miss, hit = log.entries
    assert miss.ok and not miss.cache_hit and "link(" in miss.strategy
    assert hit.cache_hit and hit.seconds < 0.5
    torch.testing.assert_close(again.elementwise_add_cuda(a, b), a + b)


@needs_nvcc
def test_nvcc_front_ends_in_parallel_match_plain_nvcc(tmp_path: Path) -> None:
    """The parallel plan is taken for a one-arch compile and yields the same kernel as nvcc -c."""
    from reward_svc import nvcc_phases

    nvcc = kzc._nvcc(kzc._cuda_home(cpp_extension))
    source = tmp_path / "cuda.cu"
    source.write_text(PLAIN_CUDA)
    cmd = [nvcc, "-gencode=arch=compute_90,code=sm_90"]
    dry = subprocess.run(
        [*cmd, "-c", str(source), "-o", str(tmp_path / "x.o"), "--dryrun", "--keep", "--keep-dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    phases = nvcc_phases.parse_dryrun(dry.stdout + dry.stderr)
    assert phases is not None and "--gen_module_id_file" not in " ".join(phases.host)
    compiled = nvcc_phases.compile_cu(cmd, source, tmp_path / "par.o", tmp_path)
    assert compiled.result.returncode == 0 and compiled.phases is not None, compiled.result.stderr
    symbols = subprocess.run(["nm", "-C", str(tmp_path / "par.o")], capture_output=True, text=True).stdout
    assert "scale(float*, float)" in symbols


@needs_nvcc
def test_nvcc_parallel_plan_reports_compile_errors_like_nvcc(tmp_path: Path) -> None:
    from reward_svc import nvcc_phases

    source = tmp_path / "broken.cu"
    source.write_text("__global__ void k(float* x) { x[0] = undefined_name; }\n")
    result, _, _ = nvcc_phases.compile_cu(
        [kzc._nvcc(kzc._cuda_home(cpp_extension)), "-gencode=arch=compute_90,code=sm_90"], source, tmp_path / "b.o", tmp_path
    )
    assert result.returncode != 0 and "undefined_name" in result.stderr


def test_unknown_nvcc_plan_shape_falls_back() -> None:
    from reward_svc.nvcc_phases import parse_dryrun

    assert parse_dryrun("#$ gcc -E a.cu\n#$ ptxas a.ptx\n") is None


@pytest.mark.slow
def test_a_precompiled_bindings_base_serves_every_extension_name_and_only_its_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (built,) = kzc.build_precompiled_headers(tmp_path / "pch", compile_only=False, bindings=[(False, ())], cuda_hosts=[])
    assert (built / f"{kzc.PCH_HEADER}.gch").is_file()
    monkeypatch.setenv(kzc.PRECOMPILED_HEADERS_ENV, str(tmp_path / "pch"))
    source = 'torch::Tensor add_one(torch::Tensor x) { TORCH_CHECK(x.dim() == 1, "1-d only"); return x.add(1); }'
    for name in ("first_ext", "second_ext"):  # the extension's name is a macro the header never sees
        log = kzc.install_fast_load_inline(tmp_path / name)
        module = cpp_extension.load_inline(name=name, cpp_sources=source, functions=["add_one"])
        torch.testing.assert_close(module.add_one(torch.zeros(3)), torch.ones(3))
        with pytest.raises(RuntimeError, match="1-d only"):
            module.add_one(torch.zeros(2, 2))
        assert log.entries[0].strategy.startswith("cpp:lean+pch("), log.entries[0].strategy
    # other host flags: no header was built for them, the unit compiles as before
    log = kzc.install_fast_load_inline(tmp_path / "flags")
    cpp_extension.load_inline(name="flags_ext", cpp_sources=source, functions=["add_one"], extra_cflags=["-O2"])
    assert log.entries[0].strategy.startswith("cpp:lean("), log.entries[0].strategy
    # a line before the prelude (a #define meant for torch's headers) must stay before them: no header ahead
    ahead = kzc.make_request("ahead", "#define KZ_BEFORE 1\n#include <torch/extension.h>\n" + source, functions=["add_one"])
    builder = kzc.Builder(tmp_path / "ahead")
    builder.load(dataclasses.replace(ahead, no_implicit_headers=True))
    assert builder.log.entries[0].ok and "+pch" not in builder.log.entries[0].strategy


def test_a_host_prefix_starts_only_host_code_that_begins_with_its_text(tmp_path: Path) -> None:
    """The probe's and the unit's host code may differ in the name of the host's anonymous namespaces alone."""
    from reward_svc.nvcc_phases import PREFIX_FLAGS, PREFIX_HEADER, PREFIX_MODULE_ID, HostPrefix

    probe, own = "_c0ffee00_7_cuda_cu_11111111", "_abad1dea_7_cuda_cu_22222222"
    prefix_text = f'#pragma GCC diagnostic ignored "-Wattributes"\nnamespace _GLOBAL__N_{probe} {{ int ignore; }}\nint a;\n'
    (tmp_path / PREFIX_HEADER).write_text(prefix_text)
    (tmp_path / f"{PREFIX_HEADER}.gch").write_bytes(b"")
    (tmp_path / PREFIX_MODULE_ID).write_text(probe + "\n")
    (tmp_path / PREFIX_FLAGS).write_text('["gcc", "-x", "c++"]')
    prefix = HostPrefix.find(tmp_path)
    assert prefix is not None and prefix.flags == ("gcc", "-x", "c++") and HostPrefix.find(tmp_path / "absent") is None
    unit = prefix_text.replace(probe, own) + f"namespace _GLOBAL__N_{own} {{ int mine; }}\n"
    device_names = f"__shadow_var(_ZN37_INTERNAL_{own}439_GLOBAL__N_{own}6ignoreE, ::_NV_ANON_NAMESPACE::ignore)"
    started = prefix.start(unit, device_names, own)
    # the prefix's diagnostic pragmas again after it (GCC 12 loads a precompiled header without their state)
    pragma = '#pragma GCC diagnostic ignored "-Wattributes"\n'
    assert started == f'#include "{prefix.header}"\n{pragma}namespace _GLOBAL__N_{probe} {{ int mine; }}\n'
    assert prefix.start(unit.replace("int a;", "int b;"), "", own) is None  # another beginning
    assert prefix.start(unit, f"(void)&_GLOBAL__N_{own}::mine;", own) is None  # the stub names the namespace
    assert prefix.start(unit + f'const char* s = "_INTERNAL_{own}";\n', "", own) is None  # the id in another form
    # a unit naming the probe's id itself would join the renamed namespaces
    assert prefix.start(unit + f"namespace _GLOBAL__N_{probe} {{ int pick(int); }}\n", "", own) is None
    assert prefix.start(unit, f"/* {probe} */", own) is None


@pytest.mark.slow
@needs_nvcc
def test_a_cuda_unit_starts_from_the_precompiled_host_prefix_and_compiles_to_the_same_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the probe's prefix precompiled, the final host compile of a unit that begins with it starts from it and
    yields the same machine code and symbols (its anonymous namespaces, a kernel's among them, under the probe's
    id); a unit with flags no prefix was built for compiles from its own text."""
    root = tmp_path / "headers"
    (built,) = kzc.build_precompiled_headers(root, compile_only=True, bindings=[], cuda_hosts=[()])
    assert built.name.startswith("cuda-host-")
    toolchain = kzc.detect_toolchain(tmp_path, compile_only=True, arch=None)
    anonymous = KB_CUDA.replace("__global__ void", "namespace { __global__ void", 1).replace(
        "\ntorch::Tensor", "}\ntorch::Tensor", 1
    )

    def compile_cu(request: kzc.InlineRequest, name: str, *, with_headers: bool) -> tuple[kzc.Attempt, str]:
        if with_headers:
            monkeypatch.setenv(kzc.PRECOMPILED_HEADERS_ENV, str(root))
        else:
            monkeypatch.delenv(kzc.PRECOMPILED_HEADERS_ENV, raising=False)
        work = tmp_path / name
        work.mkdir()
        attempt = kzc.compile_unit(request, toolchain, "lean", work, cuda=True)
        assert attempt.ok, attempt.stderr
        listing = "".join(
            subprocess.run([*tool, str(work / "cu.o")], capture_output=True, text=True, check=True).stdout
            for tool in (["objdump", "-d", "--no-show-raw-insn"], ["nm"])
        )
        for module_id in [p.read_text().strip() for p in [*work.glob("*/nvcc-keep/*.module_id"), built / "module_id"]]:
            listing = listing.replace(module_id, "<module id>")
        return attempt, listing.replace(str(work), "<work>")

    plain, plain_code = compile_cu(kb_request(cuda_sources=anonymous), "plain", with_headers=False)
    prefixed, prefixed_code = compile_cu(kb_request(cuda_sources=anonymous), "prefixed", with_headers=True)
    assert not plain.pch and prefixed.pch and prefixed.describe().startswith("lean+pch(")
    assert "<module id>" in prefixed_code and plain_code == prefixed_code
    other_flags, _ = compile_cu(kb_request(extra_cuda_cflags=["-O2"]), "o2", with_headers=True)
    assert not other_flags.pch
