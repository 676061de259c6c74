"""Chapter 5 (the generation loop): realistic learner mistakes, each of which must lose points with a message
that names it, and different-but-correct answers, each of which must get full marks.

Solution cells: `last_logits`, `token_stream`, `stop_strings` (find_stop and held_back), `text_stream` (the
`TextStream` class; the learner writes `__iter__`). Test cells: test_last_logits, test_token_stream,
test_stop_strings, test_text_stream. token_stream calls last_logits and TextStream calls token_stream,
find_stop and held_back, so a mistake there can cost the later cells too, where the message says that the earlier
cell fails its own test; a mistake in a later cell must cost nothing in the cells before it.
"""
from __future__ import annotations

from . import Edit, Mutant, Variant

CHAPTER = "05-generation"

# TextStream.__iter__, the part between the end-of-text test and the hold-back, as in the reference.
DECODE_AND_STOP = """\
            pending += decoder.decode(self.tokenizer.decode_bytes([token]))
            cut = find_stop(pending, self.stop)
            if cut is not None:
                pending = pending[:cut]
                self.finish_reason = "stop"
                break
"""
EOS_THEN_DECODE = """\
            if token in self.eos_ids:
                self.finish_reason = "eos"
                break
            pending += decoder.decode(self.tokenizer.decode_bytes([token]))
"""
FINAL_FLUSH = """\
        if self.finish_reason != "stop":
            pending += decoder.decode(b"", final=True)
        if pending:
            self.text += pending
            yield pending
"""

