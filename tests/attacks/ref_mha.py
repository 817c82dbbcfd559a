import math

import torch
import torch.nn as nn


class Model(nn.Module):
    """Multi-head self-attention written out: projections, scaled scores, softmax, weighted values."""

    def __init__(self, embed_dim: int = 64, num_heads: int = 4):
        super().__init__()
        self.h = num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        B, L, E = x.shape
        D = E // self.h
        q = self.q_proj(x).view(B, L, self.h, D).transpose(1, 2)
        k = self.k_proj(x).view(B, L, self.h, D).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.h, D).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, L, E)
        return self.out_proj(y)


def get_inputs():
    return [torch.randn(2, 32, 64)]


def get_init_inputs():
    return [64, 4]
