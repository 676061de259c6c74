"""Grade a mixed class of chapter 1 and print the rate: python benchmarks/grade_class.py [--count 50]

`--course` grades instead one learner's whole course: the right answer of every graded chapter, one notebook
each, and prints each notebook's time next to the wall time of the batch (issues 16 and 30's measure);
`--chapter NN-topic` (repeatable) keeps only those chapters.

`--workers 1,2` grades the same class on a Dask cluster (`minigpt-grade --scheduler`) of each number of worker
processes in turn (a LocalCluster on 127.0.0.1, one notebook at a time per worker), after the local pool, and
prints notebooks per minute for each, the same class graded afresh each time.

The class is built from the tests' submissions (tests/submissions/): every hostile one (loops, memory bomb,
dead kernels, cheats, broken files), every realistic mistake, every different-but-correct answer, the
untouched notebook, and copies of the right answer to make up ``--count``. It is graded by
`minigpt-grade --class` with the default number of parallel runs, and the script prints notebooks per minute
and checks that every submission got a row (exit 1 if one did not).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(ROOT / "src/coursekit/data/tiktoken"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(ROOT / "tests"))

from autograder import base, grade, intake  # noqa: E402
from submissions import apply_edits, hostile, learner_notebook  # noqa: E402
from submissions import ch01_tokens as ch  # noqa: E402


def mixed_class(folder: Path, count: int) -> dict[str, str]:
    """{student: kind} for ``count`` submissions written under ``folder``: correct, wrong and hostile ones in
    turn (so a small class has each kind), then more correct ones once the others run out."""
    import nbformat

    def variant(v):
        return nbformat.writes(learner_notebook(ch.CHAPTER, apply_edits(ch.CHAPTER, v.edits, v.cells)))

    kinds = {
        "correct": [("right-00", hostile.reference_text())] + [(f"variant-{v.key}", variant(v)) for v in ch.VARIANTS],
        "wrong": [(f"wrong-{m.key}", hostile.mutant_text(m.key)) for m in ch.MUTANTS]
        + [("untouched", hostile.untouched_text())],
        "hostile": [(h.key, h.build()) for h in hostile.HOSTILE],
    }
    chosen: dict[str, tuple[str, str]] = {}
    for i in range(count):
        kind = ("correct", "wrong", "hostile")[i % 3]
        if not kinds[kind]:
            kind = "correct"
            kinds[kind].append((f"right-{i:02d}", hostile.reference_text()))
        student, text = kinds[kind].pop(0)
        chosen[student] = (kind, text)
    for student, (_, text) in chosen.items():
        (folder / student).mkdir(parents=True)
        (folder / student / f"{ch.CHAPTER}.ipynb").write_text(text)
    return {student: kind for student, (kind, _) in chosen.items()}


def whole_course(folder: Path, only: list[str] = ()) -> dict[str, str]:
    """{chapter: kind} for one learner, "learner", who hands in the right answer of every graded chapter (or of
    those of ``only``)."""
    import nbformat

    chapters = [ch for ch in intake.graded_chapters(ROOT) if not only or ch in only]
    (folder / "learner").mkdir(parents=True)
    for chapter in chapters:
        nb = learner_notebook(chapter, {})
        (folder / "learner" / f"{chapter}.ipynb").write_text(nbformat.writes(nb))
    return {chapter: "correct" for chapter in chapters}


def course_main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        chapters = whole_course(Path(tmp) / "class", args.chapter)
        out = Path(tmp) / "results.json"
        load = os.getloadavg()[0]
        start = time.monotonic()
        code = grade.main(["--class", str(Path(tmp) / "class"), "--workdir", str(Path(tmp) / "workspace"),
                           "--jobs", str(args.jobs), "--json", str(out), "--quiet"])
        elapsed = time.monotonic() - start
        results = {r["chapter"]: r for r in json.loads(out.read_text())["results"]} if out.is_file() else {}
    print(f"\n## grading: one learner's whole course ({len(chapters)} graded chapters, the right answers), "
          f"sandboxed, {args.jobs} at once; load average before: {load:.2f}\n")
    print("| chapter | status | score | notebook's run |")
    print("|---|---|---|---|")
    for chapter in chapters:
        r = results.get(chapter, {})
        seconds = f"{r['seconds']:.1f} s" if r.get("seconds") is not None else "-"
        print(f"| {chapter} | {r.get('status', 'no result')} | {r.get('score')} / {r.get('max_score')} | {seconds} |")
    runs = sum(r["seconds"] or 0 for r in results.values())
    print(f"\nwall time {elapsed:.0f} s for the batch (start-up, runs side by side, gradebook, feedback pages); "
          f"the notebooks' runs add up to {runs:.0f} s")
    full = [c for c, r in results.items() if r.get("status") == "graded" and r.get("score") == r.get("max_score")]
    if code != 0 or len(full) != len(chapters):
        print(f"\nminigpt-grade exited {code}; not full marks: {sorted(set(chapters) - set(full)) or 'none'}",
              file=sys.stderr)
        return 1
    return 0


def status_counts(results: dict) -> tuple[int, str]:
    """(notebooks graded, the others counted by status: "1 unreadable, 2 wrong-notebook" or "none")."""
    statuses = collections.Counter(r["status"] for r in results.values())
    return statuses["graded"], ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()) if s != "graded") or "none"


def grade_once(tmp: Path, args: argparse.Namespace, *options: str) -> tuple[int, dict, float]:
    """Grade tmp/class afresh into a workspace of its own: (exit code, {student: result}, seconds)."""
    out, workspace = tmp / "results.json", tmp / f"workspace{time.monotonic_ns()}"
    start = time.monotonic()
    code = grade.main(["--class", str(tmp / "class"), "--chapter", ch.CHAPTER, "--workdir", str(workspace),
                       "--jobs", str(args.jobs), "--cell-timeout", str(args.cell_timeout), "--timeout", "300",
                       "--json", str(out), "--quiet", *options])
    elapsed = time.monotonic() - start
    results = {r["student"]: r for r in json.loads(out.read_text())["results"]} if out.is_file() else {}
    out.unlink(missing_ok=True)
    return code, results, elapsed


def workers_main(args: argparse.Namespace) -> int:
    import dask
    from distributed import LocalCluster

    counts = [int(n) for n in args.workers.split(",")]
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as tmp:
        kinds = mixed_class(Path(tmp) / "class", args.count)
        for workers in [0, *counts]:
            if workers == 0:
                code, results, elapsed = grade_once(Path(tmp), args)
                label = f"here, {args.jobs} at once (no cluster)"
            else:
                with dask.config.set({"distributed.worker.daemon": False}), \
                        LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                     dashboard_address=":0", host="127.0.0.1") as cluster:
                    code, results, elapsed = grade_once(Path(tmp), args, "--scheduler", cluster.scheduler_address)
                label = f"Dask, {workers} worker{'s' * (workers > 1)} of one notebook at a time"
            failed |= code != 0 or set(results) != set(kinds)
            graded, others = status_counts(results)
            rows.append((label, len(results), graded, others, elapsed))
    print(f"\n## grading on a Dask cluster: a class of {len(kinds)} chapter-1 submissions (correct, wrong and "
          f"hostile in turn), {base.default_jobs()} cores, graded afresh each time\n")
    print("| where | with a result | graded | not gradable (status) | wall time | per minute |")
    print("|---|---|---|---|---|---|")
    for label, n, graded, others, elapsed in rows:
        print(f"| {label} | {n} | {graded} | {others} | {elapsed:.0f} s | {60 * n / elapsed:.1f} |")
    if failed:
        print("\na batch did not give every submission a row", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=50, help="submissions in the class (default 50)")
    parser.add_argument("--jobs", type=int, default=base.default_jobs(), help="notebooks graded at once")
    parser.add_argument("--cell-timeout", type=int, default=30, help="seconds per cell (the loops wait this long)")
    parser.add_argument("--course", action="store_true", help="one learner's whole course instead of a class")
    parser.add_argument("--chapter", action="append", default=[], metavar="NN-topic",
                        help="with --course: only this chapter (repeatable)")
    parser.add_argument("--workers", metavar="N,N", help="also grade on Dask clusters of these numbers of workers")
    args = parser.parse_args(argv)
    if args.course:
        return course_main(args)
    if args.workers:
        return workers_main(args)
    with tempfile.TemporaryDirectory() as tmp:
        kinds = mixed_class(Path(tmp) / "class", args.count)
        code, results, elapsed = grade_once(Path(tmp), args)
    missing = sorted(set(kinds) - set(results))
    graded, others = status_counts(results)
    ran = [r for r in results.values() if r["seconds"] is not None]
    print(f"\n## grading: a class of {len(kinds)} chapter-1 submissions "
          f"({sum(k == 'correct' for k in kinds.values())} correct, {sum(k == 'wrong' for k in kinds.values())} wrong, "
          f"{sum(k == 'hostile' for k in kinds.values())} hostile), {args.jobs} at once, cells limited to "
          f"{args.cell_timeout} s\n")
    print("| submissions | with a result | graded | not gradable (status) | wall time | per minute | slowest notebook |")
    print("|---|---|---|---|---|---|---|")
    slowest = max((r["seconds"] for r in ran), default=0)
    print(f"| {len(kinds)} | {len(results)} | {graded} | {others} | {elapsed:.0f} s "
          f"| {60 * len(kinds) / elapsed:.1f} | {slowest:.0f} s |")
    if code != 0 or missing:
        print(f"\nminigpt-grade exited {code}; no result for: {', '.join(missing) or 'none'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
