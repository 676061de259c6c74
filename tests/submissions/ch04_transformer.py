"""Chapter 4 (the transformer): realistic learner mistakes, each of which must lose points with a message that
names it, and different-but-correct answers, each of which must get full marks.

Solution cells: `layer_norm` (LayerNorm), `mlp` (gelu and MLP), `block` (Block), `gpt` (GPT, whose forward is
the learner's). Test cells: test_layer_norm, test_mlp (gelu, then MLP), test_block, test_gpt. A Block is built
from the learner's LayerNorm and MLP, and a GPT from Blocks and a LayerNorm, so a mistake in a part also costs
the points of the cells after it; their messages then name the part ("fix LayerNorm first"). The checks use
eps = 1e-3 in one Block and one GPT config, so eps outside the square root shows there too.
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
        "rsqrt and a hand-written variance; gelu with a numeric constant; positions by hand and functools.reduce",
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
        x = self.emb.wte(idx) + self.emb.wpe(torch.arange(T, device=idx.device))
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
]
