import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench level 2 style: Conv2d, then bias and ReLU."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3)
        self.bias = nn.Parameter(torch.randn(8, 1, 1) * 0.1)

    def forward(self, x):
        return torch.relu(self.conv(x) + self.bias)


def get_inputs():
    return [torch.randn(2, 4, 16, 16)]


def get_init_inputs():
    return []
