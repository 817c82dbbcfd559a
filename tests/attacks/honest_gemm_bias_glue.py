import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    m = tl.program_id(0) * BM + tl.arange(0, BM)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + m[:, None] * K + k[None, :], mask=(m[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + k[:, None] * N + n[None, :], mask=(k[:, None] < K) & (n[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")  # a broadcast product summed compiles to a TF32 dot on the GPU
    tl.store(c_ptr + m[:, None] * N + n[None, :], acc, mask=(m[:, None] < M) & (n[None, :] < N))


class ModelNew(nn.Module):
    """The GEMM in Triton, the bias added by PyTorch (glue)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 40)

    def forward(self, x):
        M, K = x.shape
        N = self.fc.weight.shape[0]
        c = torch.empty((M, N), dtype=x.dtype, device=x.device)
        matmul_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 16))](
            x.contiguous(), self.fc.weight.t().contiguous(), c, M, N, K, BM=16, BN=16, BK=16
        )
        return c + self.fc.bias
