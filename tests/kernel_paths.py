"""Another of torch's kernel paths for the suite's numeric assertions (DESIGN.md, invariant 11).

torch picks its CPU kernels by ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``: the best the CPU has unless
told) and splits large operations over its threads, and the last bits of a float32 result follow both. The suite runs
the chapters' numeric assertions on the machine's own path and again on ``OTHER``'s capability, the portable kernels,
and the pages' on the portable kernels, where ``make course`` runs them on the machine's own. A tolerance that only
held by one CPU's luck fails on one of the two.

- The pages: each chapter page's cells, build-time assertions included, executed with the portable kernels on one
  thread, once per run (``tests/pages_run.py``: tests/test_kernel_paths.py and the book build of tests/test_site.py
  share that run); ``make course`` runs them on the machine's own, pages 1 to 4 on every core, the others on one
  thread, and asserts them there too.
- The learners' side: the reference answer of each chapter graded again, and every correct variant graded, in a warm
  kernel on ``OTHER`` (``tests/submissions/grading.py``), the portable kernels on two threads: their visible tests, which compare
  with Hugging Face's answers recorded on another machine (``coursekit.recorded``), and the learner side of every
  hidden check; the judge, in the test process, stays on the machine's own kernels with two threads, so each hidden
  check compares answers computed on two different paths, a harder test than a grading machine's, where both sides
  share one CPU. The chapters' own run grades the reference and every mistake on the machine's kernels, one thread a
  side.
"""
from __future__ import annotations

# Each a pair: the capability and the thread count of the other path. "default" is the portable kernel every x86-64
# CPU runs; the machine's own is avx2 or avx512 on any CPU of the last ten years.
OTHER = ("default", 2)


def describe(capability: str, threads: int) -> str:
    """How a failure names the path it failed on: 'ATEN_CPU_CAPABILITY=default, 2 torch threads'."""
    return f"ATEN_CPU_CAPABILITY={capability}, {threads} torch thread{'s' if threads != 1 else ''}"
