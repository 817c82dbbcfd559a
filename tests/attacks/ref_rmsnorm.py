import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench level 1, 36_RMSNorm_ (smaller)."""

    def __init__(self):
        super().__init__()
        self.eps = 1e-5

    def forward(self, x):
        rms = torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + self.eps)
        return x / rms


def get_inputs():
    return [torch.randn(4, 16, 8, 8)]


def get_init_inputs():
    return []
