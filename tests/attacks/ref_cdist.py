import torch
import torch.nn as nn


class Model(nn.Module):
    """Pairwise L1 distances, written out."""

    def forward(self, x, y):
        return (x[:, None, :] - y[None, :, :]).abs().sum(-1)


def get_inputs():
    return [torch.randn(48, 32), torch.randn(40, 32)]


def get_init_inputs():
    return []
