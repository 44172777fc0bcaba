"""The help (`?`): keys first, a close hint, and what `q` does in each mode."""

from __future__ import annotations

import pytest
from textual.widgets import Static

from bsmon.tui.help import CLOSE_HINT, HelpScreen, help_text
from bsmon.tui.settings import settings

from ..scripted import scripted_app
from .test_tui_pilot import dashboard_ready, wait_for


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("attach", "quit the dashboard; the job keeps running"),
        ("demo", "quit and stop the demo job"),
        ("run", "detach: quit and leave the job running"),
        ("replay", "close the replay"),
    ],
)
def test_q_says_what_it_does_in_each_mode(mode, says):
    text = help_text({}, mode)
    assert says in text
    assert ("d         detach" in text) == (mode == "run")
    assert ("space     replay: pause or play" in text) == (mode == "replay")


def test_the_keys_come_before_the_panels_and_include_a_and_the_interval():
    text = help_text({"p": "the probe needs attach(..., loss_fn=...)"}, "attach")
    keys, panels = text.index("?         this help"), text.index("**Panels**")
    assert keys < text.index("`p` is off: the probe needs") < panels
    assert "a         autopilot on / off: the batch follows the noise scale" in text
    assert "in the probe's screen, a applies the recommendation" in text
    assert "[ ]       redraw more / less often (now every 1 s" in text


async def test_the_help_opens_on_its_keys_with_a_close_hint(monkeypatch):
    monkeypatch.setattr(settings, "mode", "demo")
    app = scripted_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await dashboard_ready(pilot)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        await pilot.pause(0.1)
        assert str(app.screen.query_one("#help-hint", Static).render()) == CLOSE_HINT
        keys = app.screen.query_one("#help-keys", Static)
        assert keys.region.y <= 3 and keys.region.height >= 8  # the keys fill the first page
        assert "quit and stop the demo job" in app.screen.text()
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), what="closed")
