"""Chapter 3 (masked attention): realistic learner mistakes, each of which must lose points with a message that
names it, and different-but-correct answers, each of which must get full marks. Every submission costs a
grading kernel (about 4 s), so the list keeps the most common mistakes; the checks also name rarer ones
(scores divided by D, the mask used the wrong way round, c_attn read as k, q, v), left out here.

Solution cells: `causal_mask`, `softmax`, `attention`, `causal_self_attention` (the whole class; `__init__` is
given). Test cells: test_causal_mask, test_softmax, test_attention, test_causal_self_attention. The hidden
checks of `attention` pass it masks built by the checks, not by the learner's `causal_mask`; the layer's
`forward` calls the learner's `causal_mask`, `attention` and (through it) `softmax`, so a mistake there that
shows on the layer's inputs costs the layer's points too, and a mistake of `softmax` that shows on attention's
inputs costs attention's: those messages say which earlier function fails its own test (`judge.because_of`). The
visible tests use only the function of their own cell, so that every loss comes from the hidden checks, which
`hidden_check_tests` runs in process. Each cell's checks are weighted parts: a mistake usually costs the share of
the parts it breaks, not the whole cell. Nan where numbers belong (softmax-no-max on large scores,
attention-additive-mask-inf on any masked scores) must lose like any wrong value.
"""
from __future__ import annotations

from . import Edit, Mutant, Variant

CHAPTER = "03-attention"
LAYER = "test_causal_self_attention"
USES_SOFTMAX = "uses your softmax"
USES_ATTENTION = "uses your attention"

MASK_LINE = "torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)"
SCORES = "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])"
MASK_AND_SOFTMAX = """\
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores, dim=-1)
"""
SPLIT = "return x.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)"
MERGE = "return x.transpose(1, 2).reshape(B, T, H * D)"
FORWARD_ATTENTION = "y, _ = attention(q, k, v, causal_mask(T, device=x.device))"
SHIFT = "    shifted = x - x.amax(dim=dim, keepdim=True)\n"
SOFTMAX_CALL = "    weights = softmax(scores, dim=-1)\n"


def _mask(new: str) -> Edit:
    return Edit("causal_mask", MASK_LINE, new)


