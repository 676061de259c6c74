"""Chapter 10 (batching): realistic learner mistakes, each of which must lose points with a message that names it,
and different-but-correct answers, each of which must get full marks.

Solution cells: `left_pad`, `position_ids`, `padded_causal_mask`, `forward_padded`, `generate_batch`. Test cells:
test_left_pad, test_position_ids, test_padded_causal_mask, test_forward_padded, test_generate_batch. The checks of
forward_padded build their own padded ids and masks (not the learner's left_pad), but forward_padded calls the
learner's position_ids and padded_causal_mask, and generate_batch calls all four: a mistake there costs the later
cells too (their messages say to fix the earlier cell first).
"""
from __future__ import annotations

from . import Edit, Mutant, Variant

CHAPTER = "10-batching"
USES_POSITIONS = {"test_forward_padded": "", "test_generate_batch": ""}

PAD_LOOP = """\
    for b, row in enumerate(rows):
        ids[b, T - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[b, T - len(row):] = 1
"""
EMPTY_CHECK = """\
    if min(lengths) == 0:
        raise ValueError(f"row {lengths.index(0)} is empty: every sequence needs at least one token")
"""
MASK_RETURN = "    return (causal & keys) | itself\n"
CAUSAL = "    causal = torch.ones(t_new, T, dtype=torch.bool).tril(diagonal=T - t_new)  # (t_new, T)\n"
POSITIONS = "    positions = position_ids(mask)[:, -t_new:]\n"
ALLOWED = "    allowed = padded_causal_mask(mask, t_new)\n"
CHOOSE = """\
        for b, row in enumerate(rows):
            if row.finish_reason is None:
                row.add(samplers[b](logits[b], row.prompt_ids + row.ids))
"""
STOP = "        if step == max_new_tokens - 1 or all(row.finish_reason for row in rows):\n"
GROW = "        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)\n"
LOOP = """\
    ids, mask = left_pad(prompt_ids, pad_id=0)
    cache = KVCache(config.n_layer)
    logits = forward_padded(model, ids, mask, cache)[:, -1]  # (B, V): every row's next-token scores
    for step in range(max_new_tokens):
        for b, row in enumerate(rows):
            if row.finish_reason is None:
                row.add(samplers[b](logits[b], row.prompt_ids + row.ids))
        if step == max_new_tokens - 1 or all(row.finish_reason for row in rows):
            break
        new = torch.tensor([[row.ids[-1]] for row in rows])  # (B, 1); a finished row repeats its last token
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits = forward_padded(model, new, mask, cache)[:, -1]
"""

ONE_PASS_TOO_MANY = """\
    ids, mask = left_pad(prompt_ids, pad_id=0)
    cache = KVCache(config.n_layer)
    logits = forward_padded(model, ids, mask, cache)[:, -1]
    step = 0
    while step < max_new_tokens and not all(row.finish_reason for row in rows):
        for b, row in enumerate(rows):
            if row.finish_reason is None:
                row.add(samplers[b](logits[b], row.prompt_ids + row.ids))
        step += 1
        # the next column runs after the last step too: at the window's edge it does not fit
        new = torch.tensor([[row.ids[-1]] for row in rows])
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits = forward_padded(model, new, mask, cache)[:, -1]
"""

# Each prompt generated alone, one after the other: the right ids, a pass per row and token.
EACH_ALONE = """\
    for b, row in enumerate(rows):
        ids, mask = left_pad([row.prompt_ids], pad_id=0)
        cache = KVCache(config.n_layer)
        logits = forward_padded(model, ids, mask, cache)[:, -1]
        for step in range(max_new_tokens):
            row.add(samplers[b](logits[0], row.prompt_ids + row.ids))
            if step == max_new_tokens - 1 or row.finish_reason:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            logits = forward_padded(model, torch.tensor([[row.ids[-1]]]), mask, cache)[:, -1]
"""

