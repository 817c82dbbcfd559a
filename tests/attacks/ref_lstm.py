import torch
import torch.nn as nn


class Model(nn.Module):
    """One-layer LSTM over a batch of sequences (KernelBench level-3 style): the output sequence."""

    def __init__(self, input_size: int = 16, hidden_size: int = 64):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


def get_inputs():
    return [torch.randn(8, 12, 16)]


def get_init_inputs():
    return [16, 64]