MUTANTS = [
    # ---- causal_mask
    Mutant(
        "mask-off-by-one",
        "the mask leaves out the diagonal (j < i)",
        (_mask("torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q - 1)"),),
        # Position 0 then sees nothing: the layer's output is nan there.
        {"test_causal_mask": "leaves out the diagonal", LAYER: "uses your causal_mask"},
    ),
    Mutant(
        "mask-upper-triangle",
        "the upper triangle (triu) instead of the lower",
        (_mask("torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(diagonal=t_k - t_q)"),),
        {"test_causal_mask": "upper triangle", LAYER: "uses your causal_mask"},
    ),
    Mutant(
        "mask-aligned-to-start",
        "with fewer queries than keys, the queries are taken as the first positions",
        (_mask("torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril()"),),
        # The layer only builds square masks, so it keeps its points.
        {"test_causal_mask": "the LAST t_q positions"},
    ),
    Mutant(
        "mask-ignores-device",
        "the device argument is accepted and never used",
        (_mask("torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q)"),),
        # On a CPU the mask is right wherever it was meant to go: only the device part is lost.
        {"test_causal_mask": "it was dropped"}, kept={"test_causal_mask": 7 / 8},
    ),
    # ---- softmax
    Mutant(
        "softmax-no-max",
        "softmax without subtracting the maximum",
        (Edit("softmax", "    shifted = x - x.amax(dim=dim, keepdim=True)\n", "    shifted = x\n"),),
        # attention's scores in the thousands overflow too.
        {"test_softmax": "Subtract the maximum along dim first", "test_attention": USES_SOFTMAX},
    ),
    Mutant(
        "softmax-global-max",
        "softmax subtracting the maximum of the whole tensor",
        (Edit("softmax", "x.amax(dim=dim, keepdim=True)", "x.max()"),),
        {"test_softmax": "maximum of the whole tensor", "test_attention": USES_SOFTMAX, LAYER: USES_SOFTMAX},
    ),
    Mutant(
        "softmax-last-dim",
        "softmax always along the last dim",
        (Edit("softmax", "x.amax(dim=dim, keepdim=True)", "x.amax(dim=-1, keepdim=True)"),
         Edit("softmax", "e.sum(dim=dim, keepdim=True)", "e.sum(dim=-1, keepdim=True)")),
        {"test_softmax": "not along dim 0"},
    ),
    # ---- attention
    Mutant(
        "attention-no-scale",
        "scores not divided by sqrt(D)",
        (Edit("attention", SCORES, "scores = q @ k.transpose(-2, -1)"),),
        {"test_attention": "divide q @ k^T by sqrt(D)", LAYER: USES_ATTENTION},
    ),
    Mutant(
        "attention-mask-after-softmax",
        "the mask applied to the weights, after the softmax",
        (Edit("attention", MASK_AND_SOFTMAX, """\
    weights = softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
"""),),
        {"test_attention": "applied after the softmax", LAYER: USES_ATTENTION},
    ),
    Mutant(
        "attention-mask-with-zero",
        "masked scores set to 0 instead of -inf",
        (Edit("attention", 'scores.masked_fill(~mask, float("-inf"))', "scores.masked_fill(~mask, 0.0)"),),
        {"test_attention": "fill them with -inf", LAYER: USES_ATTENTION},
    ),
    Mutant(
        "attention-softmax-over-queries",
        "softmax over the query axis",
        (Edit("attention", "weights = softmax(scores, dim=-1)", "weights = softmax(scores, dim=-2)"),),
        # A key's weights then depend on the later queries: the layer reads the future.
        {"test_attention": "over the queries", LAYER: USES_ATTENTION},
    ),
    # ---- CausalSelfAttention
    Mutant(
        "split-without-transpose",
        "heads split with a plain view(B, n_head, T, head_size)",
        (Edit("causal_self_attention", SPLIT, "return x.view(B, self.n_head, T, C // self.n_head)"),),
        {LAYER: "plain view(B, n_head, T, head_size)"},
    ),
    Mutant(
        "merge-without-transpose",
        "merge_heads reshapes without transposing back",
        (Edit("causal_self_attention", MERGE, "return x.reshape(B, T, H * D)"),),
        {LAYER: "does not undo the transpose"},
    ),
    Mutant(
        "no-c-proj",
        "forward without the output projection",
        (Edit("causal_self_attention", "return self.c_proj(self.merge_heads(y))", "return self.merge_heads(y)"),),
        {LAYER: "self.c_proj"},
    ),
    Mutant(
        "forward-without-mask",
        "forward calls attention without the causal mask",
        (Edit("causal_self_attention", FORWARD_ATTENTION, "y, _ = attention(q, k, v)"),),
        {LAYER: "peeks ahead"},
    ),
    # ---- issue 12: sizes, dtypes, interactions, state, stated behaviour, numeric range, gradients
    Mutant(
        "mask-t_k-or",
        "t_k defaulted with `t_k or t_q`, so that t_k=0 keys reads as t_k left out",
        (Edit("causal_mask", "t_k = t_q if t_k is None else t_k", "t_k = t_k or t_q"),),
        {"test_causal_mask": "test `t_k is None`"},
    ),
    Mutant(
        "softmax-float32",
        "softmax computed in float32 whatever the input's dtype",
        (Edit("softmax", SHIFT, "    x = x.float()  # softmax in float32, as large models do\n" + SHIFT),),
        # float32 weights @ float64 values raises in attention, named with its line (9: `return weights @ v, weights`).
        {"test_softmax": "float64 in, float64 out", "test_attention": "line 9", LAYER: USES_SOFTMAX},
    ),
    Mutant(
        "softmax-in-place",
        "softmax subtracts the maximum from the caller's tensor in place",
        (Edit("softmax", SHIFT + "    e = shifted.exp()\n",
              "    x -= x.amax(dim=dim, keepdim=True)  # in place: no copy of the scores\n    e = x.exp()\n"),),
        # attention's scores are then changed under the backward pass, which needs them.
        {"test_softmax": "changed its input in place", "test_attention": USES_SOFTMAX, LAYER: USES_SOFTMAX},
    ),
    Mutant(
        "softmax-detached-copy",
        "softmax works on a detached copy of x, so that no gradient reaches the scores",
        (Edit("softmax", SHIFT, "    shifted = x.detach().clone()  # a copy: the caller's scores stay as they were\n"
                                "    shifted -= shifted.amax(dim=dim, keepdim=True)\n"),),
        {"test_softmax": "carries no gradient", "test_attention": USES_SOFTMAX, LAYER: USES_SOFTMAX},
    ),
    Mutant(
        "attention-mask-sliced-square",
        "the mask sliced to [:T, :T] with T the number of queries, as nanoGPT slices its buffer",
        (Edit("attention", 'scores = scores.masked_fill(~mask, float("-inf"))',
              'T = q.shape[-2]\n        scores = scores.masked_fill(~mask[..., :T, :T], float("-inf"))'),),
        {"test_attention": "use the mask as it is given"},
    ),
    Mutant(
        "attention-naive-exp",
        "attention computes its weights with a plain exp instead of the softmax",
        (Edit("attention", SOFTMAX_CALL, "    e = scores.exp()\n    weights = e / e.sum(dim=-1, keepdim=True)\n"),),
        {"test_attention": "e^x overflows"},
    ),
    Mutant(
        "attention-additive-mask-inf",
        "the mask added as (~mask) * -inf: where keys are allowed that is 0 * -inf, nan",
        (Edit("attention", 'scores = scores.masked_fill(~mask, float("-inf"))',
              'scores = scores + (~mask) * float("-inf")  # 0 where allowed, -inf where hidden'),),
        {"test_attention": "0 * -inf = nan", LAYER: USES_ATTENTION},
    ),
    Mutant(
        "attention-detached-weights",
        "attention detaches its weights (for the heat maps) before multiplying v with them",
        (Edit("attention", SOFTMAX_CALL, "    weights = softmax(scores, dim=-1).detach()  # plain numbers, to plot\n"),),
        {"test_attention": "no gradient reaches q and k", LAYER: USES_ATTENTION},
    ),
    Mutant(
        "layer-mask-cached",
        "forward makes the mask on its first call and keeps it for the next ones",
        (Edit("causal_self_attention", FORWARD_ATTENTION,
              'if not hasattr(self, "mask"):  # made once, on the first call\n'
              "            self.mask = causal_mask(T, device=x.device)\n"
              "        y, _ = attention(q, k, v, self.mask)"),),
        {LAYER: "build the mask from each call's own T"},
    ),
    Mutant(
        "forward-no-grad",
        "forward decorated with @torch.no_grad()",
        (Edit("causal_self_attention", "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
              "    @torch.no_grad()  # no gradients needed to compute the output\n"
              "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"),),
        {LAYER: "carries no gradient"},
    ),
]


