"""nbgrader configuration of the minigpt course.

The course root is the folder above this file, whatever the current directory is, so that
`nbgrader generate_assignment 01-tokens`, `nbgrader autograde 01-tokens` and
`nbgrader generate_feedback 01-tokens` work from the repository root (through the shim
`nbgrader_config.py` there). `minigpt-grade` loads this file too and only moves the root into its
own workspace, so the two ways of grading run with the same settings.

Plain `nbgrader autograde` is the trusted setting: the notebook runs with your rights and the hidden tests
judge in its kernel. `minigpt-grade` is the hardened one: the notebook runs in a sandbox and is judged outside.
Both give a test cell the same score, and nothing here makes it: in the trusted setting each test cell's result is
its score (autograder/trusted.py), which nbgrader's own rule reads, from the command line or the formgrader's button.
"""
from pathlib import Path

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

c.CourseDirectory.root = str(Path(__file__).resolve().parent.parent)
# Instructor notebooks (with solutions and hidden tests) are nbgrader's "source";
# the learner notebooks that nbgrader generates from them are its "release".
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
# The gradebook, submitted/, autograded/ and feedback/ keep nbgrader's default places under the root
# (all gitignored).

# Seconds per cell. nbgrader's default of 30 is tight for the chapters that run a small GPT on CPU;
# an infinite loop still ends at this limit and scores 0 for the cells after it.
c.ExecutePreprocessor.timeout = 120
