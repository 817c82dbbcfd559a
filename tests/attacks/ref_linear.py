import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 40)

    def forward(self, x):
        return self.fc(x)


def get_inputs():
    return [torch.randn(48, 32)]


def get_init_inputs():
    return []
