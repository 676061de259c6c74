"""Generate the learner notebooks (notebooks/) from the instructor notebooks (solutions/) with nbgrader.

    python -m autograder.publish.release            # regenerate notebooks/<chapter>/ for every chapter (make notebooks)
    python -m autograder.publish.release --check    # exit 1 if notebooks/ differs from what nbgrader generates

nbgrader runs `generate_assignment` in a temporary workspace (so the course's own gradebook is untouched),
and the result replaces notebooks/<chapter>/. The committed notebooks/ must always equal that output: the
tests run --check.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from autograder.base import DEFAULT_COURSE_ROOT
from autograder.intake import course_chapters
from autograder.workspace import copy_sources, log_tail, nbgrader_steps, write_config


def generate(course_root: Path, workdir: Path) -> Path:
    """Run nbgrader's generate_assignment for every chapter in ``workdir`` (a new folder); return its release."""
    chapters = course_chapters(course_root)
    workdir.mkdir(parents=True)
    write_config(workdir)
    copy_sources(workdir, course_root, chapters)
    steps = [["generate_assignment", ch, "--force"] for ch in chapters]
    for ch, (code, output) in zip(chapters, nbgrader_steps(workdir, steps)):
        if code != 0:
            raise SystemExit(f"nbgrader generate_assignment {ch} failed:\n{log_tail(output)}")
    return workdir / "notebooks"


def _files(folder: Path) -> dict[str, Path]:
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*"))
            if p.is_file() and ".ipynb_checkpoints" not in p.parts}


def differences(generated: Path, committed: Path) -> list[str]:
    want, have = _files(generated), _files(committed) if committed.is_dir() else {}
    out = [f"notebooks/{n}: missing" for n in want if n not in have]
    out += [f"notebooks/{n}: not generated from solutions/ (remove it)" for n in have if n not in want]
    for name in sorted(set(want) & set(have)):
        a, b = want[name], have[name]
        same = (json.loads(a.read_text()) == json.loads(b.read_text()) if name.endswith(".ipynb")
                else a.read_bytes() == b.read_bytes())
        if not same:
            out.append(f"notebooks/{name}: differs from what nbgrader generates from solutions/")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.publish.release", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if notebooks/ is out of date")
    parser.add_argument("--course-root", type=Path, default=DEFAULT_COURSE_ROOT)
    args = parser.parse_args(argv)
    root = args.course_root.resolve()
    with tempfile.TemporaryDirectory(prefix="minigpt-release-") as tmp:
        generated = generate(root, Path(tmp) / "course")
        diffs = differences(generated, root / "notebooks")
        if args.check:
            print("\n".join(diffs) or "notebooks/ is in sync with solutions/")
            if diffs:
                print("run `make notebooks` to regenerate them")
            return 1 if diffs else 0
        for chapter in course_chapters(root):
            target = root / "notebooks" / chapter
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(generated / chapter, target)
        for stale in (root / "notebooks").iterdir():
            if stale.is_dir() and stale.name not in course_chapters(root):
                print(f"note: notebooks/{stale.name} has no chapter in solutions/; remove it if it is stale")
        print("\n".join(diffs) or "notebooks/ was already in sync")
        return 0


if __name__ == "__main__":
    sys.exit(main())
