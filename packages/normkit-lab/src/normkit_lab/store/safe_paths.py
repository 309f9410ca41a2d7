"""Paths under a results directory that normkit writes: never through a symbolic link at any level.

A link anywhere below the directory (`tensorboard/<run>` pointing elsewhere, say) would send writes out
of it; `refuse_links` walks every component from the directory down to the path and refuses the first
link with one line naming it.
"""

from __future__ import annotations

from pathlib import Path

from normkit_lab.errors import ConfigError


def refuse_links(root: Path, path: Path) -> Path:
    """`path` (inside `root`) after checking that no existing component below `root` is a symbolic link."""
    root, path = Path(root), Path(path)
    relative = path.relative_to(root)
    current = root
    for part in relative.parts:
        current = current / part
        if current.is_symlink():
            raise ConfigError(f"{str(current)!r} is a symbolic link; a results directory holds only its own "
                              f"files, so replace the link with the file or directory itself")
    return path


def make_dirs(root: Path, path: Path) -> Path:
    """`path` created as a directory inside `root` (parents too), refusing links at every level."""
    refuse_links(root, path)
    path.mkdir(parents=True, exist_ok=True)
    return refuse_links(root, path)  # a link swapped in meanwhile is still caught before any write