MUTANTS = [
    # ---- last_logits
    Mutant(
        "trim-wrong-end",
        "context trimmed from the wrong end (the first block_size tokens kept)",
        (Edit("last_logits", "ids[-model.config.block_size:]", "ids[:model.config.block_size]"),),
        {"test_last_logits": "context trimmed from the wrong end (kept the first block_size tokens)",
         "test_token_stream": "context trimmed from the wrong end"},
    ),
    Mutant(
        "logits-position-0",
        "logits taken at position 0 instead of the last position",
        (Edit("last_logits", "return logits[0, -1]", "return logits[0, 0]"),),
        {"test_last_logits": "logits taken at position 0", "test_token_stream": "logits taken at position 0",
         "test_text_stream": "not the ids the model wrote: check token_stream and last_logits"},
    ),
    # ---- token_stream
    Mutant(
        "continue-after-eos",
        "generation continues after the end-of-text token",
        (Edit("token_stream", "        if next_id in eos:\n            return\n", ""),),
        {"test_token_stream": "tokens generated after EOS"},
    ),
    Mutant(
        "prompt-mutated",
        "the caller's prompt list is extended in place",
        (Edit("token_stream", "ids = list(prompt_ids)", "ids = prompt_ids"),),
        {"test_token_stream": "prompt list mutated"},
    ),
    Mutant(
        "stream-all-then-yield",
        "every token is generated before the first is yielded (a list handed out at the end)",
        (Edit("token_stream", "        yield next_id\n        if next_id in eos:\n            return\n        ids.append(next_id)\n",
              "        made.append(next_id)\n        if next_id in eos:\n            break\n        ids.append(next_id)\n"
              "    yield from made\n"),
         Edit("token_stream", "    eos = set(eos_ids)\n", "    eos = set(eos_ids)\n    made = []\n")),
        {"test_token_stream": "ran 10 forward passes before giving its first token",
         "test_text_stream": "only after all 12 tokens were written"},
    ),
    Mutant(
        "stream-all-faked-count",
        "every token generated before the first is yielded, and the model's call count set back to 0",
        (Edit("token_stream", "        yield next_id\n        if next_id in eos:\n            return\n        ids.append(next_id)\n",
              "        made.append(next_id)\n        if next_id in eos:\n            break\n        ids.append(next_id)\n"
              "    for counted in (model, *getattr(model, 'modules', lambda: [])()):\n"
              "        if hasattr(counted, 'calls'):\n            counted.calls = 0\n"
              "    yield from made\n"),
         Edit("token_stream", "    eos = set(eos_ids)\n", "    eos = set(eos_ids)\n    made = []\n")),
        {"test_token_stream": "ran 10 forward passes before giving its first token",
         "test_text_stream": "only after all 12 tokens were written"},
    ),
    # ---- find_stop and held_back
    Mutant(
        "stop-first-listed",
        "find_stop returns the first stop string of the list that occurs, not the earliest",
        (Edit("stop_strings", "return min(found) if found else None", "return found[0] if found else None"),),
        {"test_stop_strings": "EARLIEST occurrence", "test_text_stream": "occurs EARLIEST in the text"},
    ),
    Mutant(
        "held-back-first-stop",
        "held_back returns the hold of the first stop string that has one, not the longest of them all",
        (Edit("stop_strings", "                longest = n\n                break\n", "                return n\n"),),
        {"test_stop_strings": "keep the LONGEST"},
    ),
    # ---- TextStream
    Mutant(
        "stop-newest-token-only",
        "the stop string is looked for in the newest token's text only",
        (Edit("text_stream", DECODE_AND_STOP, """\
            new = decoder.decode(self.tokenizer.decode_bytes([token]))
            cut = find_stop(new, self.stop)
            if cut is not None:
                pending += new[:cut]
                self.finish_reason = "stop"
                break
            pending += new
"""),),
        {"test_text_stream": "stop checked only on the newest token's text"},
    ),
    Mutant(
        "stop-left-in-output",
        "the text is not cut before the stop string",
        (Edit("text_stream", "                pending = pending[:cut]\n", ""),),
        {"test_text_stream": "stop string left in the output"},
    ),
    Mutant(
        "utf8-per-token",
        "each token decoded on its own",
        (Edit("text_stream", "pending += decoder.decode(self.tokenizer.decode_bytes([token]))",
              "pending += self.tokenizer.decode([token])"),),
        {"test_text_stream": "stream emits broken UTF-8 (decoded each token on its own)"},
    ),
    Mutant(
        "eos-text-shown",
        "the end-of-text token is decoded and shown before stopping",
        (Edit("text_stream", EOS_THEN_DECODE, """\
            pending += decoder.decode(self.tokenizer.decode_bytes([token]))
            if token in self.eos_ids:
                self.finish_reason = "eos"
                break
"""),),
        {"test_text_stream": "the end-of-text token's text was shown"},
    ),
    Mutant(
        "no-final-flush",
        "what was held back is never shown when generation ends",
        (Edit("text_stream", FINAL_FLUSH, ""),),
        {"test_text_stream": "text held back at the end was never shown"},
    ),
    # ---- sizes the contract allows: a window exactly full
    Mutant(
        "window-short-when-full",
        "a full window is cut to block_size - 1 tokens, to 'make room' for the next one",
        (Edit("last_logits", "window = ids[-model.config.block_size:]",
              "window = ids if len(ids) < model.config.block_size else ids[-(model.config.block_size - 1):]"),),
        {"test_last_logits": "the window is one token short",
         "test_token_stream": "which fails its own test (test_last_logits)"},
    ),
    # ---- what the model may be: any callable with .config (chapter 7's cached model is not an nn.Module)
    Mutant(
        "device-from-parameters",
        "last_logits reads the device from next(model.parameters())",
        (Edit("last_logits", "        logits = model(torch.tensor([window], dtype=torch.long))",
              "        device = next(model.parameters()).device\n"
              "        logits = model(torch.tensor([window], dtype=torch.long, device=device))"),),
        {"test_last_logits": "the model may be any callable with .config",
         "test_token_stream": "which fails its own test (test_last_logits)",
         # the StopIteration inside token_stream's generator: named at the learner's line, not as "generator
         # raised StopIteration" alone, and charged to last_logits
         "test_text_stream": "raised StopIteration ("},
    ),
    Mutant(
        "eval-in-last-logits",
        "last_logits calls model.eval()",
        (Edit("last_logits", "    with torch.no_grad():\n", "    model.eval()\n    with torch.no_grad():\n"),),
        {"test_last_logits": "do not use model.parameters(), .device, .eval() or .forward",
         "test_token_stream": "which fails its own test (test_last_logits)"},
    ),
    Mutant(
        "logits-at-window-length",
        "the last position read as logits[0, len(window) - 1]: a cached model returns only the new positions",
        (Edit("last_logits", "return logits[0, -1]", "return logits[0, len(window) - 1]"),),
        {"test_last_logits": "returns scores only for the positions it has not seen",
         "test_token_stream": "which fails its own test (test_last_logits)"},
    ),
    # ---- input types the contract accepts: eos_ids as any iterable
    Mutant(
        "eos-generator-read-twice",
        "eos_ids tested with `in` at each step: a generator is used up by the first test",
        (Edit("token_stream", "eos = set(eos_ids)", "eos = eos_ids"),),
        {"test_token_stream": "a generator too, which can be read only once"},
    ),
    # ---- interactions: the ids beyond the window passed to choose
    Mutant(
        "choose-gets-the-window",
        "choose is given only the window the model reads, not all the ids so far",
        (Edit("token_stream", "        next_id = choose(last_logits(model, ids), ids)\n",
              "        window = ids[-model.config.block_size:]\n"
              "        next_id = choose(last_logits(model, window), window)\n"),),
        {"test_token_stream": "not only the window the model reads"},
    ),
    # ---- a stop string complete at the very end of the text
    Mutant(
        "find-stop-misses-the-end",
        "find_stop looks at starts up to len(text) - len(stop), exclusive: a stop string that ends the text is missed",
        (Edit("stop_strings", "found = [i for i in (text.find(s) for s in stops) if i != -1]",
              "found = [i for s in stops for i in range(len(text) - len(s)) if text[i:i + len(s)] == s]"),),
        {"test_stop_strings": "a stop string that ends the text counts too",
         "test_text_stream": "which fails its own test (test_stop_strings)"},
    ),
    Mutant(
        "held-back-whole-stop",
        "held_back counts a whole stop string at the end as a start",
        (Edit("stop_strings", "range(min(len(s) - 1, len(text)), longest, -1)",
              "range(min(len(s), len(text)), longest, -1)"),),
        {"test_stop_strings": "a whole stop string is not held back"},
    ),
    # ---- interactions: text before the stop string in the same decoded piece; stop or eos on the last token
    Mutant(
        "stop-drops-the-text-before",
        "when a stop string is found, the text before it is dropped",
        (Edit("text_stream", """\
            if cut is not None:
                pending = pending[:cut]
                self.finish_reason = "stop"
                break
""", """\
            if cut is not None:
                self.finish_reason = "stop"
                return
"""),),
        {"test_text_stream": "the text before the stop string was never shown"},
    ),
    Mutant(
        "finish-reason-from-count",
        "finish_reason is 'length' whenever max_new_tokens ids were written",
        (Edit("text_stream", FINAL_FLUSH, """\
        if len(self.ids) == self.max_new_tokens:
            self.finish_reason = "length"
""" + FINAL_FLUSH),),
        {"test_text_stream": "even on the last allowed token"},
    ),
]


