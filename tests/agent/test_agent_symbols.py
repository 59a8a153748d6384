"""Code outlines: every kind of definition of each language, with its lines and nesting, and
the file suffixes that choose the language."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.agent.symbols import Symbol, language_for, outline
from ds4mlx.agent.workspace import ToolError

import pytest

C = b"""struct point { int x; };
union value { int i; float f; };
enum color { RED, GREEN };
typedef struct point point_t;
typedef int (*handler)(int);
struct point *make(void);
struct point *origin(void) { return 0; }
static int (*pick(int n))(int) { return 0; }
int use(struct point p) { return p.x; }
"""

JAVASCRIPT = b"""function plain() {}
function* gen() {}
class Box { open() {} }
const arrow = () => 1;
const expr = function () {};
const g = function* () {};
const value = 3;
"""

GO = b"""package main
type Point struct { X int }
func (p Point) Norm() int { return 0 }
func main() {}
"""

RUST = b"""mod shapes {
    pub struct Square;
    pub enum Kind { A }
    pub trait Area { fn area(&self) -> f64; }
    impl Area for Square { fn area(&self) -> f64 { 1.0 } }
}
fn main() {}
"""

PYTHON = b"""class A:
    def m(self):
        pass

async def f():
    pass
"""


# Every kind of definition of each language: kind, name, first-last line, nesting depth. In C,
# `handler` stands behind a parenthesised pointer declarator, line 6 declares without a body (no
# definition) and `struct point p` on line 9 names the struct without defining it.
OUTLINES = {
    "c": (
        C,
        """\
struct point 1-1 0
union value 2-2 0
enum color 3-3 0
typedef point_t 4-4 0
typedef handler 5-5 0
function origin 7-7 0
function pick 8-8 0
function use 9-9 0
""",
    ),
    "javascript": (
        JAVASCRIPT,
        """\
function plain 1-1 0
function gen 2-2 0
class Box 3-3 0
method open 3-3 1
function arrow 4-4 0
function expr 5-5 0
function g 6-6 0
""",
    ),
    "go": (
        GO,
        """\
type Point 2-2 0
method Norm 3-3 0
function main 4-4 0
""",
    ),
    "rust": (
        RUST,
        """\
module shapes 1-6 0
struct Square 2-2 1
enum Kind 3-3 1
trait Area 4-4 1
impl impl Square 5-5 1
function area 5-5 2
function main 7-7 0
""",
    ),
}


@pytest.mark.parametrize("language", list(OUTLINES))
def test_every_kind_of_definition_with_its_lines_and_nesting(language):
    source, expected = OUTLINES[language]
    found = outline(source, language)
    assert "".join(f"{s.kind} {s.name} {s.start_line}-{s.end_line} {s.depth}\n" for s in found) == (
        expected
    )


def test_python_lines_are_one_based_and_inclusive():
    assert outline(PYTHON, "python") == [
        Symbol("class", "A", 1, 3, 0),
        Symbol("function", "m", 2, 3, 1),
        Symbol("function", "f", 5, 6, 0),
    ]


def test_a_cancelled_outline_stops_with_a_tool_error():
    with pytest.raises(ToolError, match="stopped by the user"):
        outline(PYTHON, "python", cancelled=lambda: True)


@pytest.mark.parametrize(
    ("name", "language"),
    [
        ("a.py", "python"),
        ("a.pyi", "python"),
        ("A.PY", "python"),
        ("a.c", "c"),
        ("a.h", "c"),
        ("a.js", "javascript"),
        ("a.mjs", "javascript"),
        ("a.cjs", "javascript"),
        ("a.jsx", "javascript"),
        ("a.go", "go"),
        ("a.rs", "rust"),
        ("a.ts", None),
        ("Makefile", None),
    ],
)
def test_the_suffix_chooses_the_language(name, language):
    assert language_for(Path("src") / name) == language
