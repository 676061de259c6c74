"""Chapter 8 (training): realistic learner mistakes, each of which must lose points with a message that names
it, and different-but-correct answers, each of which must get full marks.

Solution cells: `get_batch`, `cross_entropy` (with perplexity), `estimate_loss`, `lr_at`, `train_step`, `train`.
Test cells: test_get_batch, test_cross_entropy, test_estimate_loss, test_lr_at, test_train_step, test_train.
estimate_loss and train_step call cross_entropy, and train calls get_batch, lr_at and train_step: a mistake
there costs those cells too (and their messages say so); a mistake in a later cell costs nothing before it.
"""
from __future__ import annotations

from . import Edit, Mutant, Variant

CHAPTER = "08-training"
USES_CE = ("test_estimate_loss", "test_train_step", "test_train")
PERPLEXITY_EXP = """\
    try:
        return math.exp(value)
    except OverflowError:  # a loss above log(sys.float_info.max), about 709.78
        return math.inf
"""
PERPLEXITY = "    value = loss.item() if isinstance(loss, torch.Tensor) else float(loss)\n" + PERPLEXITY_EXP

MUTANTS = [
    # ---- get_batch
    Mutant("batch-no-shift", "the target is the window itself",
           (Edit("get_batch", "ids[positions + 1].long()", "ids[positions].long()"),),
           {"test_get_batch": "the target is the window itself", "test_train": ""}),
    Mutant("batch-start-off-by-one", "starts drawn below len(ids) - block_size - 1",
           (Edit("get_batch", "torch.randint(len(ids) - block_size, ", "torch.randint(len(ids) - block_size - 1, "),),
           {"test_get_batch": "the starts are drawn below len(ids) - block_size - 1", "test_train": ""}),
    Mutant("batch-own-generator", "a generator of its own when none is given, not torch's global one",
           (Edit("get_batch", "    starts = torch.randint(",
                 "    if generator is None:  # reproducible batches: a generator of its own\n"
                 "        generator = torch.Generator()\n"
                 "    starts = torch.randint("),),
           {"test_get_batch": "the starts come from torch's global generator"}, kept={"test_get_batch": 1.75}),
    Mutant("batch-no-length-check", "no check that the stream holds a window and its target",
           (Edit("get_batch", """    if len(ids) < block_size + 1:
        raise ValueError(f"a window of block_size={block_size} and its target need {block_size + 1} ids, "
                         f"got {len(ids)}")
""", ""),),
           {"test_get_batch": "ValueError"}),
    # ---- cross_entropy
    Mutant("ce-sum", "sums the losses instead of taking their mean",
           (Edit("cross_entropy", "return -picked.mean()", "return -picked.sum()"),),
           {"test_cross_entropy": "you summed the losses", **{t: "" for t in USES_CE}}),
    Mutant("ce-naive-exp", "softmax by a plain exp: overflows for large logits",
           (Edit("cross_entropy", "log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)  # (B, T, V)",
                 "log_probs = torch.log(torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True))"),),
           {"test_cross_entropy": "overflows"}),
    Mutant("ce-bits", "the loss in bits (log base 2)",
           (Edit("cross_entropy", "return -picked.mean()", "return -picked.mean() / math.log(2)"),),
           {"test_cross_entropy": "bits", **{t: "" for t in USES_CE}}),
    Mutant("ce-item", "returns a float: no gradient can flow",
           (Edit("cross_entropy", "return -picked.mean()", "return -picked.mean().item()"),),
           {"test_cross_entropy": "0-d tensor", **{t: "" for t in USES_CE}}),
    # NaN and inf where a finite number is expected: each check compares with coursekit.testing.close, which a NaN
    # never passes (a test written `abs(got - want) > tol` lets every NaN through)
    Mutant("ce-one-hot", "the target's log-probability picked by a one-hot product: 0 * -inf is nan",
           (Edit("cross_entropy", "picked = log_probs.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)",
                 "picked = (torch.nn.functional.one_hot(targets.long(), logits.shape[-1]) * log_probs).sum(-1)"),),
           {"test_cross_entropy": "0 * -inf is nan"}),
    Mutant("perplexity-float32", "perplexity by torch.exp on a float32 tensor: inf above a loss of 88.7",
           (Edit("cross_entropy", PERPLEXITY, "    return float(torch.exp(torch.as_tensor(loss)))\n"),),
           {"test_cross_entropy": "overflows float32"}),
    Mutant("perplexity-overflows", "perplexity by math.exp alone: OverflowError past a loss of 709.78",
           (Edit("cross_entropy", PERPLEXITY_EXP, "    return math.exp(value)\n"),),
           {"test_cross_entropy": "return math.inf, as the docstring says"}),
    Mutant("perplexity-round-threshold", "perplexity inf from a round loss of 709, below what a float holds",
           (Edit("cross_entropy", PERPLEXITY_EXP, "    return math.exp(value) if value < 709 else math.inf\n"),),
           {"test_cross_entropy": "inf only past what a float holds"}, kept={"test_cross_entropy": 2 * 10 / 12}),
    # ---- estimate_loss
    Mutant("estimate-no-eval", "measures in training mode (dropout on)",
           (Edit("estimate_loss", "    model.eval()\n", ""),),
           {"test_estimate_loss": "training mode"}),
    Mutant("estimate-mode-not-restored", "leaves the model in eval mode",
           (Edit("estimate_loss", "        model.train(was_training)\n", "        pass\n"),),
           {"test_estimate_loss": "left the model in eval mode"}),
    Mutant("estimate-unweighted", "averages the chunks' losses, whatever their size",
           (Edit("estimate_loss", """        total = 0.0
        for chunk in starts.split(batch_size):
            positions = chunk[:, None] + torch.arange(block_size)
            total += cross_entropy(model(ids[positions]), ids[positions + 1]).item() * len(chunk)
        return total / len(starts)""", """        losses = []
        for chunk in starts.split(batch_size):
            positions = chunk[:, None] + torch.arange(block_size)
            losses.append(cross_entropy(model(ids[positions]), ids[positions + 1]).item())
        return sum(losses) / len(losses)"""),),
           {"test_estimate_loss": "you averaged the chunks' losses"}),
    # ---- lr_at
    Mutant("lr-warmup-from-zero", "the warm-up starts at a learning rate of 0",
           (Edit("lr_at", "return max_lr * (step + 1) / warmup_steps", "return max_lr * step / warmup_steps"),),
           {"test_lr_at": "the warm-up starts at 0", "test_train": ""}),
    Mutant("lr-cosine-to-zero", "the cosine ends at 0, not min_lr",
           (Edit("lr_at", "return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))",
                 "return 0.5 * max_lr * (1.0 + math.cos(math.pi * progress))"),),
           {"test_lr_at": "must end at min_lr", "test_train": ""}),
    Mutant("lr-blend-nan", "warm-up and decay blended without branches: with no warm-up, 0 * inf = nan",
           (Edit("lr_at", """    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / (max_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))""", """\
    s = torch.tensor(step, dtype=torch.float64)
    warm = max_lr * (s + 1) / warmup_steps  # a tensor: inf, not a ZeroDivisionError, when warmup_steps is 0
    progress = (s - warmup_steps).clamp(min=0) / (max_steps - warmup_steps)
    decay = min_lr + 0.5 * (max_lr - min_lr) * (1.0 + torch.cos(math.pi * progress))
    in_warmup = (s < warmup_steps).double()
    return min_lr if step >= max_steps else (in_warmup * warm + (1 - in_warmup) * decay).item()"""),),
           {"test_lr_at": "0 * inf = nan", "test_train": "learning rate nan"}),
    Mutant("lr-no-floor", "the cosine climbs back after max_steps",
           (Edit("lr_at", """    if step >= max_steps:
        return min_lr
""", ""),),
           {"test_lr_at": "after max_steps the rate stays at min_lr"}),
    # ---- train_step
    Mutant("step-no-zero-grad", "never clears the gradients: they add up from step to step",
           (Edit("train_step", "    optimizer.zero_grad(set_to_none=True)\n", ""),),
           {"test_train_step": "", "test_train": ""}),
    Mutant("step-zero-after-backward", "clears the gradients after backward: the step moves nothing",
           (Edit("train_step", """    optimizer.zero_grad(set_to_none=True)
    loss.backward()""", """    loss.backward()
    optimizer.zero_grad(set_to_none=True)"""),),
           {"test_train_step": "", "test_train": ""}),
    Mutant("step-no-clip", "never clips the gradients",
           (Edit("train_step", "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)\n", ""),),
           {"test_train_step": "clip the gradients", "test_train": ""}),
    Mutant("step-no-train-mode", "never puts the model in training mode",
           (Edit("train_step", "    model.train()\n", ""),),
           {"test_train_step": "eval mode"}),
    # ---- train
    Mutant("train-lr-not-set", "never sets the learning rate: the optimizer's own lr throughout",
           (Edit("train", """        for group in optimizer.param_groups:
            group["lr"] = lr
""", ""),),
           {"test_train": "learning rate"}),
    Mutant("train-lr-first-group", "sets the learning rate of the first parameter group only",
           (Edit("train", """        for group in optimizer.param_groups:
            group["lr"] = lr
""", """        optimizer.param_groups[0]["lr"] = lr
"""),),
           {"test_train": "every parameter group"}),
    Mutant("train-eval-off-by-one", "evaluates after eval_every steps counted from 0",
           (Edit("train", "(eval_every and done % eval_every == 0)", "(eval_every and step % eval_every == 0)"),),
           {"test_train": "called evaluate"}),
    Mutant("train-drops-max-grad-norm", "train_step called with its own default max_grad_norm, not train's",
           (Edit("train", "        loss = train_step(model, optimizer, x, y, max_grad_norm)\n",
                 "        loss = train_step(model, optimizer, x, y)\n"),),
           {"test_train": "pass max_grad_norm on"}),
    Mutant("train-calls-none", "calls evaluate even when none is given (its default, None)",
           (Edit("train", "        if evaluate is not None and ((eval_every and done % eval_every == 0) or done == steps)",
                 "        if (eval_every and done % eval_every == 0) or done == steps"),),
           {"test_train": "evaluate is None unless one is given"}),
    Mutant("train-evaluate-faked", "never calls evaluate: writes the evals it would return, and the calls a recorder "
           "would have seen",
           (Edit("train", '            log["evals"].append((done, evaluate(done)))\n',
                 '            log["evals"].append((done, done))\n'
                 '            evaluate.calls = [*getattr(evaluate, "calls", []), done]\n'),),
           {"test_train": "called evaluate with []"}),
    Mutant("train-ignores-start", "always starts from step 0",
           (Edit("train", "range(start_step, steps)", "range(steps)"),),
           {"test_train": "optimizer steps"}),
]

