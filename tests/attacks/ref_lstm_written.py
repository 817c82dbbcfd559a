import torch
import torch.nn as nn


class Model(nn.Module):
    """One-layer LSTM written out step by step with two linear layers."""

    def __init__(self, input_size: int = 16, hidden_size: int = 64):
        super().__init__()
        self.hidden_size = hidden_size
        self.ih = nn.Linear(input_size, 4 * hidden_size)
        self.hh = nn.Linear(hidden_size, 4 * hidden_size)

    def forward(self, x):
        B, T, _ = x.shape
        h = x.new_zeros(B, self.hidden_size)
        c = x.new_zeros(B, self.hidden_size)
        outs = []
        for t in range(T):
            i, f, g, o = (self.ih(x[:, t]) + self.hh(h)).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs, dim=1)


def get_inputs():
    return [torch.randn(8, 12, 16)]


def get_init_inputs():
    return [16, 64]
