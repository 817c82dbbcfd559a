"""The layout's seams, read from the code's imports (``ast``, nothing imported):

- ``services/`` is the ground floor: it imports no service package, nor the composition root;
- a service package (and the composition root, ``kernelzero/``) imports another service only through
  that service's face: ``from reward_svc import Evaluator``, a name its ``__init__.py`` lists in
  ``__all__``; never ``reward_svc.evaluate`` or any other module inside it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("proposer_svc", "coder_svc", "reward_svc", "trainer")
PACKAGES = ("services", *SERVICES, "integrations", "kernelzero")


def face(service: str, root: Path = ROOT) -> set[str]:
    """The names a service's ``__init__.py`` exports (its ``__all__``)."""
    tree = ast.parse((root / service / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {elt.value for elt in node.value.elts if isinstance(elt, ast.Constant)}  # type: ignore[attr-defined]
    return set()


def imports(package: str, root: Path = ROOT) -> list[tuple[str, int, str, str | None]]:
    """(file, line, module, name imported from it or None) for every absolute import in a package."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = str(path.relative_to(root))
            if isinstance(node, ast.Import):
                found += [(where, node.lineno, alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found += [(where, node.lineno, node.module, alias.name) for alias in node.names]
    return found


def attribute_uses(package: str, service: str) -> list[tuple[str, int, str]]:
    """``service.name`` read in a package that did ``import service``: each must be on its face too."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == service:
                found.append((str(path.relative_to(ROOT)), node.lineno, node.attr))
    return found


def test_the_shared_layer_imports_no_service() -> None:
    wrong = [
        f"{file}:{line} imports {module}"
        for file, line, module, _ in imports("services")
        if module.split(".")[0] in (*SERVICES, "integrations", "kernelzero")
    ]
    assert not wrong, wrong


def test_the_integrations_are_clients_of_the_shared_layer_only() -> None:
    """The adapters (TRL, verl, KernelBench, CI) reach the platform over HTTP, through ``services.clients``:
    no service's code, and only the composition root imports them (``kernelzero ci``)."""
    wrong = [
        f"{file}:{line} imports {module}"
        for file, line, module, _ in imports("integrations")
        if module.split(".")[0] in (*SERVICES, "kernelzero")
    ]
    wrong += [
        f"{file}:{line} imports {module}"
        for package in ("services", *SERVICES)
        for file, line, module, _ in imports(package)
        if module.split(".")[0] == "integrations"
    ]
    assert not wrong, wrong


def test_services_reach_each_other_only_through_their_faces() -> None:
    wrong = []
    for package in (*SERVICES, "kernelzero"):
        for file, line, module, name in imports(package):
            target = module.split(".")[0]
            if target not in SERVICES or target == package:
                continue
            if module != target:
                wrong.append(f"{file}:{line} imports {module}, inside {target}: import from {target}'s face")
            elif name is not None and name not in face(target):
                wrong.append(f"{file}:{line} imports {target}.{name}, which {target}/__init__.py does not export")
        for service in SERVICES:
            if service != package:
                wrong += [
                    f"{file}:{line} uses {service}.{attr}, which {service}/__init__.py does not export"
                    for file, line, attr in attribute_uses(package, service)
                    if attr not in face(service)
                ]
    assert not wrong, wrong


def test_every_face_name_exists() -> None:
    """A face lists only what its package really has (a typo would fail at first use, far from here)."""
    import importlib

    for service in SERVICES:
        package = importlib.import_module(service)
        missing = [name for name in face(service) if not hasattr(package, name)]
        assert not missing, (service, missing)


def test_the_walk_finds_what_it_forbids(tmp_path: Path) -> None:
    """The walk itself: services/ importing a service, a service reaching into another's module and
    importing a name off another's face are all found."""
    for relative, text in {
        "services/x.py": "from coder_svc.generators import build_generator\n",
        "reward_svc/y.py": "import coder_svc.prompts\nfrom proposer_svc import not_on_the_face\n",
        "proposer_svc/__init__.py": "__all__ = ['propose']\n",
    }.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    assert [module for _, _, module, _ in imports("services", tmp_path)] == ["coder_svc.generators"]
    found = [(module, name) for _, _, module, name in imports("reward_svc", tmp_path)]
    assert found == [("coder_svc.prompts", None), ("proposer_svc", "not_on_the_face")]
    assert face("proposer_svc", tmp_path) == {"propose"}


def test_every_guard_is_in_the_catalogue_page() -> None:
    """The guard names are one Literal (services.schemas.reward.Guard): the verdicts, the policy, the
    harness and the tests' hack catalogue use it, and docs/REWARD.md describes each one."""
    from typing import get_args

    from services.schemas.reward import Guard

    page = (ROOT / "docs" / "REWARD.md").read_text()
    missing = [guard for guard in get_args(Guard) if f"`{guard}`" not in page]
    assert not missing, missing
