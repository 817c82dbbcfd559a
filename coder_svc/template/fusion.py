"""Group the lowered nodes into fused kernels: a chain of pointwise ops, at most one reduction,
softmax, normalisation or pool, and the pointwise chain after it. Everything else stays a PyTorch call.

A node joins the group that produced its input only when that input has no other user, so no
value inside a kernel is ever needed outside it; external tensors must broadcast to the group's
domain (the full shape before the reduction, the reduced or pooled shape after it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from coder_svc.template.graph import Graph, Node, node_refs
from coder_svc.template.lowering import (
    FLOAT_DTYPES,
    Alias,
    Elementwise,
    Lowered,
    Norm,
    Pool,
    Reduce,
    Softmax,
    Unsupported,
    decompose_losses,
    lower,
)
from coder_svc.template.triton_ops import supports


@dataclass
class External:
    value: str
    shape: tuple[int, ...]
    phase: str  # "pre" (the full domain) or "post" (after the reduction)

    @property
    def key(self) -> tuple[str, str]:
        return self.value, self.phase


@dataclass
class Group:
    index: int
    domain: tuple[int, ...]
    pre: list[tuple[str, Elementwise]] = field(default_factory=list)
    reduction: tuple[str, Reduce | Softmax | Norm | Pool] | None = None
    post: list[tuple[str, Elementwise]] = field(default_factory=list)
    externals: list[External] = field(default_factory=list)
    head: str = ""
    dtype: str = "float32"
    members: list[str] = field(default_factory=list)
    post_domain: tuple[int, ...] = ()

    def phase(self) -> str:
        return "post" if self.reduction else "pre"

    def add_external(self, value: str, shape: tuple[int, ...], phase: str) -> None:
        if (value, phase) not in {e.key for e in self.externals}:
            self.externals.append(External(value, shape, phase))

    def ops(self) -> int:
        return len(self.pre) + len(self.post) + (1 if self.reduction else 0)


@dataclass
class Plan:
    """Nodes in order; each is kept as a PyTorch call, dropped (an alias or inside a kernel), or the
    head of a kernel group, where the kernel is launched."""

    graph: Graph
    groups: list[Group]
    group_of: dict[str, int]
    aliases: dict[str, str]
    unsupported: dict[str, str] = field(default_factory=dict)
    """Ops the generator knows but leaves to PyTorch in the form they take here, with the reason."""

    def resolve(self, name: str) -> str:
        while name in self.aliases:
            name = self.aliases[name]
        return name


def _is_inplace(node: Node) -> bool:
    name = node.target.rsplit(".", 1)[-1]
    inplace_attr = node.module.attrs.get("inplace") if node.module else None
    return (name.endswith("_") and not name.startswith("_")) or node.kwargs.get("inplace") is True or inplace_attr is True


def plan(graph: Graph) -> Plan:
    graph = decompose_losses(graph)
    nodes = graph.by_name()
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    lowered = {n.name: lower(n, nodes) for n in graph.nodes}
    aliases: dict[str, str] = {}

    def resolve(name: str) -> str:
        while name in aliases:
            name = aliases[name]
        return name

    for node in graph.nodes:
        ir = lowered[node.name]
        if isinstance(ir, Alias) and not _observed_mutation(node, graph, order):
            aliases[node.name] = ir.source
    users: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.name in aliases:
            continue
        for ref in node_refs(node.args) + node_refs(node.kwargs):
            readers = users.setdefault(resolve(ref), [])
            if node.name not in readers:
                readers.append(node.name)

    def tensor(name: str):
        return nodes[name].tensor

    groups: list[Group] = []
    open_head: dict[str, Group] = {}  # head value -> its group, while it can still grow

    for node in graph.nodes:
        ir = lowered[node.name]
        meta = node.tensor
        if isinstance(ir, Reduce) and ir.tuple_output and isinstance(node.meta, list) and node.meta:
            meta = node.meta[0]  # (values, indices): only the values are generated
        if node.name in aliases or ir is None or isinstance(ir, (Alias, Unsupported)) or meta is None:
            continue
        if _is_inplace(node) and _observed_mutation(node, graph, order):
            continue
        if isinstance(ir, Elementwise):
            refs = [resolve(o) for o in ir.operands if isinstance(o, str)]
            if not supports(ir.fn) or any(tensor(r) is None or tensor(r).dtype not in FLOAT_DTYPES | {"bool"} for r in refs):
                continue
            ir = Elementwise(ir.fn, tuple(resolve(o) if isinstance(o, str) else o for o in ir.operands), ir.attrs)
            shape = tuple(meta.shape)
            if not all(_broadcasts(tuple(tensor(r).shape), shape) for r in refs):
                continue  # the traced shapes disagree with broadcasting: leave it to PyTorch
            group = next((open_head[r] for r in refs if r in open_head and users.get(r) == [node.name]), None)
            if group is not None and shape == (group.post_domain if group.reduction else group.domain):
                phase = group.phase()
                del open_head[group.head]
            else:
                group = Group(len(groups), shape)
                groups.append(group)
                phase = "pre"
            for r in refs:
                if r != group.head:
                    group.add_external(r, tuple(tensor(r).shape), phase)
            (group.post if phase == "post" else group.pre).append((node.name, ir))
        else:
            source = resolve(ir.source)
            src_meta = tensor(source)
            if src_meta is None or src_meta.dtype not in FLOAT_DTYPES:
                continue
            ir = replace(ir, source=source)
            if (
                isinstance(ir, Reduce)
                and ir.tuple_output
                and any(not isinstance(lowered[u], Alias) for u in _raw_users(node.name, graph))
            ):
                continue  # the indices are used: PyTorch computes both
            shape = tuple(src_meta.shape)
            group = open_head.get(source)
            if group is not None and group.reduction is None and users.get(source) == [node.name] and group.domain == shape:
                del open_head[group.head]
            else:
                group = Group(len(groups), shape)
                groups.append(group)
                group.add_external(source, shape, "pre")
            group.reduction = (node.name, ir)
            group.post_domain = tuple(meta.shape) if isinstance(ir, (Reduce, Pool)) else shape
        group.head = node.name
        group.dtype = meta.dtype
        group.members.append(node.name)
        open_head[node.name] = group

    kept = [g for g in groups if g.dtype in FLOAT_DTYPES and all(tensor(e.value).dtype in FLOAT_DTYPES for e in g.externals)]
    renumbered: list[Group] = []
    final_of: dict[str, int] = {}
    for group in kept:
        group.index = len(renumbered)
        renumbered.append(group)
        for member in group.members:
            final_of[member] = group.index
    # getitem(values) aliases a tuple reduction only when a kernel computes it (else PyTorch's tuple is indexed)
    aliases = {
        name: source for name, source in aliases.items() if not (_tuple_reduction(lowered[source]) and source not in final_of)
    }
    unsupported = {name: ir.reason for name, ir in lowered.items() if isinstance(ir, Unsupported)}
    return Plan(graph, renumbered, final_of, aliases, unsupported)


def _tuple_reduction(lowered: Lowered) -> bool:
    return isinstance(lowered, Reduce) and lowered.tuple_output


def _broadcasts(shape: tuple[int, ...], domain: tuple[int, ...]) -> bool:
    if len(shape) > len(domain):
        return False
    return all(s in (1, d) for s, d in zip(reversed(shape), reversed(domain)))


def _raw_users(name: str, graph: Graph) -> list[str]:
    return [n.name for n in graph.nodes if name in node_refs(n.args) + node_refs(n.kwargs)]


def _observed_mutation(node: Node, graph: Graph, order: dict[str, int]) -> bool:
    """An in-place node whose input is read again later, or an alias whose source is later mutated:
    the out-of-place version would change what those readers see."""
    refs = node_refs(node.args[:1])
    if not refs:
        return False
    source = refs[0]
    later = [n for n in graph.nodes if order[n.name] > order[node.name]]
    if _is_inplace(node):
        return any(source in node_refs(n.args) + node_refs(n.kwargs) for n in later)
    return any(_is_inplace(n) and node_refs(n.args[:1]) == [source] for n in later)
