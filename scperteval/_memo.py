"""Thread-safe memoisation: each value is computed once, even under concurrent calls."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class Memo:
    """A cache whose entries are computed at most once.

    Concurrent callers asking for the same key wait for the first caller's
    result instead of computing it again; different keys compute in parallel.
    """

    def __init__(self) -> None:
        self._values: dict[Hashable, Any] = {}
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """Value for ``key``, computing it with ``compute()`` on first use."""
        try:
            return self._values[key]  # type: ignore[no-any-return]
        except KeyError:
            pass
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._values:
                self._values[key] = compute()
            return self._values[key]  # type: ignore[no-any-return]

    def __getstate__(self) -> dict[str, Any]:
        # The values travel; locks belong to one process and are made afresh.
        with self._guard:
            return {"values": dict(self._values)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._values = dict(state["values"])
        self._locks = {}
        self._guard = threading.Lock()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._values

    def clear(self) -> None:
        """Forget every cached value."""
        with self._guard:
            self._values.clear()
            self._locks.clear()
