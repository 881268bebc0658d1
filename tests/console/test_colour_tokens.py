"""The console's colours live in one place: the two :root blocks of static/console/console.css (light and
dark), whose pairings test_accessibility.py checks for contrast. A colour written anywhere else (a rule of
the stylesheet, a template's style, a script's chart option) escapes that check and the dark theme."""

from __future__ import annotations

import re

from tests.helpers.gateway_server import ROOT

CSS = ROOT / "static" / "console" / "console.css"
COLOUR = re.compile(r"#[0-9a-fA-F]{3,8}\b|\b(?:rgb|hsl)a?\([^)]*\)")
SHADOW = re.compile(r"rgba\(\s*0\s*,\s*0\s*,\s*0\s*,\s*[0-9.]+\s*\)")  # black shadows and backdrops
QUOTED = re.compile(r"""["'`](#[0-9a-fA-F]{3,8}|(?:rgb|hsl)a?\([^)]*\))["'`]""")
INLINE = re.compile(r"""style\s*=\s*["'][^"']*(#[0-9a-fA-F]{3,8}|(?:rgb|hsl)a?\()""")


def test_the_stylesheet_names_colours_only_in_its_root_blocks():
    text = CSS.read_text()
    roots = re.findall(r":root\s*\{[^}]*\}", text)
    assert len(roots) == 2, "console.css has a light :root block and a dark one"
    rest = SHADOW.sub("", re.sub(r":root\s*\{[^}]*\}", "", text))
    rest = re.sub(r"/\*.*?\*/", "", rest, flags=re.S)
    assert COLOUR.findall(rest) == [], "colours outside :root: use a token (var(--...))"
    light, dark = (set(re.findall(r"(--[a-z-]+)\s*:", block)) for block in roots)
    assert light == dark, f"a token defined in one theme only: {sorted(light ^ dark)}"


def test_the_other_stylesheets_name_no_colour():
    found = []
    for path in (ROOT / "static" / "console").glob("*.css"):
        if path != CSS:
            text = re.sub(r"/\*.*?\*/", "", SHADOW.sub("", path.read_text()), flags=re.S)
            found += [f"{path.relative_to(ROOT)}: {c}" for c in COLOUR.findall(text)]
    assert found == [], "colours belong in console.css's :root blocks"


def test_templates_and_scripts_use_no_colour_of_their_own():
    found = []
    paths = [*(ROOT / "templates" / "console").glob("*.html"), *(ROOT / "static" / "console").glob("*.js")]
    for path in paths:
        text = path.read_text()
        for pattern in (QUOTED, INLINE):
            found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(text)]
    assert found == [], "use the CSS tokens (getComputedStyle(...).getPropertyValue('--ok') in a script)"