# ---------------------------------------------------------------- different but correct

TRIU_MASK = '''\
#| export
def causal_mask(t_q, t_k=None, device=None):
    """Bool (t_q, t_k): True where query i may attend to key j."""
    if t_k is None:
        t_k = t_q
    if t_q > t_k:
        raise ValueError("more queries than keys")
    future = torch.triu(torch.ones(t_q, t_k, dtype=torch.bool, device=device), diagonal=t_k - t_q + 1)
    return future.logical_not()
'''
MAX_VALUES_SOFTMAX = '''\
#| export
def softmax(x, dim=-1):
    """exp(x) / sum(exp(x)) along ``dim``, without overflow."""
    m = x.max(dim=dim, keepdim=True).values
    e = torch.exp(x - m)
    return e / torch.sum(e, dim=dim, keepdim=True)
'''
EINSUM_ATTENTION = '''\
#| export
def attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(D), masked) v, with einsum and a large negative number for the hidden scores."""
    scores = torch.einsum("...qd,...kd->...qk", q, k) / q.size(-1) ** 0.5
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), -1e9)
    weights = softmax(scores)
    return torch.einsum("...qk,...kd->...qd", weights, v), weights
'''
PERMUTE_SPLIT_MERGE = (
    Edit("causal_self_attention", SPLIT,
         "return x.reshape(B, T, self.n_head, -1).permute(0, 2, 1, 3)"),
    Edit("causal_self_attention", MERGE, "return x.permute(0, 2, 1, 3).contiguous().view(B, T, -1)"),
)

ARANGE_MASK = '''\
#| export
def causal_mask(t_q: int, t_k: int | None = None, device=None) -> torch.Tensor:
    t_k = t_q if t_k is None else t_k
    if t_q > t_k:
        raise ValueError(f"t_q={t_q} > t_k={t_k}")
    query_pos = torch.arange(t_k - t_q, t_k, device=device)[:, None]
    key_pos = torch.arange(t_k, device=device)[None, :]
    return key_pos <= query_pos
'''
L1_NORMALIZE_SOFTMAX = '''\
#| export
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    e = (x - x.max(dim, keepdim=True).values).exp()
    return torch.nn.functional.normalize(e, p=1, dim=dim)  # e / sum(|e|): e is positive
'''
WHERE_ATTENTION = '''\
#| export
def attention(q, k, v, mask=None):
    q = q * q.shape[-1] ** -0.5  # scale the queries, not the scores
    scores = torch.matmul(q, k.transpose(-1, -2))
    if mask is not None:
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    weights = softmax(scores, dim=scores.dim() - 1)
    return torch.matmul(weights, v), weights
'''
PER_HEAD_FORWARD = (
    Edit("causal_self_attention", """\
        T = x.shape[1]
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # 3 x (B, T, C)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        y, _ = attention(q, k, v, causal_mask(T, device=x.device))  # (B, H, T, D)
        return self.c_proj(self.merge_heads(y))
""", """\
        T = x.shape[1]
        q, k, v = self.c_attn(x).chunk(3, dim=-1)
        size = self.n_embd // self.n_head
        mask = causal_mask(T, device=x.device)
        outs = []
        for h in range(self.n_head):  # one head at a time, each on its own slice of the channels
            part = slice(h * size, (h + 1) * size)
            out, _ = attention(q[:, :, part], k[:, :, part], v[:, :, part], mask)
            outs.append(out)
        return self.c_proj(torch.cat(outs, dim=-1))
"""),
)

