import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 24, 20) * 0.1)

    def forward(self, a, b):
        return torch.einsum("bi,oij,bj->bo", a, self.w, b)


def get_inputs():
    return [torch.randn(64, 24), torch.randn(64, 20)]


def get_init_inputs():
    return []
