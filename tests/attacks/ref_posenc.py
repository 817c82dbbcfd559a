import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Scaled embeddings plus sinusoidal positional encoding, computed in forward."""

    def __init__(self, d_model: int = 64):
        super().__init__()
        self.d_model = d_model
        self.alpha = nn.Parameter(torch.ones(1))

    def forward(self, x):
        L, D = x.shape[1], x.shape[2]
        pos = torch.arange(L, dtype=torch.float32, device=x.device)[:, None]
        div = torch.exp(torch.arange(0, D, 2, dtype=torch.float32, device=x.device) * (-math.log(10000.0) / D))
        pe = torch.zeros(L, D, device=x.device)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        return x * self.alpha + pe


def get_inputs():
    return [torch.randn(1, 128, 64)]


def get_init_inputs():
    return [64]
