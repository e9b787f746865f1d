"""The book's figures in colours everyone can tell apart (WCAG 2.1 AA, 1.4.11).

- The palette: book/course.mplstyle's colour cycle (every page's kernel reads it:
  scripts/build_book.py points MATPLOTLIBRC at it). Each colour is at least 4.5:1 on the
  white figure background (3:1 is AA's rule for the marks that carry data; 4.5:1 lets a
  label be written in its line's colour and white text sit on its bar), also as the dark
  theme shows a figure (pydata-sphinx-theme dims images: brightness(.8) contrast(1.2)).
  The first five, the ones most figures use together, stay apart for readers with
  protanopia, deuteranopia or tritanopia (simulated with Machado et al. 2009, CIELAB).
- The pages: every colour literal in a code cell of a chapter page (a named colour, a hex
  code, a grey level, a cycle colour "C0".."C9" resolved through the palette) is at least
  3:1 on white. White (and "none") is allowed: it only separates bars, fills an empty
  slot drawn with an outline, or is text on a dark bar or a label's background.

Reads the sources only; no build.
"""

from __future__ import annotations

import ast
import io
import itertools
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest
from site_helpers import contrast_ratio, srgb_linear

mcolors = pytest.importorskip("matplotlib.colors")
mpl = pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
STYLE = ROOT / "book" / "course.mplstyle"
PAGES = sorted((ROOT / "book").glob("0[1-9]_*/*.md"))
WHITE = (1.0, 1.0, 1.0)
MARKS = 3.0  # WCAG 2.1 AA, non-text contrast
TEXT = 4.5  # WCAG 2.1 AA, normal text
ALLOWED_LIGHT = {"white", "w", "#fff", "#ffffff", "none"}
DISTINCT = 5  # C0..C4 must stay apart under colour-blindness
MIN_DELTA_E = 10.0  # CIE76 distance between two of them, simulated

CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)
# A grey level ("0.45") or a one-letter colour ("k") counts only as a colour keyword's value.
COLOUR_KWARG = re.compile(
    r"""\b(?:color|colors|c|fc|ec|facecolor|edgecolor|markerfacecolor|markeredgecolor|mfc|mec)"""
    r"""\s*=\s*$""")
HEX = re.compile(r"#(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})")
CYCLE = re.compile(r"C\d")
# Qualitative colour maps whose light members fail 3:1 (the book's palette replaces them).
LIGHT_MAPS = re.compile(
    r"""get_cmap\(\s*["'](tab10|tab20[bc]?|Pastel[12]|Set[123]|Accent|Paired)""")


def dark_theme(rgb: tuple[float, float, float]) -> tuple[float, float, float]:
    """A colour as pydata-sphinx-theme's dark mode shows an image: brightness(.8), then
    contrast(1.2), on each sRGB channel."""
    return tuple(min(1.0, max(0.0, (0.8 * c - 0.5) * 1.2 + 0.5)) for c in rgb)  # type: ignore[return-value]


# -- colour-blindness simulation (Machado, Oliveira and Fernandes 2009, severity 1) -----

MACHADO = {
    "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216),
                   (-0.003882, -0.048116, 1.051998)),
    "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413),
                     (-0.011820, 0.042940, 0.968881)),
    "tritanopia": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602),
                   (0.004733, 0.691367, 0.303900)),
}


def _lab(linear: tuple[float, ...]) -> tuple[float, float, float]:
    r, g, b = linear
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def seen_as(rgb: tuple[float, float, float], vision: str) -> tuple[float, float, float]:
    """CIELAB of a colour as a reader with ``vision`` ("normal" or a MACHADO key) sees it."""
    linear = tuple(srgb_linear(c) for c in rgb)
    if vision != "normal":
        linear = tuple(min(1.0, max(0.0, sum(m * c for m, c in zip(row, linear, strict=True))))
                       for row in MACHADO[vision])
    return _lab(linear)


def delta_e(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    return sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5


# -- the palette and the pages ---------------------------------------------------------

def palette() -> list[str]:
    params = mpl.rc_params_from_file(str(STYLE), use_default_template=False)
    return list(params["axes.prop_cycle"].by_key()["color"])


def resolve(colour: str, cycle: list[str]) -> tuple[float, float, float]:
    if CYCLE.fullmatch(colour):
        return mcolors.to_rgb(cycle[int(colour[1:]) % len(cycle)])
    return mcolors.to_rgb(colour)


def _strings(code: str) -> Iterator[tuple[int, str, str]]:
    """(line, value, the text before it on its line) of each plain string literal in a
    cell's code (f-strings are left out: what they hold is decided when they run)."""
    lines = code.splitlines()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens = []  # not Python (a shell escape, a magic): nothing to check
    for token in tokens:
        if token.type != tokenize.STRING or re.match(r"[a-zA-Z]*[fF]", token.string):
            continue
        try:
            value = ast.literal_eval(token.string)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str):
            line, column = token.start
            yield line, value, lines[line - 1][:column]


