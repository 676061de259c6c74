"""Publishing, not grading: what learners get from the instructor's material. ``release`` generates ``notebooks/``
from ``solutions/`` with nbgrader (``make notebooks``); ``student_release`` builds and scans the learners'
repository (``make student-release``).
"""