# Each prompt alone (the right ids), then every count this side could fake for "one forward pass of the batch per
# token": the hooks of block 0's c_attn called with a batch of every row, a call of the judge's c_attn with such a
# batch, and the list a forward hook of the head used to fill (which got full marks when the grader read it). The
# judge holds block 0's c_attn: every pass was counted there.
ALONE_FAKED_COUNT = EACH_ALONE + """\
    batch = torch.zeros(len(rows), 1, config.n_embd)
    c_attn = model.h[0].attn.c_attn
    for hook in list(c_attn._forward_hooks.values()):
        hook(c_attn, (batch,), None)
    if hasattr(c_attn, "service"):
        from autograder.sandboxed import hidden
        hidden.ask_judge(c_attn.service, batch)
    model.head_rows = [len(rows)] * max_new_tokens
"""

# Every step runs the whole padded batch again, without the cache: the right ids, one pass per token, each pass
# computing every column so far.
NO_CACHE_LOOP = """\
    grown = [list(ids) for ids in prompt_ids]
    for step in range(max_new_tokens):
        ids, mask = left_pad(grown, pad_id=0)
        last = forward_padded(model, ids, mask)[:, -1]  # the whole batch again: no cache
        for b, row in enumerate(rows):
            if row.finish_reason is None:
                row.add(samplers[b](last[b], grown[b]))
                grown[b].append(row.ids[-1])
        if all(row.finish_reason is not None for row in rows):
            break
"""

# Padded with end-of-text, and the mask then taken from the ids: a prompt's own <|endoftext|> is hidden as padding.
MASK_FROM_IDS = """\
    pad = end_of_text_id(tokenizer)
    ids, _ = left_pad(prompt_ids, pad_id=pad)
    mask = (ids != pad).long()  # 1 where the id is not the pad's
"""