LOOP_MASK = '''\
#| export
def causal_mask(t_q, t_k=None, device=None):
    if t_k is None:
        t_k = t_q
    if t_q > t_k:
        raise ValueError("causal_mask: t_q must not exceed t_k")
    m = torch.zeros(t_q, t_k, dtype=torch.bool, device=device)
    offset = t_k - t_q
    for i in range(t_q):
        m[i, : offset + i + 1] = True
    return m
'''
ADDITIVE_ATTENTION = '''\
#| export
def attention(q, k, v, mask=None):
    d = q.shape[-1]
    scores = q @ k.mT / math.sqrt(d)
    if mask is not None:  # an additive mask: 0 where allowed, -inf where hidden
        bias = torch.zeros(mask.shape, dtype=scores.dtype).masked_fill(~mask, float("-inf"))
        scores = scores + bias
    w = softmax(scores, -1)
    return w @ v, w
'''

LOGSUMEXP_SOFTMAX = '''\
#| export
def softmax(x, dim=-1):
    """exp(x - logsumexp(x)): the log of the sum, computed by torch without overflow."""
    return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))
'''
DETACHED_WEIGHTS_ATTENTION = '''\
#| export
def attention(q, k, v, mask=None):
    scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -math.inf)
    weights = softmax(scores, dim=-1)
    out = weights @ v
    return out, weights.detach()  # the weights only for plotting; the output keeps its gradient
'''
INLINE_MASK_FORWARD = (
    Edit("causal_self_attention", FORWARD_ATTENTION,
         "mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # this call's own mask\n"
         "        y, _ = attention(q, k, v, mask)"),
)
DETACHED_MAX_SOFTMAX = '''\
#| export
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    m = x.amax(dim=dim, keepdim=True).detach()  # a constant shift: it changes neither the values nor the gradient
    e = torch.exp(x - m)
    return e / e.sum(dim=dim, keepdim=True)
'''
STACK_SPLIT_MERGE = (
    Edit("causal_self_attention", SPLIT, "return torch.stack(x.split(C // self.n_head, dim=-1), dim=1)"),
    Edit("causal_self_attention", MERGE, "return torch.cat(x.unbind(1), dim=-1)"),
)

VARIANTS = [
    Variant(
        "triu-einsum",
        "triu(...).logical_not() mask; max(...).values softmax; einsum attention masked with -1e9; "
        "reshape/permute heads",
        cells={"causal_mask": TRIU_MASK, "softmax": MAX_VALUES_SOFTMAX, "attention": EINSUM_ATTENTION},
        edits=PERMUTE_SPLIT_MERGE,
    ),
    Variant(
        "arange-where-per-head",
        "arange comparison mask; softmax as an L1 normalisation; torch.where with finfo.min; one head at a time",
        cells={"causal_mask": ARANGE_MASK, "softmax": L1_NORMALIZE_SOFTMAX, "attention": WHERE_ATTENTION},
        edits=PER_HEAD_FORWARD,
    ),
    Variant(
        "loop-additive",
        "mask filled row by row in a loop; an additive -inf mask",
        cells={"causal_mask": LOOP_MASK, "attention": ADDITIVE_ATTENTION},
    ),
    Variant(
        "logsumexp-inline-mask",
        "softmax as exp(x - logsumexp(x)); queries scaled before the product, mask == 0 filled with -math.inf, "
        "detached weights returned for plotting; forward makes its own tril mask",
        cells={"softmax": LOGSUMEXP_SOFTMAX, "attention": DETACHED_WEIGHTS_ATTENTION},
        edits=INLINE_MASK_FORWARD,
    ),
    Variant(
        "detached-max-stack-heads",
        "softmax with a detached maximum; heads split with torch.stack of x.split and merged with torch.cat",
        cells={"softmax": DETACHED_MAX_SOFTMAX},
        edits=STACK_SPLIT_MERGE,
    ),
]
