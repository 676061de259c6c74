"""The autograder's side in a learner's sandbox: all of it, and nothing else of the autograder, is bound read-only
into the notebook's view (``sandbox.SANDBOX_SIDE``). It runs beside the learner's code, which can rewrite it, so it
never judges: hidden cells serve the judge's requests with plain data (``hidden``, ``wire``), the executor runs the
notebook (``execute``), and ``helpers`` build the inputs the judge asks for from plain recipes. Nothing here imports
the grader's side (``tests/test_layout.py``); the grader's side imports ``wire`` and ``helpers`` to speak the same
data and build the same inputs.
"""
