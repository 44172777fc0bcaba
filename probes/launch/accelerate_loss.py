"""The loss of a script that trains through Hugging Face accelerate, as the script sees it.

``bsmon run`` shows the scalar ``backward()`` is called on. ``Accelerator.backward(loss)``
divides the loss by the gradient-accumulation steps before it calls ``backward()`` (and,
under fp16, multiplies it by the GradScaler's scale), so that scalar is not the loss the
script computed and prints. When the job has an ``Accelerator``, bsmon wraps its class's
``backward`` once, at attach: the wrapper hands bsmon the loss it was given (one append), and
the agent thread leaves out the scalar of the ``backward()`` call that follows inside
(``runtime.telemetry``). The wrapper calls the original with the same arguments; nothing the
job computes changes. accelerate is never imported by bsmon: the class is taken from
``sys.modules`` when the script has imported it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

MODULE = "accelerate.accelerator"


def find_accelerator(objects: list[Any]) -> Any:
    """The job's ``accelerate.Accelerator`` when it has exactly one; else None."""
    module = sys.modules.get(MODULE)
    cls = getattr(module, "Accelerator", None)
    if cls is None:
        return None
    found = [obj for obj in objects if issubclass(type(obj), cls)]
    return found[0] if len(found) == 1 else None


def early_loss_factor(accelerator: Any) -> float | None:
    """What a loss taken at ``backward()`` inside ``accelerator.backward`` (before bsmon
    wrapped it) must be multiplied by to be the script's: the accumulation steps it was
    divided by; None when it was also scaled by a GradScaler (its scale is on the device)."""
    if getattr(accelerator, "scaler", None) is not None:
        return None
    kind = getattr(accelerator, "distributed_type", None)
    if str(getattr(kind, "value", kind)) == "DEEPSPEED":
        return 1.0  # accelerate leaves the division to DeepSpeed's engine
    steps = getattr(accelerator, "gradient_accumulation_steps", 1)
    return float(steps) if isinstance(steps, int) and steps > 0 else None


def wrap_backward(accelerator: Any, given: Callable[[Any], None]) -> Callable[[], None]:
    """Wrap ``backward`` of ``accelerator``'s class so that ``given(loss)`` sees the loss
    the script passed; returns what undoes it."""
    cls = type(accelerator)
    own = cls.__dict__.get("backward")
    original = cls.backward

    @functools.wraps(original)
    def backward(self: Any, loss: Any, **kwargs: Any) -> Any:
        given(loss)
        return original(self, loss, **kwargs)

    cls.backward = backward

    def unwrap() -> None:
        if cls.__dict__.get("backward") is backward:
            if own is None:
                delattr(cls, "backward")
            else:
                cls.backward = own

    return unwrap
