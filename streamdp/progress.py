"""Progress bars for the long steps of the command line (tqdm, on standard error).

A bar is drawn only when standard error is a terminal and progress is not switched off
(``--no-progress`` on the commands that have long steps, or the environment variable
``STREAMDP_NO_PROGRESS=1``). It never writes to standard output, so ``streamdp produce``'s
summary, ``streamdp simulate --json`` and the benchmarks' tables stay machine-readable
whatever the terminal. Numerical code does not import this module: it takes an optional
``progress`` callback and the command line passes a bar's ``update``.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, TypeVar

T = TypeVar("T")

#: set by :func:`disable` (the ``--no-progress`` flags)
_switched_off = False


def disable(off: bool = True) -> None:
    """Switch progress bars off (``off=True``) or back on for this process."""
    global _switched_off
    _switched_off = bool(off)


def enabled() -> bool:
    """Whether a bar would be drawn now: not switched off, and standard error is a terminal."""
    if _switched_off or os.environ.get("STREAMDP_NO_PROGRESS", "").strip() not in ("", "0"):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):     # replaced or closed stream
        return False


def bar(iterable: Iterable[T] | None = None, *, total: float | None = None, desc: str = "",
        unit: str = "it", leave: bool = False, **kw):
    """A tqdm bar on standard error, or a silent stand-in when :func:`enabled` is false.

    Iterate over it, or call ``update(n)`` and ``close()`` (it is also a context manager).
    ``leave=False`` by default: the bar is erased when done, and the command's own summary
    line says what happened."""
    from tqdm import tqdm
    kw.setdefault("unit_scale", unit == "doc")      # 12.3k doc/s; runs and items as counts
    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, file=sys.stderr,
                disable=not enabled(), dynamic_ncols=True, mininterval=0.2, **kw)


def message(text: str) -> None:
    """Print ``text`` to standard error without breaking a bar being drawn there."""
    if enabled():
        from tqdm import tqdm
        tqdm.write(text, file=sys.stderr)
    else:
        print(text, file=sys.stderr, flush=True)


def add_flag(parser) -> None:
    """``--no-progress`` on an argparse parser (pair with :func:`apply_flag` after parsing)."""
    parser.add_argument("--no-progress", dest="no_progress", action="store_true",
                        help="no progress bars (they go to standard error, and only when it is "
                             "a terminal; also STREAMDP_NO_PROGRESS=1)")


def apply_flag(args) -> None:
    if getattr(args, "no_progress", False):
        disable()
