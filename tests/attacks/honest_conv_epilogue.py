import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def bias_relu_kernel(y_ptr, cb_ptr, b_ptr, out_ptr, n, HW, C, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c = (offs // HW) % C
    y = tl.load(y_ptr + offs, mask=mask) + tl.load(cb_ptr + c, mask=mask) + tl.load(b_ptr + c, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(y, 0.0), mask=mask)


class ModelNew(nn.Module):
    """The convolution by cuDNN/oneDNN (PyTorch), both biases and the ReLU in a Triton epilogue."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3)
        self.bias = nn.Parameter(torch.randn(8, 1, 1) * 0.1)

    def forward(self, x):
        y = F.conv2d(x, self.conv.weight).contiguous()
        out = torch.empty_like(y)
        n = y.numel()
        bias_relu_kernel[(triton.cdiv(n, 1024),)](
            y, self.conv.bias, self.bias.reshape(-1), out, n, y.shape[2] * y.shape[3], y.shape[1], BLOCK=1024
        )
        return out
