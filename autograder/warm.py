"""What every notebook's judge process needs, loaded once: imported by the fork server that ``autograder.run``
forks the judge processes from, so that each fork starts with torch, the checks of the batch's chapters (those in
``run.LOAD_ENV``; every chapter's when it is unset) and, where those checks use it, Hugging Face's transformers already
in memory (seconds of imports, paid once per grader process instead of once per notebook), and the answers that the
checks of the chapters about to be graded compare every notebook with (their module's ``warm_up``; the chapters in
``run.WARM_ENV``: those with two notebooks or more in the batch, ``grade.shared_answers``)."""
import os

import torch

from autograder.run import LOAD_ENV, WARM_ENV, load_checks, warm_ups
from minigpt import CHAPTERS

torch.set_num_threads(1)  # before any operation: a fork must not inherit a pool of OpenMP threads
_load = os.environ.get(LOAD_ENV)
load_checks(CHAPTERS if _load is None else _load.split(","))
for _warm_up in warm_ups(filter(None, os.environ.get(WARM_ENV, "").split(","))):
    _warm_up()
