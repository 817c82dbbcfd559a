import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Attention written out (as in KernelBench level 3's minGPT blocks)."""

    def forward(self, q, k, v):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = torch.softmax(att, dim=-1)
        return att @ v


def get_inputs():
    return [torch.randn(2, 2, 64, 16), torch.randn(2, 2, 64, 16), torch.randn(2, 2, 64, 16)]


def get_init_inputs():
    return []
