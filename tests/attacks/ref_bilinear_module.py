import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bil = nn.Bilinear(24, 20, 8)

    def forward(self, a, b):
        return self.bil(a, b)


def get_inputs():
    return [torch.randn(64, 24), torch.randn(64, 20)]


def get_init_inputs():
    return []
