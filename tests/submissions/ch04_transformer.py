"""Chapter 4 (the transformer): realistic learner mistakes, each of which must lose points with a message that
names it, and different-but-correct answers, each of which must get full marks.

Solution cells: `layer_norm` (LayerNorm), `mlp` (gelu and MLP), `block` (Block), `gpt` (GPT, whose forward is
the learner's). Test cells: test_layer_norm, test_mlp (gelu, then MLP), test_block, test_gpt. A Block is built
from the learner's LayerNorm and MLP, and a GPT from Blocks and a LayerNorm, so a mistake in a part also costs
the points of the cells after it; their messages then name the part ("fix LayerNorm first") or the earlier test
cell that fails (judge.because_of: "it uses your LayerNorm, which fails its own test (test_layer_norm)"). The
checks use eps = 1e-3 in one Block and one GPT config, so eps outside the square root shows there too.

Besides the formulas, the checks hold every part to what training needs (issue 12): float64 in, float64 out;
gradients of a loss on the output equal to the oracle's (a forward under torch.no_grad(), a .detach() or numpy
loses points); inputs far from 0 and gelu at large |x|; a window of exactly block_size positions, and one more
refused with a ValueError naming block_size; ids of every integer dtype that chapter 2's Embeddings takes; a
position whose channels are all equal (variance 0), where a LayerNorm without eps gives 0 / 0 = nan (ln-no-eps).
Each cell's checks are weighted parts: a mistake usually costs the share of the parts it breaks, not the whole cell.
"""
from __future__ import annotations

from . import Edit, Mutant, Variant

CHAPTER = "04-transformer"

LN_BODY = """\
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
"""
GELU_BODY = "    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))\n"
MLP_BODY = "        return self.c_proj(gelu(self.c_fc(x)))\n"
BLOCK_BODY = """\
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x
"""
GPT_BODY = """\
        x = self.emb(idx)  # (B, T, C)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, vocab_size)
"""
TYING = "        self.lm_head.weight = self.emb.wte.weight  # weight tying: one table for reading and writing tokens\n"

# A mistake in a part costs the cells that use it: LayerNorm -> Block -> GPT, MLP -> Block -> GPT.
AFTER_LAYER_NORM = {"test_block": "fix LayerNorm first", "test_gpt": "fix LayerNorm first"}
AFTER_MLP = {"test_block": "fix gelu and MLP first", "test_gpt": "fix gelu and MLP first"}
AFTER_BLOCK = {"test_gpt": "fix Block first"}

