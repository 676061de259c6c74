"""Chapter 9 (constrained decoding): realistic learner mistakes, each of which must lose points with a message that
names it, and different-but-correct answers, each of which must get full marks.

Solution cells: `choices`, `plain_regex`, `fast_mask` (build_trie and dfa_mask), `schema`, `generate`. Test cells:
test_choices, test_plain_regex, test_fast_mask, test_schema, test_generate. Each test cell calls only the functions
of its own solution cell (the loop is graded with a scripted constraint, not the learner's masks), so a mistake
costs points in exactly one cell.

`NBGRADER_MUTANTS` are the mutants graded through real, sandboxed grading (one run); every mutant is also graded
by the hidden checks in this process (`hidden_check_tests`).
"""
from __future__ import annotations

from . import Edit, Mutant, Variant

CHAPTER = "09-constrained"

PLAIN_TOKEN = ("            allowed[i] = regex.fullmatch(pattern, written + text, flags=regex.ASCII, partial=True) "
               "is not None\n")
PLAIN_EOS = "    if regex.fullmatch(pattern, written, flags=regex.ASCII) is not None:\n"
WALK = """\
            t = row[b]
            if t >= 0:
                ids.extend(child.ids)
                stack.append((child, t))
"""
EOS_BREAK = """\
        if token in constraint.eos_ids:
            reason = "eos"
            break
"""

