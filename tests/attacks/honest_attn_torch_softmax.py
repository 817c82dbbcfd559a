import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def bmm_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, sab, sam, sak, sbb, sbk, sbn, scale, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    bh = tl.program_id(0)
    m = tl.program_id(1) * BM + tl.arange(0, BM)
    n = tl.program_id(2) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + bh * sab + m[:, None] * sam + k[None, :] * sak, mask=(m[:, None] < M) & (k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + bh * sbb + k[:, None] * sbk + n[None, :] * sbn, mask=(k[:, None] < K) & (n[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")  # a broadcast product summed compiles to a TF32 dot on the GPU
    tl.store(c_ptr + bh * M * N + m[:, None] * N + n[None, :], acc * scale, mask=(m[:, None] < M) & (n[None, :] < N))


def bmm(a, b, scale=1.0):
    """a (G, M, K) @ b (G, K, N), any strides."""
    G, M, K = a.shape
    N = b.shape[2]
    c = torch.empty((G, M, N), dtype=a.dtype, device=a.device)
    grid = (G, triton.cdiv(M, 16), triton.cdiv(N, 16))
    bmm_kernel[grid](
        a, b, c, M, N, K, a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2), scale, BM=16, BN=16, BK=16
    )
    return c


class ModelNew(nn.Module):
    """Both attention matmuls in Triton, the softmax by PyTorch (glue)."""

    def forward(self, q, k, v):
        B, H, L, D = q.shape
        s = bmm(q.reshape(B * H, L, D), k.reshape(B * H, L, D).transpose(1, 2), 1.0 / math.sqrt(D))
        p = torch.softmax(s, dim=-1)
        return bmm(p, v.reshape(B * H, L, D)).reshape(B, H, L, D)
