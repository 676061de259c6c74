"""What people read: the table in the terminal, ``grades.csv``, each learner's feedback page and nbgrader's
feedback pages. Learner text reaches each only made inert (``autograder.inert``): escaped for the terminal and
HTML, formula-safe for the spreadsheet, cleaned markdown for nbgrader's pages. The feedback shows what the checks
said, never their code (hidden tests are cut out), and waits while an earlier chapter is open."""
from __future__ import annotations

import csv
import html
import json
import shutil
import sys
import traceback
from pathlib import Path

import nbformat

from autograder import inert
from autograder.base import ANSI_ESCAPE, Result, Submission, points, warn
from autograder.intake import EXCHANGE_RECEIPT
from autograder.run import cut_hidden_tests
from autograder.workspace import Workspace, atomic_write, autograded_path, feedback_path, log_tail, submitted_path

HIDDEN_NOTE = "# (hidden tests ran here; what they found is below)\n"


def feedback_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The autograded notebook as a learner may see it: hidden tests cut out, errors without tracebacks, markdown
    made inert."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.source = cut_hidden_tests(cell.source, HIDDEN_NOTE)
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                out["traceback"] = [f"{out.get('ename', 'Error')}: {ANSI_ESCAPE.sub('', out.get('evalue', ''))}"]
    return inert.notebook(nb)


class FeedbackPages:
    """nbgrader's feedback page of each graded submission, made from the learner's view of its notebook: ``ask``
    for one as soon as its scores are recorded, and the workspace's nbgrader process makes it while other notebooks
    are still running; ``wait`` for them all (a page that fails is said, its scores are unaffected)."""

    def __init__(self, ws: Workspace):
        self.ws, self.asked = ws, []

    def ask(self, s: Submission) -> None:
        try:
            self._ask(s)
        except Exception as err:  # noqa: BLE001 (a page we cannot make costs that page alone, never the batch)
            warn(f"the feedback page of {s.student} {s.chapter} could not be made ({type(err).__name__}: "
                 f"{str(err)[:200]}); its scores are unaffected")

    def _ask(self, s: Submission) -> None:
        ws, ch = self.ws, s.chapter
        nb = nbformat.read(autograded_path(ws.root, s.student, ch), as_version=4)
        dest = ws.root / "feedback-source" / s.student / ch / f"{ch}.ipynb"
        if dest.parent.exists():
            shutil.rmtree(dest.parent)
        dest.parent.mkdir(parents=True)
        nbformat.write(feedback_notebook(nb), dest)
        for name in EXCHANGE_RECEIPT:  # generate_feedback copies them beside the page, for release_feedback
            receipt = submitted_path(ws.root, s.student, ch).parent / name
            if receipt.is_file():
                shutil.copyfile(receipt, dest.parent / name)
        args = ["generate_feedback", ch, "--force", "--CourseDirectory.autograded_directory=feedback-source",
                "--student", s.student]
        self.asked.append((args, ws.nbgrader().submit(args)))

    def wait(self) -> None:
        for args, index in self.asked:
            code, output = self.ws.nbgrader().result(index)
            if code != 0:
                warn(f"nbgrader {' '.join(args[:2])} --student {args[-1]} failed (scores are unaffected):\n"
                     f"{log_tail(output)}")
        self.asked = []


def learner_page(student: str, results: list[Result], root: Path) -> str:
    """One learner's summary: a row per chapter, and the reason for every lost point."""
    e = html.escape
    rows, details = [], []
    for r in results:
        score = f"{points(r.score)} / {points(r.max_score)}"
        status = {"graded": "graded"}.get(r.status, f"{r.status}: {r.detail}")
        if r.status == "graded" and r.detail:
            status = f"graded; {r.detail}"
        if r.status == "graded" and r.needs_manual_grade:
            status += "; some cells wait for the instructor"
        if r.withheld:
            rows.append(f"<tr><td>{e(r.chapter)}</td><td>{e(score)}</td><td>{e(r.withheld)}</td></tr>")
            continue
        link = ""
        fb = feedback_path(root, student, r.chapter)
        if r.status == "graded" and fb.is_file():
            link = f' (<a href="{e(r.chapter)}/{e(r.chapter)}.html">the notebook with its results</a>)'
        rows.append(f"<tr><td>{e(r.chapter)}</td><td>{e(score)}</td><td>{e(status)}{link}</td></tr>")
        if r.cell_errors:
            items = "".join(f"<li><pre>{e(msg)}</pre></li>" for msg in r.cell_errors)
            details.append(f"<h2>{e(r.chapter)}: errors in your own cells</h2><ul>{items}</ul>")
        if r.lost:
            items = "".join(
                f"<li><code>{e(lp.grade_id)}</code> ({points(lp.score)} / {points(lp.max_score)}): "
                f"<pre>{e(lp.message)}</pre></li>" for lp in r.lost)
            details.append(f"<h2>{e(r.chapter)}: what lost points</h2><ul>{items}</ul>")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>minigpt feedback: {e(student)}</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.3em .8em;"
        "border-bottom:1px solid #ddd;text-align:left}pre{white-space:pre-wrap;margin:.2em 0}</style></head><body>"
        f"<h1>Feedback for {e(student)}</h1><table><tr><th>chapter</th><th>score</th><th>status</th></tr>"
        + "".join(rows) + "</table>" + "".join(details) + "</body></html>\n"
    )