# ---------------------------------------------------------------- different but correct

# A while loop; the window by index arithmetic; torch.inference_mode; find_stop by one regular expression;
# held_back from the longest end of the text down.
WHILE_LAST_LOGITS = '''\
#| export
def last_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Next-token logits (V,) after ``ids``, reading at most the last ``block_size`` tokens."""
    start = max(0, len(ids) - model.config.block_size)
    context = torch.tensor(ids[start:]).unsqueeze(0)
    with torch.inference_mode():
        return model(context)[:, -1, :].squeeze(0)
'''
WHILE_TOKEN_STREAM = '''\
#| export
def token_stream(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int,
                 choose: Chooser = greedy, eos_ids: Iterable[int] = ()) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` new ids, one per forward pass; an id in ``eos_ids`` is yielded last."""
    ids = prompt_ids.copy()
    stop_ids = {*eos_ids}
    produced = 0
    while produced < max_new_tokens:
        token = choose(last_logits(model, ids), ids)
        produced += 1
        yield token
        if token in stop_ids:
            break
        ids = ids + [token]
'''
REGEX_STOP_STRINGS = '''\
#| export
import re


def find_stop(text: str, stops: Iterable[str]) -> int | None:
    """Index of the earliest occurrence of any of ``stops`` in ``text``, or None."""
    stops = list(stops)
    if not stops:
        return None
    match = re.search("|".join(re.escape(s) for s in stops), text)
    return match.start() if match else None


def held_back(text: str, stops: Iterable[str]) -> int:
    """Length of the longest end of ``text`` that is the start (not the whole) of one of ``stops``."""
    stops = list(stops)
    for n in range(len(text), 0, -1):
        if any(len(s) > n and s.startswith(text[-n:]) for s in stops):
            return n
    return 0
'''

