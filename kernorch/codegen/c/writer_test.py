"""The C writer: depth kept across nested blocks, functions ending in their return, flat blocks, column-0 lines,
multi-line texts indented line by line, and C that compiles."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kernorch.codegen.c.writer import CWriter
from kernorch.devtools.mutate import here


def test_blocks_nest_and_close_at_their_depth() -> None:
    w = CWriter()
    with w.function("int f(int n)", returns="s"):
        w.line("int s = 0;")
        with w.block("for (int i = 0; i < n; i++)", comment="every i"):
            w.verbatim("#pragma GCC unroll 2")
            with w.block("if (i % 2)"):
                w.line("s += i;")
            with w.orelse("else if (i % 3)", comment="odd multiples of 3 stay"):
                w.line("s -= i;")
        with w.flat_block("switch (n)"):
            w.line("case 0: return -1;", "default: break;")
    assert w.text(end="\n") == (
        "int f(int n) {\n"
        "    int s = 0;\n"
        "    for (int i = 0; i < n; i++) {  /* every i */\n"
        "#pragma GCC unroll 2\n"
        "        if (i % 2) {\n"
        "            s += i;\n"
        "        } else if (i % 3) {  /* odd multiples of 3 stay */\n"
        "            s -= i;\n"
        "        }\n"
        "    }\n"
        "    switch (n) {\n"
        "    case 0: return -1;\n"
        "    default: break;\n"
        "    }\n"
        "    return s;\n"
        "}\n")


def test_an_else_continues_only_a_block_just_closed() -> None:
    w = CWriter()
    w.line("x = 1;")
    with pytest.raises(ValueError, match="continues a block just closed"), w.orelse():
        pass
    with w.block("if (a)"):
        w.line("x = 2;")
    with w.orelse():
        w.line("x = 3;")
    assert w.lines[1:] == ["if (a) {", "    x = 2;", "} else {", "    x = 3;", "}"]


def test_a_multi_line_text_is_indented_line_by_line_and_empty_lines_stay_empty() -> None:
    w = CWriter(depth=1)
    w.line("a;\n\nb;", "")
    w.extend(["c;"])
    assert w.lines == ["    a;", "", "    b;", "", "    c;"]


def test_a_loop_nest_without_braces_goes_one_level_deeper_per_line() -> None:
    w = CWriter(depth=1)
    w.nest("for (i = 0; i < 2; i++)", "for (j = 0; j < 3; j++)", "a[i][j] = 0;")
    w.line("done();")
    assert w.lines == ["    for (i = 0; i < 2; i++)", "        for (j = 0; j < 3; j++)", "            a[i][j] = 0;",
                       "    done();"]  # fmt: skip


def test_a_function_without_a_return_and_an_exception_inside_a_block_restore_the_depth() -> None:
    w = CWriter()
    try:
        with w.function("void g(void)", returns=None), w.block("if (1)"):
            raise ValueError
    except ValueError:
        pass
    assert w.depth == 0
    with w.function("void h(void)", returns=None):
        w.line("return;")
    assert w.lines[-2:] == ["    return;", "}"]


def test_what_it_writes_compiles(tmp_path: Path) -> None:
    w = CWriter()
    with w.function("int sum(const int *x, int n)", returns="s"):
        w.line("int s = 0;")
        with w.block("for (int i = 0; i < n; i++)"):
            w.line("s += x[i];")
    source = tmp_path / "sum.c"
    source.write_text(w.text(end="\n"))
    subprocess.run(["cc", "-fsyntax-only", "-Wall", "-Werror", str(source)], check=True)


MUTANTS = [
    here("the writer's block leaves its lines at the header's depth",
         "        with self.indented():\n            yield\n        self.line(end)",
         "        yield\n        self.line(end)"),
    here("the writer's function forgets its return",
         '                self.line(f"return {returns};")',
         "                pass"),
]  # fmt: skip
