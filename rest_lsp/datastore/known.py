"""The indexer's table of known paths, which also lists what lies at or below a path without scanning all of them."""

from __future__ import annotations

import os
from typing import Iterable


class KnownPaths(dict):
    """Absolute path -> signature, with a tree of the folders above the paths: `at_or_below(path)` costs time in
    proportion to what it finds (an event for a path nobody indexed costs O(1), whatever the number of files)."""

    def __init__(self, items: Iterable = ()):
        super().__init__()
        self._children: dict[str, set[str]] = {}  # folder -> its entries that are, or lie above, known paths
        self.update(items)

    def __setitem__(self, path: str, sig) -> None:
        if not dict.__contains__(self, path):
            self._link(path)
        dict.__setitem__(self, path, sig)

    def __delitem__(self, path: str) -> None:
        dict.__delitem__(self, path)
        self._unlink(path)

    def pop(self, path: str, *default):
        value = dict.pop(self, path, *default)
        self._unlink(path)
        return value

    def update(self, items: Iterable = (), **kw) -> None:
        for path, sig in dict(items, **kw).items():
            self[path] = sig

    def clear(self) -> None:
        dict.clear(self)
        self._children.clear()

    def at_or_below(self, path: str) -> list[str]:
        """The known paths equal to `path` or inside the folder `path`."""
        found = [path] if dict.__contains__(self, path) else []
        stack = [path]
        while stack:
            for child in self._children.get(stack.pop(), ()):
                if dict.__contains__(self, child):
                    found.append(child)
                if child in self._children:
                    stack.append(child)
        return found

    def _link(self, path: str) -> None:
        while (parent := os.path.dirname(path)) != path:
            kids = self._children.get(parent)
            if kids is not None:
                kids.add(path)
                return
            self._children[parent] = {path}
            path = parent

    def _unlink(self, path: str) -> None:
        while not dict.__contains__(self, path) and path not in self._children:
            parent = os.path.dirname(path)
            kids = self._children.get(parent)
            if parent == path or kids is None:
                return
            kids.discard(path)
            if kids:
                return
            del self._children[parent]
            path = parent