# Decode all the text so far at each step and show what is new: the text up to a trailing "\ufffd" (an
# incomplete character, until the rest comes) and up to what may start a stop string.
DIFF_ITER = '''\
    def __iter__(self) -> Iterator[str]:
        self.finish_reason = "length"
        written: list[int] = []
        shown = 0
        end = None
        for token in token_stream(self.model, self.prompt_ids, self.max_new_tokens, self.choose, self.eos_ids):
            self.ids.append(token)
            if token in self.eos_ids:
                self.finish_reason = "eos"
                break
            written.append(token)
            text = self.tokenizer.decode(written)
            end = find_stop(text, self.stop)
            if end is not None:
                self.finish_reason = "stop"
                break
            safe = len(text.rstrip("\\ufffd"))
            safe = max(shown, safe - held_back(text[:safe], self.stop))
            if safe > shown:
                piece = text[shown:safe]
                shown = safe
                self.text += piece
                yield piece
        text = self.tokenizer.decode(written)
        rest = text[shown:end] if self.finish_reason == "stop" else text[shown:]
        if rest:
            self.text += rest
            yield rest
'''
REFERENCE_ITER = """\
    def __iter__(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""  # decoded, not shown yet: it may be the start of a stop string
        self.finish_reason = "length"
        for token in token_stream(self.model, self.prompt_ids, self.max_new_tokens, self.choose, self.eos_ids):
            self.ids.append(token)
""" + EOS_THEN_DECODE + DECODE_AND_STOP[DECODE_AND_STOP.index("\n") + 1:] + """\
            keep = held_back(pending, self.stop)
            ready, pending = pending[:len(pending) - keep], pending[len(pending) - keep:]
            if ready:
                self.text += ready
                yield ready
""" + FINAL_FLUSH

# .detach() instead of no_grad; an explicit if for the window; find_stop with min(..., default=None);
# held_back by checking each stop's prefixes from the shortest up, keeping the longest.
DETACH_LAST_LOGITS = '''\
#| export
def last_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Next-token logits (V,) after ``ids``, reading at most the last ``block_size`` tokens."""
    block = model.config.block_size
    if len(ids) > block:
        ids = ids[len(ids) - block:]
    x = torch.as_tensor(ids, dtype=torch.long)[None]
    return model(x)[0][-1].detach()
'''
PREFIX_STOP_STRINGS = '''\
#| export
def find_stop(text: str, stops: Iterable[str]) -> int | None:
    """Index of the earliest occurrence of any of ``stops`` in ``text``, or None."""
    return min((text.index(s) for s in stops if s in text), default=None)


def held_back(text: str, stops: Iterable[str]) -> int:
    """Length of the longest end of ``text`` that is the start (not the whole) of one of ``stops``."""
    best = 0
    for stop in stops:
        for n in range(1, len(stop)):
            if n <= len(text) and text[len(text) - n:] == stop[:n]:
                best = max(best, n)
    return best
'''
INFERENCE_TOKEN_STREAM = '''\
#| export
@torch.inference_mode()
def token_stream(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int,
                 choose: Chooser = greedy, eos_ids: Iterable[int] = ()) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` new ids, one per forward pass; an id in ``eos_ids`` is yielded last."""
    stop_ids = frozenset(eos_ids)
    context = [*prompt_ids]
    for step in range(max_new_tokens):
        token = choose(last_logits(model, context), context)
        context.append(token)
        yield token
        if token in stop_ids:
            return
'''

# The length the model returned for the last position; token_stream by the number of ids; find_stop and held_back by
# scanning the text from its start; TextStream looks for stop strings in all the text decoded so far and shows what
# is new, with a for ... else for finish_reason.
SCAN_LAST_LOGITS = '''\
#| export
@torch.no_grad()
def last_logits(model, ids: list[int]) -> torch.Tensor:
    """Next-token logits (V,) after ``ids``, reading at most the last ``block_size`` tokens."""
    x = torch.tensor(ids[-model.config.block_size:]).view(1, -1)
    logits = model(x)
    return logits[0, logits.shape[1] - 1]
'''
SCAN_TOKEN_STREAM = '''\
#| export
def token_stream(model, prompt_ids: list[int], max_new_tokens: int, choose: Chooser = greedy,
                 eos_ids: Iterable[int] = ()) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` new ids, one per forward pass; an id in ``eos_ids`` is yielded last."""
    eos = frozenset(eos_ids)
    ids = [*prompt_ids]
    while len(ids) - len(prompt_ids) < max_new_tokens:
        token = choose(last_logits(model, ids), ids)
        yield token
        if token in eos:
            break
        ids.append(token)
'''
SCAN_STOP_STRINGS = '''\
#| export
def find_stop(text: str, stops: Iterable[str]) -> int | None:
    """Index of the earliest occurrence of any of ``stops`` in ``text``, or None."""
    stops = list(stops)
    for i in range(len(text)):
        if any(text.startswith(s, i) for s in stops):
            return i
    return None


def held_back(text: str, stops: Iterable[str]) -> int:
    """Length of the longest end of ``text`` that is the start (not the whole) of one of ``stops``."""
    stops = list(stops)
    for i in range(len(text)):
        tail = text[i:]
        if any(len(s) > len(tail) and s.startswith(tail) for s in stops):
            return len(tail)
    return 0
'''
WHOLE_TEXT_ITER = '''\
    def __iter__(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        decoded = ""  # all the text decoded so far; decoded[:shown] has been yielded
        shown = end = 0
        for token in token_stream(self.model, self.prompt_ids, self.max_new_tokens, self.choose, self.eos_ids):
            self.ids.append(token)
            if token in self.eos_ids:
                self.finish_reason = "eos"
                break
            decoded += decoder.decode(self.tokenizer.decode_bytes([token]))
            cut = find_stop(decoded, self.stop)
            if cut is not None:
                self.finish_reason = "stop"
                end = cut
                break
            end = len(decoded) - held_back(decoded, self.stop)
            if end > shown:
                piece, shown = decoded[shown:end], end
                self.text += piece
                yield piece
        else:
            self.finish_reason = "length"
        if self.finish_reason != "stop":
            decoded += decoder.decode(b"", final=True)
            end = len(decoded)
        if end > shown:
            self.text += decoded[shown:end]
            yield decoded[shown:end]
'''

