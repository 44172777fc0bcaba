"""Why a key cannot act now, in the words a toast and the help use.

A key that acts on the job (``+``/``-``, ``p``, ``a``) or needs a kind of job (``r``) is greyed in
the footer when it cannot act; pressing it says why instead of doing nothing.
"""

from __future__ import annotations

from .session import ConnState, Snapshot
from .settings import Mode

# action -> (the keys shown to the user, the capability the job must offer)
ACTIONS: dict[str, tuple[str, str | None]] = {
    "batch": ("+/-", "step_batch_size"),
    "probe": ("p", "probe"),
    "autopilot": ("a", "autopilot"),
    "ranks": ("r", None),
}
KEY_ACTIONS = {
    "plus": "batch",
    "equals_sign": "batch",
    "minus": "batch",
    "p": "probe",
    "a": "autopilot",
    "r": "ranks",
}
# the app's own keys: they act on the dashboard, not on the job
APP_ACTIONS = {"detach": "d", "jobs": "j"}
KEY_ACTIONS.update({key: action for action, key in APP_ACTIONS.items()})
DETACH_OFF: dict[Mode, str] = {
    "attach": "d leaves a job that bsmon run started; q here already leaves the job running",
    "demo": "d leaves a job that bsmon run started; the demo job stops with the dashboard",
    "replay": "a replay of a recorded session has no job to leave running",
}
JOBS_OFF = "j goes back to the job picker, which bsmon opens when several jobs are running"
NOT_DISTRIBUTED = "r shows the ranks of a distributed job; this job runs as a single process"
STATES = {
    ConnState.CONNECTING: "no job connected yet",
    ConnState.FINISHED: "the job has finished",
    ConnState.DISCONNECTED: "the job is not connected (reconnecting)",
}


def state_reason(snap: Snapshot) -> str | None:
    """Why nothing can act on the job in its current state (None: it is live)."""
    if snap.replay is not None:
        return "a replay of a recorded session is read-only"
    return STATES.get(snap.state)


def why_off(snap: Snapshot | None, action: str) -> str | None:
    """Why ``action`` cannot act now (None: it can)."""
    if action not in ACTIONS:
        return None
    if snap is None:
        return "no job on screen yet"
    if action == "ranks":
        session = snap.session
        return None if session is not None and session.world_size > 1 else NOT_DISTRIBUTED
    capability = snap.capabilities.get(ACTIONS[action][1] or "")
    if capability is not None and not capability.available:
        return capability.reason or "this job does not offer it"
    if action == "probe" and snap.latest is not None and snap.latest.probe.blocked:
        return snap.latest.probe.blocked
    return state_reason(snap)


def keys_off(snap: Snapshot) -> dict[str, str]:
    """The keys that act on the job and cannot, for any reason but its state, with why."""
    off = {}
    for action in ("batch", "probe", "autopilot"):
        why = why_off(snap, action)
        if why is not None and why != state_reason(snap):
            off[ACTIONS[action][0]] = why
    return off


def app_why_off(action: str, mode: Mode, picked: bool) -> str | None:
    """Why the app's ``action`` cannot act (None: it can); ``picked``: the job on screen was
    chosen in the picker."""
    if action == "detach":
        return DETACH_OFF.get(mode)
    if action == "jobs" and not picked:
        return JOBS_OFF
    return None


def key_of(action: str) -> str:
    """The key(s) of ``action`` as the user sees them."""
    return APP_ACTIONS.get(action) or ACTIONS[action][0]
