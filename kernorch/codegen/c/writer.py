"""C source written through one indenting buffer (the C counterpart of the Triton renderer's writer): an emitter
says what it writes — a statement, a block, a function — and the writer keeps the depth, opens and closes the
braces and ends a function with its return. No emitter indents by hand or counts its closing braces.

    w = CWriter()
    with w.function(f"static int {name}_run(void *state, void *stream, void **a)"):
        w.line("(void)stream;")
        with w.block("for (long i = 0; i < n; i++)"):
            w.line("out[i] = in[i];")
    source = w.text()  # ... "    return 0;\\n}"
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

INDENT = "    "


class CWriter:
    def __init__(self, depth: int = 0) -> None:
        self.lines: list[str] = []
        self.depth = depth

    def line(self, *texts: str) -> None:
        """Each text as a line at the current depth (every line of a multi-line text; an empty text is an empty
        line, with no indentation)."""
        for text in texts:
            for part in text.split("\n"):
                self.lines.append(INDENT * self.depth + part if part else "")

    def extend(self, texts: Iterable[str]) -> None:
        self.line(*texts)

    def nest(self, *texts: str) -> None:
        """Each text one level deeper than the one before: loops without braces, then the statement they run."""
        for level, text in enumerate(texts):
            with self.indented(level):
                self.line(text)

    def verbatim(self, *texts: str) -> None:
        """Lines written as they are, at column 0 whatever the depth: preprocessor directives, and text that
        carries its own layout (a shared preamble)."""
        self.lines.extend(texts)

    @contextmanager
    def indented(self, levels: int = 1) -> Iterator[None]:
        """The lines inside one level deeper: a statement's continuation, or the body of a loop without braces."""
        self.depth += levels
        try:
            yield
        finally:
            self.depth -= levels

    @contextmanager
    def block(self, header: str, end: str = "}", comment: str = "") -> Iterator[None]:
        """`header {` (and `/* comment */`), the lines inside one level deeper, then `end` (`}` or `};`,
        `} while (...);`)."""
        self.line((f"{header} {{" if header else "{") + (f"  /* {comment} */" if comment else ""))
        with self.indented():
            yield
        self.line(end)

    @contextmanager
    def orelse(self, header: str = "else", comment: str = "") -> Iterator[None]:
        """`} else {` (or `} else if (...) {`) continuing the block just closed, the lines inside, then `}`."""
        if not self.lines or self.lines[-1].strip() != "}":
            raise ValueError("an else continues a block just closed")
        self.lines[-1] += f" {header} {{" + (f"  /* {comment} */" if comment else "")
        with self.indented():
            yield
        self.line("}")

    @contextmanager
    def flat_block(self, header: str, end: str = "}") -> Iterator[None]:
        """`header {` with the lines inside at the header's own depth, then `end`: a switch whose cases sit at its
        depth, a parallel region whose body keeps the function's."""
        self.line(f"{header} {{" if header else "{")
        yield
        self.line(end)

    @contextmanager
    def function(self, signature: str, returns: str | None = "0") -> Iterator[None]:
        """A function: its body, then `return <returns>;` (None: the body returns itself) and the closing brace."""
        with self.block(signature):
            yield
            if returns is not None:
                self.line(f"return {returns};")

    def text(self, end: str = "") -> str:
        """The lines joined, followed by `end` ("\\n" for a unit that ends with a newline)."""
        return "\n".join(self.lines) + end
