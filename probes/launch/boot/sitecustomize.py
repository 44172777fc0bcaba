"""bsmon's start-up hook. ``bsmon run`` puts this directory first on ``PYTHONPATH``, so every
Python process of the job imports this file at start-up (``site`` imports ``sitecustomize``).

It uses only the standard library and does nothing visible until the process imports torch;
then it loads ``bsmon.probes.launch.autoattach``, which attaches at the first ``optimizer.step()``.
A process that never imports torch pays for reading this file and nothing else. The
``sitecustomize`` that this one shadows (a distribution's, a virtualenv's) still runs. Anything
that fails here is one line on stderr, and the program goes on unmonitored.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ENV_RUN = "BSMON_RUN"  # the job's name, set by `bsmon run` (runtime/audience.py's ENV_RUN)


def _warn(message: str) -> None:
    try:
        sys.stderr.write(f"bsmon: {message}; this process runs unmonitored\n")
        sys.stderr.flush()
    except Exception:
        pass


def _chain_shadowed_sitecustomize() -> None:
    """Import the next ``sitecustomize`` on the path, as ``site`` would have without us."""
    ours = sys.modules.get(__name__)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    sys.modules.pop(__name__, None)
    try:
        import sitecustomize  # noqa: F401  (the shadowed one, now that ours is off the path)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            _report_shadowed(exc)
        if ours is not None:
            sys.modules[__name__] = ours
    except Exception as exc:
        _report_shadowed(exc)
        if ours is not None:
            sys.modules[__name__] = ours


def _report_shadowed(exc: BaseException) -> None:
    try:  # what `site` prints for a failing sitecustomize
        sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n")
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
    except Exception:
        return


def _torch_imported() -> None:
    try:
        from bsmon.probes.launch import autoattach
    except ImportError as exc:
        _warn(
            f"this Python ({sys.executable}) imports torch but cannot import bsmon ({exc}); "
            "run the job with the Python that bsmon is installed in"
        )
        return
    except Exception as exc:
        _warn(f"could not load bsmon ({type(exc).__name__}: {exc})")
        return
    try:
        autoattach.install(os.environ.get(_ENV_RUN) or "")
    except Exception as exc:
        _warn(f"could not set up bsmon ({type(exc).__name__}: {exc})")


class _AfterExec:
    """A loader that runs the real loader, then ``_torch_imported``; it puts the real loader
    back on the module before running it, so torch never sees this one."""

    def __init__(self, loader: object) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)

    def create_module(self, spec: object) -> object:
        return self._loader.create_module(spec)  # type: ignore[attr-defined]

    def exec_module(self, module: object) -> None:
        _unwatch()
        module.__loader__ = self._loader  # type: ignore[attr-defined]
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        self._loader.exec_module(module)  # type: ignore[attr-defined]
        _torch_imported()


class _TorchWatcher:
    """A meta-path finder that answers nothing but wraps the loader of ``torch``.

    It stays on ``sys.meta_path`` until torch is actually executed: libraries ask
    ``importlib.util.find_spec("torch")`` long before they import it (transformers,
    datasets and accelerate do), and such a question must not end the watch."""

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if name != "torch" or self._finding:
            return None
        self._finding = True  # the search below asks the meta path again, this finder too
        try:
            spec = importlib.util.find_spec(name)
        except Exception:
            return None  # let the normal import machinery raise what it raises
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _AfterExec(spec.loader)
        return spec


_WATCHER = _TorchWatcher()


def _unwatch() -> None:
    if _WATCHER in sys.meta_path:
        sys.meta_path.remove(_WATCHER)


def _boot() -> None:
    _chain_shadowed_sitecustomize()
    if _ENV_RUN not in os.environ:
        return  # on the path, but not started by `bsmon run`: do nothing
    if "torch" in sys.modules:
        _torch_imported()
    else:
        sys.meta_path.insert(0, _WATCHER)


try:
    _boot()
except Exception as _exc:
    _warn(f"start-up hook failed ({type(_exc).__name__}: {_exc})")
