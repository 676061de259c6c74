"""What every notebook's judge process needs, loaded once: imported by the fork server that ``autograder.run``
forks the judge processes from, so that each fork starts with torch, transformers and every chapter's checks
already in memory (about 5 s of imports, paid once per grader process instead of once per notebook), and the answers
that the checks of the chapters about to be graded compare every notebook with (their module's ``warm_up``; the
chapters in ``run.WARM_ENV``: those with two notebooks or more in the batch, ``grade.shared_answers``)."""
import os
import sys

import torch
import transformers

from autograder import judge
from autograder.run import WARM_ENV
from minigpt import CHAPTERS

torch.set_num_threads(1)  # before any operation: a fork must not inherit a pool of OpenMP threads
transformers.GPT2LMHeadModel  # noqa: B018 (transformers loads its parts lazily: load the ones the checks use)
for _chapter in CHAPTERS:
    judge.checks(_chapter)
for _chapter in filter(None, os.environ.get(WARM_ENV, "").split(",")):
    for _module in {fn.__module__ for fn in judge.checks(_chapter).values()}:
        if hasattr(sys.modules[_module], "warm_up"):
            sys.modules[_module].warm_up()
