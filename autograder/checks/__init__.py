"""Checks that the hidden tests call, one module per chapter.

A hidden test cell holds only a call such as ``checks.check_bpe_merge(bpe_merge)``, so nbgrader's feedback,
which prints the hidden test source, shows the call and the message it raised, never the expected answers.
Each check compares the learner's code with an external oracle (tiktoken, torch, transformers), on inputs
the learner has not seen, and explains a mismatch in words: which call, what came back, what was expected,
and, when the mistake is a known one, what it is.
"""