# squeeze(0) then [-1]; a countdown; find_stop from a dict of positions; held_back as one max over the prefixes;
# TextStream yields one character at a time.
SQUEEZE_LAST_LOGITS = '''\
#| export
def last_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Next-token logits (V,) after ``ids``, reading at most the last ``block_size`` tokens."""
    with torch.inference_mode():
        logits = model(torch.as_tensor([ids[-model.config.block_size:]]))
    return logits.squeeze(0)[-1]
'''
COUNTDOWN_TOKEN_STREAM = '''\
#| export
def token_stream(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int,
                 choose: Chooser = greedy, eos_ids: Iterable[int] = ()) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` new ids, one per forward pass; an id in ``eos_ids`` is yielded last."""
    eos = set(eos_ids)
    context = list(prompt_ids)
    remaining = max_new_tokens
    while remaining > 0:
        remaining -= 1
        token = choose(last_logits(model, context), list(context))
        context.append(token)
        yield token
        if token in eos:
            return
'''
DICT_STOP_STRINGS = '''\
#| export
def find_stop(text: str, stops: Iterable[str]) -> int | None:
    """Index of the earliest occurrence of any of ``stops`` in ``text``, or None."""
    positions = {s: text.find(s) for s in stops}
    return min((i for i in positions.values() if i >= 0), default=None)


def held_back(text: str, stops: Iterable[str]) -> int:
    """Length of the longest end of ``text`` that is the start (not the whole) of one of ``stops``."""
    return max((n for s in stops for n in range(1, min(len(s), len(text) + 1)) if text.endswith(s[:n])), default=0)
'''

VARIANTS = [
    Variant(
        "while-inference-regex",
        "a while loop; torch.inference_mode; find_stop by one regular expression; held_back from the longest end",
        cells={"last_logits": WHILE_LAST_LOGITS, "token_stream": WHILE_TOKEN_STREAM,
               "stop_strings": REGEX_STOP_STRINGS},
    ),
    Variant(
        "decode-all-and-diff",
        "TextStream decodes all the text at each step and shows what is new; last_logits with .detach()",
        cells={"last_logits": DETACH_LAST_LOGITS, "stop_strings": PREFIX_STOP_STRINGS,
               "token_stream": INFERENCE_TOKEN_STREAM},
        edits=(Edit("text_stream", REFERENCE_ITER, DIFF_ITER),),
    ),
    Variant(
        "scan-and-whole-text",
        "last_logits reads the length the model returned; find_stop and held_back scan from the start; TextStream "
        "looks for stop strings in all the text decoded so far, with for ... else",
        cells={"last_logits": SCAN_LAST_LOGITS, "token_stream": SCAN_TOKEN_STREAM, "stop_strings": SCAN_STOP_STRINGS},
        edits=(Edit("text_stream", REFERENCE_ITER, WHOLE_TEXT_ITER),),
    ),
    Variant(
        "character-pieces",
        "TextStream yields one character at a time; last_logits by squeeze(0)[-1]; a countdown loop; find_stop from "
        "a dict of positions",
        cells={"last_logits": SQUEEZE_LAST_LOGITS, "token_stream": COUNTDOWN_TOKEN_STREAM,
               "stop_strings": DICT_STOP_STRINGS},
        edits=(Edit("text_stream", """\
            if ready:
                self.text += ready
                yield ready
""", """\
            for character in ready:
                self.text += character
                yield character
"""), Edit("text_stream", """\
        if pending:
            self.text += pending
            yield pending
""", """\
        for character in pending:
            self.text += character
            yield character
""")),
    ),
]
