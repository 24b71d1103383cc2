"""The `kernorch` command line (`python -m kernorch.cli`). Exit codes: 0 ok, 1 check/mismatch failed, 2 bad
input (and a kernorch bug: "internal error", its traceback with KERNORCH_DEBUG=1) — an error is one line
naming its cause, never a traceback. The parser is parser.py, the subcommands
commands.py and explain.py, what they share common.py."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from kernorch.cli.parser import build_parser
from kernorch.errors import KernorchError


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    from kernorch.errors import KernorchWarning

    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    with warnings.catch_warnings(record=True) as caught:  # kernorch's warnings are about the model: one line
        warnings.simplefilter("always", KernorchWarning)
        try:
            code = handler(args)
        except KernorchError as error:  # the error alone names the cause (a fallback's failure says so)
            print(f"kernorch: error: {error}", file=sys.stderr)
            return error.exit_code
        except Exception as error:  # a bug in kernorch: one line too (the traceback on request), exit 2
            if os.environ.get("KERNORCH_DEBUG"):
                raise
            first = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
            print(f"kernorch: internal error: {type(error).__name__}: {first} (a kernorch bug; please report it; "
                  "KERNORCH_DEBUG=1 prints the traceback)", file=sys.stderr)  # fmt: skip
            return 2
    for warning in caught:
        if issubclass(warning.category, KernorchWarning):
            print(f"kernorch: warning: {warning.message}", file=sys.stderr)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    return code


__all__ = ["build_parser", "main"]
