"""One function of torch wrapped once for the whole process, with subscribers.

bsmon sees some things no hook reports — a DataLoader handing out a batch, a backward pass
starting and ending — by wrapping the function that does them (``_BaseDataLoaderIter.__next__``,
``torch.autograd.backward``). The wrapper calls the original with the same arguments and
returns (or raises) exactly what it does; around the call it takes two ``time.perf_counter``
readings and calls each subscriber with ``(first argument, result, start, end)`` (the result
is ``None`` when the call raised). Subscribers must do O(1) work; what they raise is
swallowed, so the job never sees it. The wrapper is installed with the first subscriber and
removed with the last (if it is still the one installed: someone may have wrapped it again);
a watch installed and removed around sampled steps makes its wrapper once.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

Subscriber = Callable[[Any, Any, float, float], None]  # (first argument, result, start, end)
Starting = Callable[[], None]  # called just before the original (a CUDA event to record)
Locate = Callable[[], tuple[Any, str] | str]  # (owner, attribute name), or why not


class CallWatch:
    def __init__(self, locate: Locate, *, notify_on: tuple[type[BaseException], ...] = ()) -> None:
        """``locate`` finds the owner of the function when first needed (torch imported
        late); ``notify_on``: exceptions after which subscribers still hear of the call (with
        a ``None`` result), e.g. ``StopIteration`` for an iterator's end."""
        self._locate = locate
        self._notify_on = notify_on
        self._lock = threading.Lock()
        self._subscribers: tuple[Subscriber, ...] = ()
        self._starting: tuple[Starting, ...] = ()
        self._installed: tuple[Any, str, Any, Any] | None = None  # owner, name, original, ours
        self._made: tuple[Any, str, Any, Any] | None = None  # the last one installed

    def subscribe(self, callback: Subscriber, starting: Starting | None = None) -> str | None:
        """Call ``callback`` after every call (and ``starting`` just before it); None, or why
        the calls cannot be seen."""
        with self._lock:
            if self._installed is None:
                why = self._install()
                if why is not None:
                    return why
            if callback not in self._subscribers:
                self._subscribers = (*self._subscribers, callback)
            if starting is not None and starting not in self._starting:
                self._starting = (*self._starting, starting)
        return None

    def unsubscribe(self, callback: Subscriber, starting: Starting | None = None) -> None:
        with self._lock:
            self._subscribers = tuple(s for s in self._subscribers if s != callback)
            self._starting = tuple(s for s in self._starting if s != starting)
            if not self._subscribers and self._installed is not None:
                self._uninstall()

    def why_not(self) -> str | None:
        """Why the calls cannot be seen (None: they can), without installing anything."""
        if self._installed is not None:
            return None
        found = self._locate()
        return found if isinstance(found, str) else None

    @property
    def installed(self) -> bool:
        return self._installed is not None

    def _install(self) -> str | None:
        found = self._locate()
        if isinstance(found, str):
            return found
        owner, name = found
        original = getattr(owner, name)
        made = self._made
        if made is not None and made[0] is owner and made[1] == name and made[2] is original:
            setattr(owner, name, made[3])  # the wrapper made before: put back, not made anew
            self._installed = made
            return None
        notify_on = self._notify_on
        notify = self._notify

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._starting:
                self._call_starting()
            started = time.perf_counter()
            try:
                result = original(*args, **kwargs)
            except notify_on:
                notify(args, None, started)
                raise
            notify(args, result, started)
            return result

        setattr(owner, name, wrapper)
        self._installed = self._made = (owner, name, original, wrapper)
        return None

    def _uninstall(self) -> None:
        assert self._installed is not None
        owner, name, original, wrapper = self._installed
        current = owner.__dict__.get(name) if hasattr(owner, "__dict__") else None
        if current is wrapper:
            setattr(owner, name, original)
        self._installed = None

    def _call_starting(self) -> None:
        for callback in self._starting:
            try:  # noqa: SIM105 (contextlib.suppress costs 3 calls per step)
                callback()
            except Exception:  # a subscriber reports its own errors; the job never sees one
                pass

    def _notify(self, args: tuple, result: Any, started: float) -> None:
        finished = time.perf_counter()
        first = args[0] if args else None
        for callback in self._subscribers:
            try:  # noqa: SIM105 (free in CPython 3.11 unless raised; suppress costs 3 calls)
                callback(first, result, started, finished)
            except Exception:  # a subscriber reports its own errors; the job never sees one
                pass
