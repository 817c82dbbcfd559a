"""Moving files between a worker and its children: hard links into a child's read-only inbox, and a
directory published whole or not at all."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from pathlib import Path


def remove_tree(path: Path) -> None:
    """Remove a tree a child wrote, however deep: ``shutil.rmtree`` recurses once a level and raises
    ``RecursionError`` (not an ``OSError``, which ``ignore_errors`` covers) past about a thousand, a depth a
    candidate can make; ``rm -rf`` walks it without recursing. What cannot be removed is left for a later sweep."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True, check=False)


def link_tree(source: Path, target: Path) -> None:
    """Hard links to every regular file of ``source`` under ``target`` (dirs made as needed): a child's
    read-only view of files it may read but must not see the rest of the directory of. Falls back to
    copies across filesystems."""
    for root, _, files in os.walk(source, followlinks=False):
        for name in files:
            path = Path(root) / name
            destination = target / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, destination, follow_symlinks=False)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                shutil.copyfile(path, destination, follow_symlinks=False)


def publish_dir(source: Path, target: Path) -> bool:
    """Put ``source`` in place as ``target`` all at once, or not at all if ``target`` exists (a
    concurrent publisher won). A rename where both are on one filesystem; else (children's dirs on a
    tmpfs scratch, the cache on disk) a copy beside ``target``, renamed there."""
    try:
        source.rename(target)
        return True
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            return False
    staging = target.parent / f".publishing-{uuid.uuid4().hex}"
    try:
        shutil.copytree(source, staging, symlinks=True)
        staging.rename(target)
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(staging, ignore_errors=True)
