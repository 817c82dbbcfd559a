"""Co-occurrence statistics of Torch APIs, as mined from real modules and sampled from.

API names are canonical: ``torch.<fn>`` (torch functions), ``torch.nn.functional.<fn>``,
``torch.nn.<Layer>`` (modules, counted where they are called in ``forward``) and
``Tensor.<method>`` (tensor methods). Mining, the catalog and sampling all speak these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ApiStats:
    modules: int = 0  # forward bodies parsed
    usage: dict[str, int] = field(default_factory=dict)  # api -> forward bodies that use it
    pairs: dict[tuple[str, str], int] = field(default_factory=dict)  # (a, b), a < b -> bodies using both