MUTANTS = [
    # ---- left_pad
    Mutant("pad-right", "pads on the right",
           (Edit("left_pad", PAD_LOOP, """\
    for b, row in enumerate(rows):
        ids[b, :len(row)] = torch.tensor(row, dtype=torch.long)
        mask[b, :len(row)] = 1
"""),),
           {"test_left_pad": "padded on the RIGHT", "test_generate_batch": ""}),
    Mutant("pad-mask-inverted", "the mask is 1 at the padding",
           (Edit("left_pad", "    return ids, mask\n", "    return ids, 1 - mask\n"),),
           {"test_left_pad": "the mask is inverted", "test_generate_batch": ""}),
    Mutant("pad-mask-from-ids", "the mask computed as ids != pad_id: a token with the pad's id counts as padding",
           (Edit("left_pad", "    return ids, mask\n", "    return ids, (ids != pad_id).long()\n"),),
           {"test_left_pad": "a token may have the pad's id"}),
    Mutant("pad-empty-row", "no error for an empty row",
           (Edit("left_pad", EMPTY_CHECK, ""),),
           {"test_left_pad": "ValueError"}),
    # ---- position_ids
    Mutant("positions-columns", "the columns as positions: padding counts",
           (Edit("position_ids", "    return (mask.long().cumsum(dim=-1) - 1).clamp(min=0)\n",
                 "    return torch.arange(mask.shape[1]).expand(mask.shape).clone()\n"),),
           {"test_position_ids": "these are the columns", "test_forward_padded": "at its COLUMN",
            "test_generate_batch": ""}),
    Mutant("positions-from-one", "the running count without the - 1: the first token at position 1",
           (Edit("position_ids", "    return (mask.long().cumsum(dim=-1) - 1).clamp(min=0)\n",
                 "    return mask.long().cumsum(dim=-1)\n"),),
           {"test_position_ids": "the count starts at 1", **USES_POSITIONS}),
    # ---- padded_causal_mask
    Mutant("mask-causal-only", "chapter 3's causal mask: tokens read padding",
           (Edit("padded_causal_mask", MASK_RETURN, "    return causal.expand(B, 1, t_new, T)\n"),),
           {"test_padded_causal_mask": "chapter 3's causal mask alone", "test_forward_padded": "read the padding",
            "test_generate_batch": ""}),
    Mutant("mask-not-causal", "padding hidden, the future not",
           (Edit("padded_causal_mask", MASK_RETURN, "    return keys.expand(B, 1, t_new, T) | itself\n"),),
           {"test_padded_causal_mask": "not the future", **USES_POSITIONS}),
    Mutant("mask-first-positions", "the new queries taken as the FIRST t_new positions",
           (Edit("padded_causal_mask", CAUSAL,
                 "    causal = torch.ones(t_new, T, dtype=torch.bool).tril()  # (t_new, T)\n"),),
           {"test_padded_causal_mask": "the LAST t_new", "test_forward_padded": "", "test_generate_batch": ""}),
    Mutant("mask-padding-reads-nothing", "a padding query's row is all False: NaN",
           (Edit("padded_causal_mask", MASK_RETURN, "    return causal & keys\n"),),
           {"test_padded_causal_mask": "0 / 0 = NaN", "test_forward_padded": "NaN in the logits",
            "test_generate_batch": ""}),
    # ---- forward_padded
    Mutant("forward-column-positions", "each token embedded at its column",
           (Edit("forward_padded", POSITIONS, "    positions = torch.arange(mask.shape[1])[-t_new:]\n"),),
           {"test_forward_padded": "at its COLUMN", "test_generate_batch": ""}),
    Mutant("forward-first-positions", "the new tokens' positions taken from the first columns",
           (Edit("forward_padded", POSITIONS, "    positions = position_ids(mask)[:, :t_new]\n"),),
           {"test_forward_padded": "the LAST t_new columns", "test_generate_batch": ""}),
    Mutant("forward-plain-causal", "chapter 3's causal mask in the model: padding is read",
           (Edit("forward_padded", ALLOWED, "    allowed = causal_mask(t_new, mask.shape[1])\n"),
            Edit("forward_padded", "#| export\n", "#| export\nfrom minigpt.attention import causal_mask\n\n\n")),
           {"test_forward_padded": "read the padding", "test_generate_batch": ""}),
    # ---- generate_batch
    Mutant("gen-each-alone", "each prompt generated alone, one after the other",
           (Edit("generate_batch", LOOP, EACH_ALONE),),
           {"test_generate_batch": "one forward pass of the whole batch"}),
    Mutant("gen-alone-faked-count", "each prompt generated alone, then a batch's count of forward passes faked",
           (Edit("generate_batch", LOOP, ALONE_FAKED_COUNT),),
           {"test_generate_batch": "[one forward pass of the batch per token, through the cache: 1 of 5] "
                                   "generate_batch(<a random GPT>, <GPT-2's tokenizer>, [[1, 2, 3], [4], [5, 6]], 6, "
                                   "eos_ids=[]) ran the model 19 times, on batches of [1, 3] rows"},
           kept={"test_generate_batch": 4 * 4 / 5}),  # the other parts: the ids are right
    Mutant("gen-finished-grows", "a finished row is given more tokens",
           (Edit("generate_batch", CHOOSE, """\
        for b, row in enumerate(rows):
            row.add(samplers[b](logits[b], row.prompt_ids + row.ids))
"""),),
           {"test_generate_batch": "takes no more tokens"}),
    Mutant("gen-one-sampler", "every row draws with the first row's sampler",
           (Edit("generate_batch", CHOOSE, CHOOSE.replace("samplers[b](", "samplers[0](")),),
           {"test_generate_batch": "with samplers[b]"}),
    Mutant("gen-stops-at-first", "the batch stops when its first row finishes",
           (Edit("generate_batch", STOP, STOP.replace("all(", "any(")),),
           {"test_generate_batch": "the other rows go on"}),
    Mutant("gen-first-column", "the next tokens read from the first column of the prefill",
           (Edit("generate_batch", "    logits = forward_padded(model, ids, mask, cache)[:, -1]  # (B, V): every row's "
                                   "next-token scores\n",
                 "    logits = forward_padded(model, ids, mask, cache)[:, 0]\n"),),
           {"test_generate_batch": "Hugging Face's generate on the same left-padded batch"}),
    Mutant("gen-pass-after-last", "a while loop that runs the model once more after the last token",
           (Edit("generate_batch", LOOP, ONE_PASS_TOO_MANY),),
           {"test_generate_batch": "none after the last token"}),
    Mutant("gen-runs-after-all-finished", "the loop stops only at max_new_tokens: passes go on once every row has "
                                          "finished",
           (Edit("generate_batch", STOP, "        if step == max_new_tokens - 1:\n"),),
           {"test_generate_batch": "every row had finished after 6 new tokens and the loop went on"},
           kept={"test_generate_batch": 4 * 4 / 5}),  # the other parts: the ids are right
    Mutant("gen-no-cache", "the whole padded batch run again at every step, no cache",
           (Edit("generate_batch", LOOP, NO_CACHE_LOOP),),
           {"test_generate_batch": "the work the cache saves"},
           kept={"test_generate_batch": 4 * 4 / 5}),
    Mutant("gen-sampler-new-ids", "each sampler given only its row's new ids, not the prompt's",
           (Edit("generate_batch", CHOOSE, CHOOSE.replace("row.prompt_ids + row.ids", "row.ids")),),
           {"test_generate_batch": "each sampler was given only its row's new ids"},
           kept={"test_generate_batch": 4 * 4 / 5}),
    Mutant("gen-mask-from-ids", "padded with end-of-text, the mask taken from the ids: a prompt's own "
                                "<|endoftext|> hidden as padding",
           (Edit("generate_batch", "    ids, mask = left_pad(prompt_ids, pad_id=0)\n", MASK_FROM_IDS),),
           {"test_generate_batch": "a token with the pad's id is still a token"},
           kept={"test_generate_batch": 4 * 3 / 5}),  # the greedy part (2 of 5) alone
    Mutant("gen-mask-not-grown", "the mask not extended for the new column",
           (Edit("generate_batch", GROW, ""),),
           {"test_generate_batch": ""}),
]

