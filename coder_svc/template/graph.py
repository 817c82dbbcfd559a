"""The op graph the trace child prints and the parent validates: a torch.fx graph as plain JSON.

Everything here came out of an untrusted process: names are checked to be identifiers or dotted
identifiers before any of them can reach generated source, and constants are plain JSON values.
"""

from __future__ import annotations

import keyword
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from typing_extensions import TypeAliasType

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")


def is_name(value: str, pattern: re.Pattern[str] = IDENTIFIER) -> bool:
    """The whole string (no trailing newline) matches, and no part of it is a Python keyword."""
    return pattern.fullmatch(value) is not None and not any(keyword.iskeyword(part) for part in value.split("."))


def _identifier(value: str) -> str:
    if not is_name(value):
        raise ValueError(f"{value!r} is not an identifier")
    return value


def _dotted(value: str) -> str:
    if not is_name(value, DOTTED):
        raise ValueError(f"{value!r} is not a dotted name")
    return value


# Every name the graph carries may end up in generated source: only these two shapes get through.
Identifier = Annotated[str, AfterValidator(_identifier)]
Dotted = Annotated[str, AfterValidator(_dotted)]
MAX_NODES = 5000


class TensorMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shape: list[Annotated[int, Field(ge=0)]]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


class NodeRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: Identifier


class DtypeConst(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dtype: str


class SliceConst(BaseModel):
    model_config = ConfigDict(extra="forbid")
    slice: list[int | None | NodeRef]


class TupleConst(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tuple: list[Arg]


class Opaque(BaseModel):
    """A constant the trace could not express (an object): the node that holds it is never generated."""

    model_config = ConfigDict(extra="forbid")
    opaque: str


if TYPE_CHECKING:  # the same recursive alias, in the form type checkers follow
    Arg: TypeAlias = bool | int | float | str | None | NodeRef | DtypeConst | SliceConst | TupleConst | Opaque | list["Arg"]
else:
    Arg = TypeAliasType(
        "Arg", bool | int | float | str | None | NodeRef | DtypeConst | SliceConst | TupleConst | Opaque | list["Arg"]
    )
TupleConst.model_rebuild()


class ModuleInfo(BaseModel):
    """A call_module's class and its constant attributes (e.g. LeakyReLU's negative_slope)."""

    model_config = ConfigDict(extra="forbid")
    cls: str
    attrs: dict[str, Arg] = {}


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Identifier
    op: Literal["placeholder", "get_attr", "call_function", "call_method", "call_module", "output"]
    target: Dotted
    args: list[Arg] = []
    kwargs: dict[Identifier, Arg] = {}
    meta: TensorMeta | list[TensorMeta | None] | None = None
    module: ModuleInfo | None = None
    value: Arg = None
    """A get_attr of a tensor the forward made from literals: its (small) value, as nested lists."""

    @property
    def tensor(self) -> TensorMeta | None:
        return self.meta if isinstance(self.meta, TensorMeta) else None


class Graph(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[Node] = Field(max_length=MAX_NODES)
    traced_on: str
    """'meta' (shapes only, nothing allocated) or 'cpu' (the module would not build on meta)."""

    @model_validator(mode="after")
    def _references_point_back(self) -> Graph:
        """Unique names, and every argument refers to a node defined before it."""
        seen: set[str] = set()
        for node in self.nodes:
            missing = [name for name in node_refs(node.args) + node_refs(node.kwargs) if name not in seen]
            if missing:
                raise ValueError(f"node {node.name} refers to {missing[0]!r}, which no earlier node defines")
            if node.name in seen:
                raise ValueError(f"node name {node.name!r} appears twice")
            seen.add(node.name)
        return self

    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}


def node_refs(value: Any) -> list[str]:
    """Names of the nodes an argument refers to, in order."""
    if isinstance(value, NodeRef):
        return [value.node]
    if isinstance(value, TupleConst):
        return node_refs(value.tuple)
    if isinstance(value, SliceConst):
        return node_refs(value.slice)
    if isinstance(value, list):
        return [name for item in value for name in node_refs(item)]
    if isinstance(value, dict):
        return [name for item in value.values() for name in node_refs(item)]
    return []