MUTANTS = [
    # ---- choices
    Mutant("choice-token-alone", "the token is checked on its own, not after what was written",
           (Edit("choices", "            text = written + piece\n", "            text = piece\n"),),
           {"test_choices": "you checked the token alone"}),
    Mutant("choice-eos-on-prefix", "end-of-text allowed whenever written starts a choice",
           (Edit("choices", "    if written in choices:\n",
                 "    if any(choice.startswith(written) for choice in choices):\n"),),
           {"test_choices": "end-of-text is allowed only when written is a whole choice"}),
    Mutant("choice-empty-token", "a token that writes nothing (b\"\") is allowed",
           (Edit("choices",
                 "        if piece:  # None (not text) and b\"\" (writes nothing) never move towards a choice\n",
                 "        if piece is not None:\n"),),
           {"test_choices": "a token that writes nothing"}),
    Mutant("choice-empty-never-ends", "no end-of-text before anything is written, though b\"\" may be a choice",
           (Edit("choices", "    if written in choices:\n", "    if written and written in choices:\n"),),
           {"test_choices": "an empty choice b\"\" is whole"}),
    # ---- regex, the plain way
    Mutant("plain-no-partial", "partial matching left out: only full matches allowed",
           (Edit("plain_regex", PLAIN_TOKEN, PLAIN_TOKEN.replace(", partial=True", "")),),
           {"test_plain_regex": "pass partial=True"}),
    Mutant("plain-no-ascii", "no regex.ASCII: \\d matches every script's digits",
           (Edit("plain_regex", PLAIN_TOKEN, PLAIN_TOKEN.replace("flags=regex.ASCII, ", "")),
            Edit("plain_regex", PLAIN_EOS, PLAIN_EOS.replace(", flags=regex.ASCII", ""))),
           {"test_plain_regex": "pass flags=regex.ASCII"}),
    Mutant("plain-match", "regex.match instead of regex.fullmatch",
           (Edit("plain_regex", PLAIN_TOKEN, PLAIN_TOKEN.replace("regex.fullmatch(", "regex.match(")),),
           {"test_plain_regex": "use regex.fullmatch"}),
    Mutant("plain-eos-on-partial", "end-of-text allowed after a partial match",
           (Edit("plain_regex", PLAIN_EOS,
                 PLAIN_EOS.replace("flags=regex.ASCII)", "flags=regex.ASCII, partial=True)")),),
           {"test_plain_regex": "end-of-text is allowed only when written is a FULL match"}),
    Mutant("plain-eos-on-match", "end-of-text allowed when a match starts written (regex.match), not when it is one",
           (Edit("plain_regex", PLAIN_EOS, PLAIN_EOS.replace("regex.fullmatch(", "regex.match(")),),
           {"test_plain_regex": "regex.fullmatch, not regex.match"}),
    # ---- the trie and the fast mask
    Mutant("trie-replaces-ids", "a node keeps only the last id that ends there",
           (Edit("fast_mask", "        node.ids.append(i)\n", "        node.ids = [i]\n"),),
           {"test_fast_mask": "two ids with the same bytes"}),
    Mutant("trie-skips-partial-utf8", "tokens whose bytes are not UTF-8 on their own are left out of the trie",
           (Edit("fast_mask", "        if not piece:\n            continue\n",
                 "        if not piece:\n            continue\n        try:\n            piece.decode(\"utf-8\")\n"
                 "        except UnicodeDecodeError:\n            continue\n"),),
           {"test_fast_mask": "a token need not be valid UTF-8 on its own"}),
    Mutant("mask-leaves-only", "only tokens at leaves of the trie are allowed",
           (Edit("fast_mask", "                ids.extend(child.ids)\n",
                 "                if not child.children:\n                    ids.extend(child.ids)\n"),),
           {"test_fast_mask": "a token whose node has children is allowed too"}),
    Mutant("mask-from-start", "the walk starts from the DFA's start, not the given state",
           (Edit("fast_mask", "    stack = [(trie, state)]\n", "    stack = [(trie, dfa.start)]\n"),),
           {"test_fast_mask": "you walked from the DFA's start"}),
    Mutant("mask-no-pruning", "the walk goes on below a dead byte, with -1 as a state",
           (Edit("fast_mask", WALK, """\
            t = row[b]
            if t >= 0:
                ids.extend(child.ids)
            stack.append((child, t))
"""),),
           {"test_fast_mask": "-1 means dead"}),
    Mutant("mask-eos-always", "end-of-text allowed in every state",
           (Edit("fast_mask", "    if dfa.accepting[state]:\n        allowed[list(eos_ids)] = True\n",
                 "    allowed[list(eos_ids)] = True\n"),),
           {"test_fast_mask": "only the end-of-text ids are wrong"}),
    Mutant("mask-eos-tensor-index", "the end-of-text ids indexed as torch.tensor(list(eos_ids)): float when empty",
           (Edit("fast_mask", "        allowed[list(eos_ids)] = True\n",
                 "        allowed[torch.tensor(list(eos_ids))] = True\n"),),
           {"test_fast_mask": "eos_ids may be empty"}),
    # ---- the schema
    Mutant("schema-leading-zeros", "integers as -?\\d+: leading zeros allowed",
           (Edit("schema", '    simple = {"integer": r"-?(0|[1-9]\\d*)", ', '    simple = {"integer": r"-?\\d+", '),),
           {"test_schema": "JSON has no leading zeros"}),
    Mutant("schema-no-spaces", "fields joined by ',' without the space json.dumps writes",
           (Edit("schema", '    return escape("{") + ", ".join(fields) + escape("}")\n',
                 '    return escape("{") + ",".join(fields) + escape("}")\n'),),
           {"test_schema": "', ' between fields"}),
    Mutant("schema-loose-string", "a string is anything but a quote: backslashes and control characters slip in",
           (Edit("schema",
                 """            value = '"' + JSON_CHAR + ("*" if most is None else f"{{0,{most}}}") + '"'\n""",
                 """            value = '"[^"]' + ("*" if most is None else f"{{0,{most}}}") + '"'\n"""),),
           {"test_schema": "no backslash inside a string"}),
    Mutant("schema-unescaped-enum", "enum values put in the pattern as they are",
           (Edit("schema", '            value = "(" + "|".join(escape(json.dumps(v)) for v in field["enum"]) + ")"\n',
                 '            value = "(" + "|".join(json.dumps(v) for v in field["enum"]) + ")"\n'),),
           {"test_schema": "does not match"}),
    Mutant("schema-enum-quoted-by-hand", "enum values put between quotes by hand, not as json.dumps writes them",
           (Edit("schema", '            value = "(" + "|".join(escape(json.dumps(v)) for v in field["enum"]) + ")"\n',
                 '            value = "(" + "|".join(escape(\'"\' + v + \'"\') for v in field["enum"]) + ")"\n'),),
           {"test_schema": "escape(json.dumps(value))"}),
    Mutant("schema-max-length-truthy", "maxLength tested by truthiness: maxLength 0 allows any length",
           (Edit("schema", """("*" if most is None else f"{{0,{most}}}")""",
                 """(f"{{0,{most}}}" if most else "*")"""),),
           {"test_schema": "0 is falsy"}),
    # ---- generation
    Mutant("gen-no-mask", "the logits go to the sampler unmasked",
           (Edit("generate", "        logits = last_logits(runner, ids).masked_fill(~allowed, NEG_INF)\n",
                 "        logits = last_logits(runner, ids)\n"),),
           {"test_generate": "a token the constraint does not allow was chosen"}),
    Mutant("gen-mask-times-inf", "the mask added as (~allowed) * -inf: 0 * -inf is nan on every allowed token",
           (Edit("generate", "        logits = last_logits(runner, ids).masked_fill(~allowed, NEG_INF)\n",
                 "        logits = last_logits(runner, ids) + (~allowed) * NEG_INF\n"),),
           {"test_generate": "0 * -inf is nan"}),
    Mutant("gen-no-dead-end", "no ValueError when no token is allowed",
           (Edit("generate", "        if not allowed.any():\n            raise ValueError(constraint.dead_end(new))\n",
                 ""),),
           {"test_generate": "the constraint can no longer be met"}),
    Mutant("gen-prompt-to-constraint", "the constraint is asked about the prompt and the generated ids",
           (Edit("generate", "        allowed = constraint.allowed(new)\n",
                 "        allowed = constraint.allowed(ids)\n"),),
           {"test_generate": "constraint.allowed takes the ids generated so far"}),
    Mutant("gen-eos-no-break", "the loop goes on after an end-of-text id",
           (Edit("generate", EOS_BREAK, '        if token in constraint.eos_ids:\n            reason = "eos"\n'),),
           {"test_generate": "an end-of-text id ends the loop"}),
    Mutant("gen-reason-from-count", "the finish reason from the count: 'length' whenever max_new_tokens came",
           (Edit("generate", EOS_BREAK, "        if token in constraint.eos_ids:\n            break\n"),
            Edit("generate", "        ids.append(token)\n",
                 '        ids.append(token)\n    reason = "length" if len(new) == max_new_tokens else "eos"\n')),
           {"test_generate": "decide it from the token"}),
    Mutant("gen-one-step-short", "max_new_tokens - 1 steps",
           (Edit("generate", "    for _ in range(max_new_tokens):\n", "    for _ in range(max_new_tokens - 1):\n"),),
           {"test_generate": "at most max_new_tokens steps"}),
    # ---- chapters 6 and 7 inside the loop
    Mutant("gen-history-new-only", "the sampler sees only the generated ids: its penalties miss the prompt",
           (Edit("generate", "        token = choose(logits, ids)\n", "        token = choose(logits, new)\n"),),
           {"test_generate": "(prompt included) as the sampler's history"}),
    Mutant("gen-no-cache", "the model itself at every step: use_cache changes nothing",
           (Edit("generate", "        logits = last_logits(runner, ids).masked_fill(~allowed, NEG_INF)\n",
                 "        logits = last_logits(model, ids).masked_fill(~allowed, NEG_INF)\n"),),
           {"test_generate": "run the given runner, not model"}),
]