def workspace_results(ws: Workspace, current: list[Result]) -> list[Result]:
    """Every result the workspace holds, whichever run graded it, with this run's rows in place of older ones (a
    missing chapter has no record): the reports of a class, however it was graded, chapter by chapter."""
    rows: dict[tuple[str, str], Result] = {}
    for path in ws.root.glob("results/*/*.json"):
        try:
            r = Result.from_dict(json.loads(path.read_text())["result"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        fb = feedback_path(ws.root, r.student, r.chapter)
        r.feedback = str(fb) if r.status == "graded" and fb.is_file() else None
        rows[r.student, r.chapter] = r
    rows.update({(r.student, r.chapter): r for r in current})
    return [rows[key] for key in sorted(rows)]


def write_reports(ws: Workspace, results: list[Result]) -> Path:
    """grades.csv (a row per student and chapter) and feedback/<student>/index.html."""
    by_student: dict[str, list[Result]] = {}
    for r in results:
        by_student.setdefault(r.student, []).append(r)
    for student, rs in by_student.items():
        try:  # (one learner's page that cannot be made costs that page alone)
            page = learner_page(student, rs, ws.root)
        except Exception as err:  # noqa: BLE001
            warn(f"{student}: the grader failed at the summary page:\n{traceback.format_exc()}")
            page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'></head><body><p>This page could not "
                    f"be made ({html.escape(type(err).__name__)}): ask your instructor.</p></body></html>\n")
        atomic_write(ws.root / "feedback" / student / "index.html", page)
    table = ws.root / "grades.csv"
    with open(table, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "chapter", "status", "score", "max_score", "lost", "detail", "review", "isolation"])
        for r in results:
            w.writerow(inert.csv_cell(v) for v in [
                r.student, r.chapter, r.status, points(r.score, ""), points(r.max_score, ""),
                "; ".join(f"{lp.grade_id} {points(lp.score)}/{points(lp.max_score)}" for lp in r.lost),
                r.detail, " | ".join(r.review), r.isolation])
    return table


def format_table(results: list[Result]) -> str:
    rows = [("student", "chapter", "score", "")]
    notes: dict[int, list[str]] = {}
    for r in results:
        status = "" if r.status == "graded" else f"{r.status}: {r.detail}"
        if r.status == "graded" and r.detail:
            status = r.detail
        if r.status == "graded" and r.needs_manual_grade:
            status = (status + "; " if status else "") + "needs manual grading"
        if r.withheld:
            status = (status + "; " if status else "") + r.withheld
        if r.isolation == "none":
            status = "NOT ISOLATED" + (f"; {status}" if status else "")
        rows.append(tuple(map(inert.terminal, (r.student, r.chapter, f"{points(r.score)} / {points(r.max_score)}",
                                               status))))
        notes[len(rows) - 1] = [inert.terminal(line) for line in [
            f"    {lp.grade_id} ({points(lp.score)} / {points(lp.max_score)}): "
            + lp.message.replace("\n", "\n      ")
            for lp in r.lost
        ] + [f"    error in {e}".replace("\n", "\n      ") for e in r.cell_errors] + [
            f"    review: {note}" for note in r.review] + ([f"    log: {r.log}"] if r.log else [])]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
        lines.extend(notes.get(i, []))
    return "\n".join(line.rstrip() for line in lines)


class Progress:
    """A progress bar on a terminal; a line per finished notebook otherwise (logs, CI)."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled and total > 0
        self.bar = None
        if self.enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="notebook", desc="grading", file=sys.stderr)

    def update(self, r: Result) -> None:
        self.done += 1
        if not self.enabled:
            return
        score = f"{points(r.score)}/{points(r.max_score)}" if r.status == "graded" else r.status
        if self.bar is not None:
            self.bar.set_postfix_str(inert.terminal(f"{r.student} {r.chapter} {score}"), refresh=False)
            self.bar.update(1)
        else:
            took = "" if r.seconds is None else f" ({r.seconds:.0f} s)"
            line = f"minigpt-grade: [{self.done}/{self.total}] {r.student} {r.chapter}: {score}{took}"
            print(inert.terminal(line), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def withheld_because(chapter: str, open_chapters: list[str]) -> str:
    """Why a graded notebook's feedback must wait, or ''. A chapter's notebook builds on the reference of the
    chapters before it, which its sandbox therefore holds (never its own chapter's); whatever the notebook prints,
    its feedback shows. So while an earlier chapter is still open (its deadline not passed), the feedback of a
    later one could hand out that chapter's answers: it is withheld until a run without that chapter in
    ``--open`` writes it."""
    earlier = sorted(ch for ch in open_chapters if ch[:2] < chapter[:2])
    return f"feedback withheld while {', '.join(earlier)} {'is' if len(earlier) == 1 else 'are'} open" if earlier else ""
