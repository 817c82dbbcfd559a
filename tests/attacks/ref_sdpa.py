import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """KernelBench level 1, 97_ScaledDotProductAttention (smaller)."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def get_inputs():
    return [torch.randn(2, 2, 64, 16), torch.randn(2, 2, 64, 16), torch.randn(2, 2, 64, 16)]


def get_init_inputs():
    return []