# ---- different correct answers

PAD_SEQUENCE = '''\
#| export
def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left padding by flipping: pad_sequence pads on the right, so pad the reversed rows and flip back."""
    if not rows or any(len(row) == 0 for row in rows):
        raise ValueError("every row needs at least one token, and a batch at least one row")
    flipped = [torch.tensor(row[::-1], dtype=torch.long) for row in rows]
    ids = torch.nn.utils.rnn.pad_sequence(flipped, batch_first=True, padding_value=pad_id).flip(1)
    ones = [torch.ones(len(row), dtype=torch.long) for row in rows]
    mask = torch.nn.utils.rnn.pad_sequence(ones, batch_first=True, padding_value=0).flip(1)
    return ids, mask
'''

HF_POSITIONS = '''\
#| export
def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Hugging Face's way: the running count minus one, and 1 at padding."""
    positions = mask.long().cumsum(-1) - 1
    return positions.masked_fill(mask == 0, 1)
'''

READ_ALL_MASK = '''\
#| export
def padded_causal_mask(mask: torch.Tensor, t_new: int | None = None) -> torch.Tensor:
    """A padding query may read every key (its output is never used); tokens read earlier tokens."""
    B, T = mask.shape
    t_new = t_new or T
    col = torch.arange(T)
    row = torch.arange(T - t_new, T)
    allowed = (col[None, :] <= row[:, None])[None, None] & (mask[:, None, None, :] == 1)
    padding_query = mask[:, T - t_new:] == 0  # (B, t_new)
    return allowed | padding_query[:, None, :, None]
'''

LOOP_MASK = '''\
#| export
def padded_causal_mask(mask: torch.Tensor, t_new: int | None = None) -> torch.Tensor:
    B, T = mask.shape
    if t_new is None:
        t_new = T
    out = torch.zeros(B, 1, t_new, T, dtype=torch.bool)
    for b in range(B):
        first = next(j for j in range(T) if mask[b, j])  # the row's first token (left padding)
        for r in range(t_new):
            i = T - t_new + r
            if mask[b, i]:
                for j in range(first, i + 1):
                    out[b, 0, r, j] = bool(mask[b, j])
            else:
                out[b, 0, r, first] = True  # a padding query reads the row's first token: never 0 / 0
    return out
'''

LOOP_POSITIONS = '''\
#| export
def position_ids(mask: torch.Tensor) -> torch.Tensor:
    rows = []
    for row in mask.tolist():
        count, positions = 0, []
        for m in row:
            positions.append(count if m else 0)
            count += m
        rows.append(positions)
    return torch.tensor(rows, dtype=torch.long)
'''