MUTANTS = [
    # ---- LayerNorm
    Mutant(
        "ln-unbiased-variance",
        "LayerNorm with torch's default (unbiased, C - 1) variance",
        (Edit("layer_norm", "var = x.var(dim=-1, keepdim=True, unbiased=False)", "var = x.var(dim=-1, keepdim=True)"),),
        {"test_layer_norm": "unbiased variance", **AFTER_LAYER_NORM},
    ),
    Mutant(
        "ln-eps-outside-sqrt",
        "LayerNorm with eps outside the square root",
        (Edit("layer_norm", "torch.sqrt(var + self.eps)", "(torch.sqrt(var) + self.eps)"),),
        {"test_layer_norm": "eps belongs inside the square root", **AFTER_LAYER_NORM},
    ),
    Mutant(
        "ln-wrong-dim",
        "LayerNorm over dim 1 (the positions) instead of the channels",
        (Edit("layer_norm", LN_BODY, LN_BODY.replace("dim=-1", "dim=1")),),
        {"test_layer_norm": "you normalised over dim 1", **AFTER_LAYER_NORM},
    ),
    Mutant(
        "ln-no-weight",
        "LayerNorm without the learned scale",
        (Edit("layer_norm", " * self.weight + self.bias", " + self.bias"),),
        {"test_layer_norm": "scale `weight` is missing", **AFTER_LAYER_NORM},
    ),
    # ---- gelu and the MLP
    Mutant(
        "gelu-exact-erf",
        "the exact (erf) GELU instead of GPT-2's tanh form",
        (Edit("mlp", GELU_BODY, "    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))\n"),),
        {"test_mlp": "exact GELU", **AFTER_MLP},
    ),
    Mutant(
        "gelu-relu",
        "ReLU instead of GELU",
        (Edit("mlp", GELU_BODY, "    return torch.relu(x)\n"),),
        {"test_mlp": "this is ReLU", **AFTER_MLP},
    ),
    Mutant(
        "mlp-no-activation",
        "an MLP without its activation",
        (Edit("mlp", MLP_BODY, "        return self.c_proj(self.c_fc(x))\n"),),
        {"test_mlp": "the activation is missing", **AFTER_MLP},
    ),
    # ---- Block
    Mutant(
        "block-post-norm",
        "a post-norm block: the norm after the residual add",
        (Edit("block", BLOCK_BODY, """\
        x = self.ln_1(x + self.attn(x))
        x = self.ln_2(x + self.mlp(x))
        return x
"""),),
        {"test_block": "post-norm", **AFTER_BLOCK},
    ),
    Mutant(
        "block-no-mlp-residual",
        "no residual around the MLP",
        (Edit("block", "x = x + self.mlp(self.ln_2(x))", "x = self.mlp(self.ln_2(x))"),),
        {"test_block": "residual around the MLP is missing", **AFTER_BLOCK},
    ),
    Mutant(
        "block-ln2-for-both",
        "ln_2 before attention as well as before the MLP",
        (Edit("block", "self.attn(self.ln_1(x))", "self.attn(self.ln_2(x))"),),
        {"test_block": "ln_2 is used before attention too", **AFTER_BLOCK},
    ),
    # ---- GPT
    Mutant(
        "gpt-no-ln-f",
        "no final LayerNorm",
        (Edit("gpt", "return self.lm_head(self.ln_f(x))", "return self.lm_head(x)"),),
        {"test_gpt": "ln_f is missing"},
    ),
    Mutant(
        "gpt-no-positions",
        "token embeddings only, no positions",
        (Edit("gpt", "x = self.emb(idx)", "x = self.emb.wte(idx)"),),
        {"test_gpt": "position embeddings are missing"},
    ),
    Mutant(
        "gpt-reversed-blocks",
        "the blocks applied in reverse order",
        (Edit("gpt", "for block in self.h:", "for block in reversed(self.h):"),),
        {"test_gpt": "in reverse order"},
    ),
    Mutant(
        "gpt-untied-head",
        "lm_head not tied to the token table",
        (Edit("gpt", TYING, ""),),
        {"test_gpt": "lm_head is not tied"},
    ),
    Mutant(
        "gpt-logits-from-wpe",
        "logits from the position table",
        (Edit("gpt", "return self.lm_head(self.ln_f(x))", "return self.ln_f(x) @ self.emb.wpe.weight.T"),),
        {"test_gpt": "position table wpe"},
    ),
    # ---- issue 12: sizes, dtypes, numeric range, gradients
    Mutant(
        "gpt-positions-by-hand",
        "positions by hand, with no check of the window: more than block_size ids hit an IndexError",
        (Edit("gpt", "x = self.emb(idx)  # (B, T, C)",
              "x = self.emb.wte(idx) + self.emb.wpe(torch.arange(idx.shape[1], device=idx.device))"),),
        {"test_gpt": "expected a ValueError naming block_size"},
    ),
    Mutant(
        "gpt-crops-window",
        "the model crops ids longer than block_size instead of refusing them",
        (Edit("gpt", "x = self.emb(idx)  # (B, T, C)",
              "idx = idx[:, -self.config.block_size:]  # keep what fits\n        x = self.emb(idx)"),),
        {"test_gpt": "you cropped idx"},
    ),
    Mutant(
        "gpt-wte-by-hand",
        "embeddings by hand (window checked) with nn.Embedding on the ids as they are: int16 and int8 ids fail",
        (Edit("gpt", "x = self.emb(idx)  # (B, T, C)",
              "T = idx.shape[1]\n"
              "        if T > self.config.block_size:\n"
              "            raise ValueError(f\"{T} positions do not fit in block_size {self.config.block_size}\")\n"
              "        x = self.emb.wte(idx) + self.emb.wpe(torch.arange(T))"),),
        {"test_gpt": "int16 ids"},
    ),
    Mutant(
        "gpt-long-ids-only",
        "GPT.forward refuses ids that are not int64",
        (Edit("gpt", "x = self.emb(idx)  # (B, T, C)",
              "if idx.dtype != torch.long:\n"
              "            raise TypeError(f\"idx must hold int64 ids, got {idx.dtype}\")\n"
              "        x = self.emb(idx)"),),
        {"test_gpt": "int32 ids"},
    ),
    Mutant(
        "gelu-upcast-float32",
        "gelu computes in float32 whatever its input (a mixed-precision habit), returning float32",
        (Edit("mlp", GELU_BODY, "    x = x.float()  # tanh in full precision\n" + GELU_BODY),),
        {"test_mlp": "expected float64", "test_block": "test_mlp", "test_gpt": "test_mlp"},
    ),
    Mutant(
        "gpt-logits-float",
        "logits cast to float32 at the end (as LLaMA's code does)",
        (Edit("gpt", "return self.lm_head(self.ln_f(x))  # (B, T, vocab_size)",
              "return self.lm_head(self.ln_f(x)).float()  # (B, T, vocab_size)"),),
        {"test_gpt": "expected float64"},
    ),
    Mutant(
        "ln-var-by-moments",
        "the variance as mean(x^2) - mean^2, which cancels for inputs far from 0",
        (Edit("layer_norm", "var = x.var(dim=-1, keepdim=True, unbiased=False)",
              "var = (x * x).mean(dim=-1, keepdim=True) - mean ** 2"),),
        {"test_layer_norm": "whose mean is 300"},
    ),
    Mutant(
        "ln-no-eps",
        "LayerNorm without eps: a position whose channels are all equal gives 0 / 0, nan",
        (Edit("layer_norm", "torch.sqrt(var + self.eps)", "torch.sqrt(var)"),),
        {"test_layer_norm": "you left it out", **AFTER_LAYER_NORM},
    ),
    Mutant(
        "gelu-tanh-by-exp",
        "tanh written with exp, (e^2z - 1) / (e^2z + 1), which overflows for x > 10",
        (Edit("mlp", GELU_BODY, """\
    z = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    e = torch.exp(2 * z)
    return 0.5 * x * (1.0 + (e - 1) / (e + 1))
"""),),
        {"test_mlp": "exp overflows"},
    ),
    Mutant(
        "gelu-exp-nan-gradient",
        "tanh as 1 - 2 / (exp(2z) + 1): right values everywhere, but nan gradients where exp(2z) overflows",
        (Edit("mlp", GELU_BODY, """\
    z = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    return 0.5 * x * (2.0 - 2.0 / (torch.exp(2 * z) + 1.0))
"""),),
        {"test_mlp": "overflows in the backward pass"},
    ),
    Mutant(
        "gpt-no-grad",
        "GPT.forward under torch.no_grad() (it is only used for inference in this chapter)",
        (Edit("gpt", GPT_BODY, "        with torch.no_grad():\n" + GPT_BODY.replace("        ", "            ")),),
        {"test_gpt": "carries no gradient"},
    ),
    Mutant(
        "gelu-numpy",
        "gelu computed in numpy on x.detach(): right values, no gradient",
        (Edit("mlp", GELU_BODY, """\
    import numpy as np
    xn = x.detach().numpy()
    return torch.from_numpy(0.5 * xn * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (xn + 0.044715 * xn ** 3))))
"""),),
        {"test_mlp": "carries no gradient", "test_block": "test_mlp", "test_gpt": "test_mlp"},
    ),
    Mutant(
        "ln-detached-stats",
        "LayerNorm's mean and variance detached (taken as constants): right values, wrong gradients",
        (Edit("layer_norm", LN_BODY, LN_BODY.replace("keepdim=True)", "keepdim=True).detach()")),),
        {"test_layer_norm": "gradients are not", "test_block": "test_layer_norm", "test_gpt": "test_layer_norm"},
    ),
    Mutant(
        "gpt-softmax",
        "probabilities instead of logits",
        (Edit("gpt", "return self.lm_head(self.ln_f(x))", "return torch.softmax(self.lm_head(self.ln_f(x)), dim=-1)"),),
        {"test_gpt": "softmax"},
    ),
]


