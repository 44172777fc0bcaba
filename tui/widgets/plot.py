"""A plotext chart that builds its picture only when its figure, size or theme changed.

plotext builds the whole picture on every ``render`` (milliseconds per chart), and Textual
renders every widget again on each layout pass — a panel whose text changed height is
enough — so without this the charts were rebuilt several times a second with nothing new.
"""

from __future__ import annotations

from rich.console import RenderableType
from textual_plotext import PlotextPlot


class CachedPlot(PlotextPlot):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._generation = 0
        self._picture: tuple[object, RenderableType] | None = None

    def redraw(self) -> None:
        """The figure changed (``plt`` was drawn on): build it at the next render."""
        self._generation += 1
        self.refresh()

    def render(self) -> RenderableType:
        key = (self._generation, self.size, self.app.theme, self.theme)
        if self._picture is None or self._picture[0] != key:
            self._picture = (key, super().render())
        return self._picture[1]