SDPA_FORWARD = '''\
#| export
@torch.inference_mode()
def forward_padded(model, ids, mask, cache=None):
    """torch's attention with an additive mask: -1e9 where a query may not read."""
    t_new = ids.shape[1]
    bias = torch.zeros(padded_causal_mask(mask, t_new).shape).masked_fill(~padded_causal_mask(mask, t_new), -1e9)
    x = model.emb.wte(ids.long()) + model.emb.wpe(position_ids(mask)[:, mask.shape[1] - t_new:])
    for layer, block in enumerate(model.h):
        a = block.attn
        B, T, C = x.shape
        qkv = a.c_attn(block.ln_1(x)).view(B, T, 3, a.n_head, C // a.n_head).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if cache is not None:
            k, v = cache.append(layer, k, v)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + a.c_proj(y.transpose(1, 2).reshape(B, T, C))
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(model.ln_f(x))
'''

# Padded with end-of-text (any id the model has will do), and a finished row fed the pad.
END_OF_TEXT_PAD = """\
    pad = end_of_text_id(tokenizer)
    ids, mask = left_pad(prompt_ids, pad_id=pad)
    cache = KVCache(config.n_layer)
    logits = forward_padded(model, ids, mask, cache)[:, -1]
    for step in range(max_new_tokens):
        for b, row in enumerate(rows):
            if row.finish_reason is None:
                row.add(samplers[b](logits[b], row.prompt_ids + row.ids))
        if step == max_new_tokens - 1 or all(row.finish_reason for row in rows):
            break
        new = torch.tensor([[pad if row.finish_reason else row.ids[-1]] for row in rows])
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits = forward_padded(model, new, mask, cache)[:, -1]
"""

DROP_FINISHED_LOOP = """\
    ids, mask = left_pad(prompt_ids, pad_id=0)
    cache = KVCache(config.n_layer)
    logits = forward_padded(model, ids, mask, cache)[:, -1]
    running = list(range(len(rows)))  # the rows still in the batch, in its order
    for step in range(max_new_tokens):
        for slot, b in enumerate(running):
            rows[b].add(samplers[b](logits[slot], rows[b].prompt_ids + rows[b].ids))
        keep = [slot for slot, b in enumerate(running) if rows[b].finish_reason is None]
        if step == max_new_tokens - 1 or not keep:
            break
        if len(keep) < len(running):  # finished rows leave the batch, and their cache with them
            index = torch.tensor(keep)
            cache.keys = [k.index_select(0, index) for k in cache.keys]
            cache.values = [v.index_select(0, index) for v in cache.values]
            mask = mask.index_select(0, index)
            running = [running[slot] for slot in keep]
        new = torch.tensor([[rows[b].ids[-1]] for b in running])
        mask = torch.cat([mask, torch.ones(len(running), 1, dtype=mask.dtype)], dim=1)
        logits = forward_padded(model, new, mask, cache)[:, -1]
"""


VARIANTS = [
    Variant("pad-sequence-hf-positions-read-all",
            "pad_sequence on flipped rows; Hugging Face's positions (1 at padding); padding queries read every key",
            cells={"left_pad": PAD_SEQUENCE, "position_ids": HF_POSITIONS, "padded_causal_mask": READ_ALL_MASK}),
    Variant("loops", "the positions and the mask by Python loops; a padding query reads its row's first token",
            cells={"position_ids": LOOP_POSITIONS, "padded_causal_mask": LOOP_MASK}),
    Variant("sdpa-additive-mask", "torch's scaled_dot_product_attention with an additive -1e9 mask, heads by view "
                                  "and permute, inference mode",
            cells={"forward_padded": SDPA_FORWARD}),
    Variant("end-of-text-pad", "padded with end_of_text_id(tokenizer), a finished row fed the pad",
            edits=(Edit("generate_batch", LOOP, END_OF_TEXT_PAD),)),
    Variant("drop-finished", "finished rows leave the batch: their cache rows and mask rows dropped",
            edits=(Edit("generate_batch", LOOP, DROP_FINISHED_LOOP),)),
]