def colour_literals(text: str) -> list[tuple[int, str]]:
    """(line in the page, literal) for each colour written in a page's code cells."""
    named = mcolors.get_named_colors_mapping()
    found: list[tuple[int, str]] = []
    for cell in CODE_CELL.finditer(text):
        first = text.count("\n", 0, cell.start(1)) + 1
        body = cell.group(1)
        if body.startswith("---\n"):  # the cell's YAML metadata: captions, alt text
            end = body.find("\n---\n", 4) + 5
            body = "\n" * body.count("\n", 0, end) + body[end:]
        code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                         for line in body.splitlines())
        for line, value, before in _strings(code):
            if ((len(value) > 1 and value in named) or HEX.fullmatch(value)
                    or CYCLE.fullmatch(value)
                    or (COLOUR_KWARG.search(before) and mcolors.is_color_like(value))):
                found.append((first + line - 1, value))
    return found


def test_contrast_formula() -> None:
    assert contrast_ratio(WHITE, (0.0, 0.0, 0.0)) == pytest.approx(21)
    assert contrast_ratio(mcolors.to_rgb("#767676"), WHITE) == pytest.approx(4.54, abs=0.01)
    assert contrast_ratio(mcolors.to_rgb("tab:orange"), WHITE) == pytest.approx(2.53, abs=0.01)
    assert contrast_ratio(mcolors.to_rgb("silver"), WHITE) == pytest.approx(1.82, abs=0.01)
    assert dark_theme(WHITE) == pytest.approx((0.86, 0.86, 0.86))


def test_the_scan_finds_colours() -> None:
    page = ('```{code-cell} ipython3\n---\nmystnb:\n  image:\n    alt: a grey "red" line\n'
            '---\nax.plot(x, color="tab:orange")\nax.bar(x, y, color="C1", ec="0.8")\n'
            'lengths = {"c": 1}\nax.grid(axis="y")\nbox(f"{n}\\n", "#fce5cd")\n```\n')
    assert sorted(colour_literals(page)) == [(7, "tab:orange"), (8, "0.8"), (8, "C1"),
                                            (11, "#fce5cd")]


def test_the_style_is_what_the_build_reads() -> None:
    build = (ROOT / "scripts" / "build_book.py").read_text(encoding="utf-8")
    assert 'MPL_STYLE = ROOT / "book" / "course.mplstyle"' in build
    assert 'env["MATPLOTLIBRC"] = str(MPL_STYLE)' in build


@pytest.mark.parametrize("background", ["white", "dark theme"])
def test_palette_contrast(background: str) -> None:
    shown = (lambda c: c) if background == "white" else dark_theme
    low = {colour: round(contrast_ratio(shown(mcolors.to_rgb(colour)), shown(WHITE)), 2)
           for colour in palette()}
    assert len(low) >= 10
    assert {c: r for c, r in low.items() if r < TEXT} == {}, low


@pytest.mark.parametrize("vision", ["normal", *MACHADO])
def test_palette_first_colours_stay_apart(vision: str) -> None:
    colours = palette()[:DISTINCT]
    seen = {c: seen_as(mcolors.to_rgb(c), vision) for c in colours}
    close = [(a, b, round(delta_e(seen[a], seen[b]), 1))
             for a, b in itertools.combinations(colours, 2)
             if delta_e(seen[a], seen[b]) < MIN_DELTA_E]
    assert close == []


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT / "book").as_posix()
                                            for p in PAGES])
def test_page_colours_meet_3_to_1(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    cycle = palette()
    low = [(line, colour, round(contrast_ratio(resolve(colour, cycle), WHITE), 2))
           for line, colour in colour_literals(text)
           if colour.lower() not in ALLOWED_LIGHT
           and contrast_ratio(resolve(colour, cycle), WHITE) < MARKS]
    assert low == [], f"{page.name}: colours below {MARKS}:1 on white (line, colour, ratio)"
    assert not LIGHT_MAPS.search(text), "use the book's palette (axes.prop_cycle)"
