"""Thread-safe memoisation: each value is computed once, even under concurrent calls."""

from __future__ import annotations

import threading
from collections import OrderedDict
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


class BoundedStore:
    """A cache of large values that keeps at most ``max_bytes``, least recently used out.

    Building must be deterministic: a value evicted and built again is the same.
    Concurrent callers of one missing key may each build it; the first stored wins.

    Parameters
    ----------
    max_bytes
        Bytes kept at most (by the sizes given with the values); a value larger
        than that is built and returned but not kept.

    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self._values: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._kept = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], T], nbytes: Callable[[T], int]) -> T:
        """The value for ``key``: kept, or built by ``build()`` and kept if it fits.

        Parameters
        ----------
        key
            Identifies the value.
        build
            Computes the value.
        nbytes
            Its size in bytes, from the value.

        Returns
        -------
        object
            The value.

        """
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key][0]  # type: ignore[no-any-return]
        value = build()
        size = int(nbytes(value))
        if size > self.max_bytes:
            return value
        with self._lock:
            if key in self._values:
                return self._values[key][0]  # type: ignore[no-any-return]
            self._values[key] = (value, size)
            self._kept += size
            while self._kept > self.max_bytes:
                _, (_, evicted) = self._values.popitem(last=False)
                self._kept -= evicted
            return value

    def __len__(self) -> int:
        return len(self._values)

    def __getstate__(self) -> dict[str, Any]:
        # Large values are rebuilt on demand in another process; a lock is per process.
        return {"max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["max_bytes"])  # type: ignore[misc]
