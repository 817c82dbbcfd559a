import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(128)

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.randn(32, 128)]


def get_init_inputs():
    return []
