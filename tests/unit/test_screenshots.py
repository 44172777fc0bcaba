"""screenshots/make_screenshots.py: the PNG's braille (the charts) stays in its cells."""

from __future__ import annotations

import importlib.util
import re

from ..helpers import ROOT

SCRIPT = ROOT / "screenshots" / "make_screenshots.py"
spec = importlib.util.spec_from_file_location("make_screenshots", SCRIPT)
shots = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shots)

PLAIN = '<text class="r1" x="12.2" y="20" textLength="36.6" clip-path="url(#line-0)">B_s</text>'
CHART = '<text class="r2" x="100" y="44" textLength="48.8" clip-path="url(#line-1)">⠑⠒ ⣀</text>'


def test_each_braille_character_gets_its_own_cell():
    fixed = shots.braille_in_cells(PLAIN + CHART)
    assert fixed.startswith(PLAIN)  # text that is not braille is left alone
    placed = re.findall(r'x="([\d.]+)" y="44" textLength="([\d.]+)"[^>]*>(.)</text>', fixed)
    assert placed == [("100.0", "12.2", "⠑"), ("112.2", "12.2", "⠒"), ("136.6", "12.2", "⣀")]


def test_the_readme_screenshots_have_no_braille_run_left():
    svg = (ROOT / "screenshots" / "dashboard-120x40.svg").read_text(encoding="utf-8")
    runs = [m["text"] for m in shots.TEXT_RUN.finditer(svg)]
    assert any(shots.has_braille(run) for run in runs)
    fixed = [m["text"] for m in shots.TEXT_RUN.finditer(shots.braille_in_cells(svg))]
    braille = [run for run in fixed if shots.has_braille(run)]
    assert braille and all(len(run) == 1 for run in braille)