NBGRADER_MUTANTS = ["choice-token-alone", "choice-eos-on-prefix", "plain-no-partial", "plain-no-ascii",
                    "trie-replaces-ids", "mask-leaves-only", "mask-from-start", "schema-leading-zeros",
                    "schema-no-spaces", "gen-no-mask", "gen-no-dead-end", "gen-eos-no-break"]

VARIANTS = [
    Variant("choices-by-remainder", "what is left of each choice, then tokens that start it",
            edits=(Edit("choices", """\
    allowed = torch.zeros(len(vocab), dtype=torch.bool)
    for i, piece in enumerate(vocab):
        if piece:  # None (not text) and b"" (writes nothing) never move towards a choice
            text = written + piece
            allowed[i] = any(choice.startswith(text) for choice in choices)
    if written in choices:
        for i in eos_ids:
            allowed[i] = True
    return allowed
""", """\
    rests = [c[len(written):] for c in choices if c.startswith(written)]
    flags = [piece is not None and len(piece) > 0 and any(r.startswith(piece) for r in rests) for piece in vocab]
    allowed = torch.tensor(flags, dtype=torch.bool)
    if b"" in rests and eos_ids:
        allowed[sorted(eos_ids)] = True
    return allowed
"""),)),
    Variant("plain-compiled-once", "the pattern compiled once, the mask from a list",
            edits=(Edit("plain_regex", """\
    allowed = torch.zeros(len(texts), dtype=torch.bool)
    for i, text in enumerate(texts):
        if text:
            allowed[i] = regex.fullmatch(pattern, written + text, flags=regex.ASCII, partial=True) is not None
    if regex.fullmatch(pattern, written, flags=regex.ASCII) is not None:
        for i in eos_ids:
            allowed[i] = True
    return allowed
""", """\
    compiled = regex.compile(pattern, flags=regex.ASCII)
    ok = [bool(t) and compiled.fullmatch(written + t, partial=True) is not None for t in texts]
    allowed = torch.tensor(ok, dtype=torch.bool).reshape(len(texts))
    if compiled.fullmatch(written) and eos_ids:
        allowed[sorted(eos_ids)] = True
    return allowed
"""),)),
    Variant("fast-recursive", "the trie built with explicit checks, the walk recursive",
            edits=(Edit("fast_mask", """\
    root = TrieNode()
    for i, piece in enumerate(vocab):
        if not piece:
            continue
        node = root
        for b in piece:
            node = node.children.setdefault(b, TrieNode())
        node.ids.append(i)
    return root
""", """\
    root = TrieNode()
    for i, piece in enumerate(vocab):
        if piece is None or piece == b"":
            continue
        node = root
        for b in piece:
            if b not in node.children:
                node.children[b] = TrieNode()
            node = node.children[b]
        node.ids += [i]
    return root
"""), Edit("fast_mask", """\
    allowed = torch.zeros(vocab_size, dtype=torch.bool)
    ids = []
    stack = [(trie, state)]
    while stack:
        node, s = stack.pop()
        row = dfa.table[s]  # the next state for each byte
        for b, child in node.children.items():
            t = row[b]
            if t >= 0:
                ids.extend(child.ids)
                stack.append((child, t))
    allowed[ids] = True
    if dfa.accepting[state]:
        allowed[list(eos_ids)] = True
    return allowed
""", """\
    allowed = torch.zeros(vocab_size, dtype=torch.bool)

    def visit(node, s):
        for b, child in node.children.items():
            nxt = dfa.step(s, b)
            if nxt == -1:
                continue
            for i in child.ids:
                allowed[i] = True
            visit(child, nxt)

    visit(trie, state)
    if dfa.accepting[state]:
        for i in eos_ids:
            allowed[i] = True
    return allowed
"""))),
    Variant("schema-noncapturing", "(?:...) groups, [0-9], the pieces joined by hand",
            edits=(Edit("schema", """\
    simple = {"integer": r"-?(0|[1-9]\\d*)", "boolean": "(true|false)"}
""", """\
    simple = {"integer": r"(?:-)?(?:0|[1-9][0-9]*)", "boolean": "(?:true|false)"}
"""), Edit("schema", """\
            value = "(" + "|".join(escape(json.dumps(v)) for v in field["enum"]) + ")"
""", """\
            value = "(?:" + "|".join(escape(json.dumps(v)) for v in field["enum"]) + ")"
"""), Edit("schema", """\
    return escape("{") + ", ".join(fields) + escape("}")
""", """\
    pattern = "\\\\{"
    for k, piece in enumerate(fields):
        pattern += (", " if k else "") + piece
    return pattern + "\\\\}"
"""))),
    Variant("generate-where-while", "torch.where for the mask, a while loop",
            edits=(Edit("generate", """\
    new, reason = [], "length"
    for _ in range(max_new_tokens):
        allowed = constraint.allowed(new)
        if not allowed.any():
            raise ValueError(constraint.dead_end(new))
        logits = last_logits(runner, ids).masked_fill(~allowed, NEG_INF)
        token = choose(logits, ids)
        new.append(token)
        if token in constraint.eos_ids:
            reason = "eos"
            break
        ids.append(token)
""", """\
    new, reason = [], "length"
    while len(new) < max_new_tokens:
        allowed = constraint.allowed(list(new))
        if not bool(allowed.any()):
            raise ValueError(constraint.dead_end(new))
        scores = last_logits(runner, ids)
        scores = torch.where(allowed, scores, torch.full_like(scores, float("-inf")))
        token = choose(scores, ids)
        new.append(token)
        if token in constraint.eos_ids:
            reason = "eos"
            break
        ids = ids + [token]
"""),)),
    Variant("generate-runner-by-hand", "the runner called on a (1, T) tensor, the history as prompt plus new ids",
            edits=(Edit("generate", """\
        logits = last_logits(runner, ids).masked_fill(~allowed, NEG_INF)
        token = choose(logits, ids)
""", """\
        logits = runner(torch.tensor([ids]))[0, -1]
        logits[~allowed] = float("-inf")
        token = choose(logits, prompt_ids + new)
"""),)),
]
