import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int = 32, out_features: int = 48):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.sigmoid(self.fc(x)) > 0.5


def get_inputs():
    return [torch.randn(64, 32)]


def get_init_inputs():
    return [32, 48]