# ---------------------------------------------------------------- different but correct

VARIANTS = [
    Variant(
        "torch-built-ins",
        "torch's own F.layer_norm, F.gelu(approximate='tanh') and F.linear with the token table",
        edits=(
            Edit("layer_norm", LN_BODY, """\
        import torch.nn.functional as F
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
"""),
            Edit("mlp", GELU_BODY, """\
    import torch.nn.functional as F
    return F.gelu(x, approximate="tanh")
"""),
            Edit("block", BLOCK_BODY, """\
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp(self.ln_2(h))
"""),
            Edit("gpt", GPT_BODY, """\
        import torch.nn.functional as F
        x = self.emb(idx)
        for i in range(len(self.h)):
            x = self.h[i](x)
        return F.linear(self.ln_f(x), self.emb.wte.weight)
"""),
        ),
    ),
    Variant(
        "by-hand",
        "rsqrt and a hand-written variance; gelu with a numeric constant; positions by hand (the window checked "
        "there) and functools.reduce",
        edits=(
            Edit("layer_norm", LN_BODY, """\
        centred = x - x.mean(-1, keepdim=True)
        var = (centred ** 2).mean(-1, keepdim=True)
        return self.weight * centred * torch.rsqrt(var + self.eps) + self.bias
"""),
            Edit("mlp", GELU_BODY,
                 "    return x * 0.5 * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))\n"),
            Edit("gpt", GPT_BODY, """\
        import functools
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"{T} positions, but block_size is {self.config.block_size}")
        x = self.emb.wte(idx.long()) + self.emb.wpe(torch.arange(T, device=idx.device))
        x = functools.reduce(lambda h, block: block(h), self.h, x)
        return self.lm_head(self.ln_f(x))
"""),
        ),
    ),
    Variant(
        "sigmoid-einsum",
        "torch.var_mean; gelu through 0.5 (1 + tanh z) = sigmoid(2z); a loop over (norm, layer) pairs; "
        "logits by einsum with the head's weight",
        edits=(
            Edit("layer_norm", LN_BODY, """\
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
        return (x - mean) / (var + self.eps) ** 0.5 * self.weight + self.bias
"""),
            Edit("mlp", GELU_BODY,
                 "    return x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3)))\n"),
            Edit("block", BLOCK_BODY, """\
        for norm, layer in ((self.ln_1, self.attn), (self.ln_2, self.mlp)):
            x = x + layer(norm(x))
        return x
"""),
            Edit("gpt", GPT_BODY, """\
        x = self.emb(idx)
        for i, block in enumerate(self.h):
            x = block(x)
        return torch.einsum("btc,vc->btv", self.ln_f(x), self.lm_head.weight)
"""),
        ),
    ),
    Variant(
        "modules",
        "x.var(correction=0) and std; nn.GELU(approximate='tanh') as a submodule; an nn.Sequential of blocks",
        edits=(
            Edit("layer_norm", LN_BODY, """\
        mu = x.mean(dim=-1, keepdim=True)
        sd = (x.var(dim=-1, keepdim=True, correction=0) + self.eps).sqrt()
        return (x - mu) / sd * self.weight + self.bias
"""),
            Edit("mlp", "        self.c_proj = nn.Linear(4 * n_embd, n_embd)\n",
                 "        self.c_proj = nn.Linear(4 * n_embd, n_embd)\n"
                 "        self.act = nn.GELU(approximate=\"tanh\")\n"),
            Edit("mlp", MLP_BODY, "        return self.c_proj(self.act(self.c_fc(x)))\n"),
            Edit("gpt", "self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))",
                 "self.h = nn.Sequential(*[Block(config) for _ in range(config.n_layer)])"),
            Edit("gpt", GPT_BODY, """\
        return self.lm_head(self.ln_f(self.h(self.emb(idx))))
"""),
        ),
    ),
    Variant(
        "upcast-stable-exp",
        "LayerNorm in float32 and back (.type_as(x), as LLaMA's RMSNorm); tanh as sign(z) (1 - e) / (1 + e) with "
        "e = exp(-2|z|), which never overflows; nn.Linear's functional form in the MLP; long ids and the window "
        "checked in GPT.forward",
        edits=(
            Edit("layer_norm", LN_BODY, """\
        h = x.float()
        mean = h.mean(dim=-1, keepdim=True)
        var = ((h - mean) ** 2).mean(dim=-1, keepdim=True)
        return ((h - mean) / torch.sqrt(var + self.eps)).type_as(x) * self.weight + self.bias
"""),
            Edit("mlp", GELU_BODY, """\
    z = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    e = torch.exp(-2 * z.abs())  # exp of numbers <= 0 only: no overflow, forward or backward
    return 0.5 * x * (1.0 + torch.sign(z) * (1 - e) / (1 + e))
"""),
            Edit("mlp", MLP_BODY, """\
        import torch.nn.functional as F
        h = gelu(F.linear(x, self.c_fc.weight, self.c_fc.bias))
        return F.linear(h, self.c_proj.weight, self.c_proj.bias)
"""),
            Edit("gpt", GPT_BODY, """\
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"cannot read {T} tokens: block_size is {self.config.block_size}")
        x = self.emb.wte(idx.long()) + self.emb.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))
"""),
        ),
    ),
]
