"""Say on the console why the book build failed: each page whose notebook stopped on an error, the line of its Markdown
source where the failing cell starts, and the error with the lines of the cell that raised it.

    python tools/build_failures.py --since SECONDS [--html _build/html]

myst-nb writes the traceback of a page it could not execute to ``_build/html/reports/<page>.err.log`` and logs only
that path, among the warnings that the missing outputs then cause on the same page (``glue`` keys not found). The
Makefile's ``course`` runs this after a failed build; the reports of earlier builds (older than ``--since``, the
build's start) are left out.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RULE = "-" * 18  # nbclient's rule around the failing cell's source ("------------------")


def failure(report: Path, html: Path) -> str:
    """'book/08-training.md, the cell at line 168: <the traceback's last frame and error>' for one report."""
    text = ANSI.sub("", report.read_text(encoding="utf-8", errors="replace"))
    page = report.relative_to(html / "reports").with_suffix("").with_suffix(".md")
    source_parts = text.split(RULE)
    source = source_parts[1].strip("\n") if len(source_parts) > 2 else ""
    where = ""
    if source and (ROOT / page).is_file():
        markdown = (ROOT / page).read_text(encoding="utf-8")
        at = markdown.find(source.splitlines()[0])
        where = f", the cell at line {markdown.count(chr(10), 0, at) + 1}" if at >= 0 else ""
    trace = source_parts[-1] if len(source_parts) > 2 else text
    lines = [line.rstrip() for line in trace.splitlines() if line.strip() and not set(line.strip()) <= {"-"}]
    return f"{page}{where} failed:\n" + "\n".join(f"    {line}" for line in lines[-14:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", type=float, default=0.0, help="the build's start (seconds since the epoch)")
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    args = parser.parse_args(argv)
    reports = sorted(p for p in (args.html / "reports").rglob("*.err.log") if p.stat().st_mtime >= args.since)
    if not reports:
        print("The book build failed; no page's notebook raised: the warnings above say why.", file=sys.stderr)
        return 0
    print(f"\nThe book build failed: {len(reports)} page(s) stopped on an error (the warnings above that name a glue "
          "key follow from it).", file=sys.stderr)
    for report in reports:
        print(failure(report, args.html), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
