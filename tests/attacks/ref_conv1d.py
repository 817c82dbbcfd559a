import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench level 1, 67_conv_standard_1D (smaller)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(16, 24, 5, padding=2)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(2, 16, 64)]


def get_init_inputs():
    return []