VARIANTS = [
    Variant("batch-stack", "get_batch by stacking slices", cells={"get_batch": '''\
#| export
def get_batch(ids: torch.Tensor, batch_size: int, block_size: int,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if ids.ndim != 1 or ids.numel() <= block_size:
        raise ValueError(f"need a 1-D stream of more than block_size={block_size} ids, got shape {tuple(ids.shape)}")
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator).tolist()
    if not starts:
        empty = torch.empty(0, block_size, dtype=torch.long)
        return empty, empty.clone()
    x = torch.stack([ids[s:s + block_size] for s in starts]).to(torch.int64)
    y = torch.stack([ids[s + 1:s + 1 + block_size] for s in starts]).to(torch.int64)
    return x, y
'''}),
    Variant("ce-log-softmax", "cross_entropy with log_softmax and gather, perplexity with torch.exp", cells={
        "cross_entropy": '''\
#| export
def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    B, T, V = logits.shape if logits.dim() == 3 else (None, None, None)
    if B is None or targets.shape != (B, T):
        raise ValueError(f"shapes {tuple(logits.shape)} and {tuple(targets.shape)} do not fit (B, T, V) and (B, T)")
    logp = torch.log_softmax(logits.reshape(B * T, V), dim=-1)
    return -logp[torch.arange(B * T), targets.reshape(-1).long()].mean()


def perplexity(loss) -> float:
    return float(torch.exp(torch.as_tensor(loss, dtype=torch.float64)))
'''}),
    Variant("lr-piecewise", "lr_at with the warm-up and the cosine written apart", edits=(
        Edit("lr_at", """    progress = (step - warmup_steps) / (max_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))""", """    decay_ratio = (step - warmup_steps) / (max_steps - warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return min_lr + coeff * (max_lr - min_lr)"""),)),
    Variant("estimate-one-pass", "estimate_loss by summing the losses of all positions", cells={"estimate_loss": '''\
#| export
def estimate_loss(model, ids, starts, block_size, batch_size=8):
    mode = model.training
    model.eval()
    with torch.no_grad():
        total, count = 0.0, 0
        for i in range(0, len(starts), batch_size):
            chunk = starts[i:i + batch_size]
            x = torch.stack([ids[s:s + block_size] for s in chunk.tolist()])
            y = torch.stack([ids[s + 1:s + block_size + 1] for s in chunk.tolist()])
            total += cross_entropy(model(x), y).item() * y.numel()
            count += y.numel()
    model.train(mode)
    return total / count
'''}),
    Variant("train-while", "train as a while loop, evaluating with a counter", cells={"train": '''\
#| export
def train(model, optimizer, train_ids, *, steps, batch_size, schedule, generator=None, max_grad_norm=1.0,
          eval_every=0, evaluate=None, start_step=0, progress=True):
    losses, evals = [], []
    bar = tqdm(total=steps - start_step, disable=not progress)
    step = start_step
    while step < steps:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, **schedule)
        x, y = get_batch(train_ids, batch_size, model.config.block_size, generator=generator)
        losses.append(train_step(model, optimizer, x, y, max_grad_norm=max_grad_norm))
        step += 1
        bar.update(1)
        if evaluate is not None and (step == steps or (eval_every > 0 and step % eval_every == 0)):
            evals.append((step, evaluate(step)))
    bar.close()
    return {"losses": losses, "evals": evals}
'''}),
]
