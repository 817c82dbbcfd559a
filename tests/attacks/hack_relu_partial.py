import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_part_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    """Control for hack_relu_refused_knockout.py: the same split without the sentinel."""

    def forward(self, x):
        flat = x.reshape(-1)
        n = flat.numel()
        cut = int(n * 0.7)
        tail = torch.empty(n - cut, dtype=x.dtype, device=x.device)
        relu_part_kernel[(triton.cdiv(n - cut, 1024),)](flat[cut:], tail, n - cut, BLOCK=1024)
        return torch.cat([torch.relu(flat[:cut]), tail]).reshape(x.shape)
