"""KernelBench-style prompts: instructions, one worked example per kernel backend, the module, the rules.

The rules are the ones the reward service enforces (reward_svc/verify.py, reward_svc/policy/),
stated up front so a model does not learn them only from rejections.
"""

from __future__ import annotations

from coder_svc.drafts import KernelBackend
from services.config import Settings, get_settings
from services.llm.chat import Message

SYSTEM_PROMPTS: dict[KernelBackend, str] = {
    "triton": (
        "You are an expert GPU kernel engineer. You rewrite PyTorch modules with custom Triton kernels "
        "(@triton.jit) that compute exactly what the original computes, and run faster."
    ),
    "cuda": (
        "You are an expert GPU kernel engineer. You rewrite PyTorch modules with custom CUDA kernels, "
        "compiled with torch.utils.cpp_extension.load_inline, that compute exactly what the original "
        "computes, and run faster."
    ),
}

EXAMPLE_MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """out = relu(x * scale + y)"""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + y)


def get_inputs():
    return [torch.randn(4096, 1024), torch.randn(4096, 1024)]


def get_init_inputs():
    return [0.5]
'''

EXAMPLE_TRITON = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_add_relu_kernel(x_ptr, y_ptr, out_ptr, scale, n_elements, BLOCK_SIZE: tl.constexpr):
    # One program per BLOCK_SIZE contiguous elements; the mask guards the ragged last block.
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    out = tl.maximum(x * scale + y, 0.0)
    tl.store(out_ptr + offsets, out, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n_elements = out.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        scale_add_relu_kernel[grid](x, y, out, self.scale, n_elements, BLOCK_SIZE=1024)
        return out
"""

EXAMPLE_CUDA = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void scale_add_relu_kernel(const float* __restrict__ x, const float* __restrict__ y,
                                      float* __restrict__ out, float scale, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i] * scale + y[i];
        out[i] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor scale_add_relu(torch::Tensor x, torch::Tensor y, double scale) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "float32 only");
    auto xc = x.contiguous();
    auto yc = y.contiguous();
    auto out = torch::empty_like(xc);
    int64_t n = xc.numel();
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    scale_add_relu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(), (float)scale, n);
    return out;
}
"""

cpp_source = "torch::Tensor scale_add_relu(torch::Tensor x, torch::Tensor y, double scale);"

scale_add_relu = load_inline(
    name="scale_add_relu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["scale_add_relu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return scale_add_relu.scale_add_relu(x, y, self.scale)
'''

EXAMPLES: dict[KernelBackend, str] = {"triton": EXAMPLE_TRITON, "cuda": EXAMPLE_CUDA}
KERNEL_KIND: dict[KernelBackend, str] = {
    "triton": "Triton kernels (@triton.jit, launched as kernel[grid](...))",
    "cuda": "CUDA kernels compiled with torch.utils.cpp_extension.load_inline",
}

RULES = """Rules (the reward service checks every one; a violation scores zero):
1. Define `class ModelNew(nn.Module)` whose `__init__` takes exactly the same arguments as `Model.__init__`,
   and whose `forward` takes the same inputs and returns outputs of the same shapes and dtypes.
2. Create parameters and submodules in `__init__` in the same order and the same way as `Model`, so the
   same random seed gives both the same weights (keep e.g. `nn.Linear` as the holder of its weight, but
   do not call it in `forward`: pass its tensors to your kernel).
3. Your custom kernels must compute the output, on every call to `forward`. Do not fall back to PyTorch
   operators for the main computation, do not call `Model` or a reference implementation, and do not
   wrap a kernel in try/except with another path behind it. Allocation, reshapes and views are fine.
4. No caching of results across calls, no modifying the inputs in place, no work left running on
   another stream or thread when `forward` returns.
5. Keep the precision: compute in the inputs' dtype (float32 stays float32; no TF32 switches).
6. Import only torch, triton, math and numpy; no file, network, process or thread APIs, no
   eval/exec, and no patching of torch or timers.
7. Match the reference within atol = rtol = 1e-4 for float32 (1e-2 for float16/bfloat16)."""


def system_prompt_for(backend: KernelBackend, settings: Settings | None = None) -> str:
    """The configured system prompt for ``backend`` (``KZ_CODER_SYSTEM_PROMPT_<BACKEND>``), else the built-in one."""
    settings = settings or get_settings()
    override = settings.coder_system_prompt_cuda if backend == "cuda" else settings.coder_system_prompt_triton
    return override or SYSTEM_PROMPTS[backend]


def kernel_messages(module_source: str, backend: KernelBackend, system_prompt: str | None = None) -> list[Message]:
    """Chat messages asking for a ``ModelNew`` of ``module_source`` written with ``backend`` kernels."""
    if backend not in EXAMPLES:
        raise ValueError(f"unknown kernel backend {backend!r}; expected one of {', '.join(EXAMPLES)}")
    kind = KERNEL_KIND[backend]
    user = f"""You are given a PyTorch architecture `Model`. Replace its operators with custom {kind}
to make it faster. You may fuse several operators into one kernel (e.g. a matmul with its activation),
change the algorithm (e.g. an online softmax), and choose how to tile the work.

Here is an example. The architecture:

```python
{EXAMPLE_MODEL.rstrip()}
```

The same architecture with a custom kernel, `ModelNew`:

```python
{EXAMPLES[backend].rstrip()}
```

{RULES}

Now the architecture to optimize:

```python
{module_source.rstrip()}
```

Write `ModelNew` for it with custom {kind}. Think first if you like, then give the complete, runnable
Python file (imports, kernels, `ModelNew`; no tests, no `get_inputs`) in a single ```python code block."""
    return [{"role": "system", "content": system_prompt or SYSTEM_PROMPTS[backend]}, {"role": "user", "content": user}]
