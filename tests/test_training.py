"""Chapter 8's reference training code (minigpt.training) against PyTorch's own pieces: F.cross_entropy and its
gradient, LambdaLR, a hand-written AdamW step, and a training run split in two that must equal the same run in one
go (the shipped model's long run resumes from checkpoints that way)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from minigpt.training import cross_entropy, estimate_loss, get_batch, lr_at, make_optimizer, perplexity, spread, \
    train, train_step
from minigpt.transformer import GPT, GPTConfig

TINY = GPTConfig(vocab_size=97, block_size=16, n_layer=2, n_head=2, n_embd=24)


def tiny_gpt(seed: int) -> GPT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(TINY)


def stream(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("scale, dtype", [(1.0, torch.float32), (1000.0, torch.float32), (3.0, torch.float64)])
def test_cross_entropy_is_torchs_value_and_gradient(scale, dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 11, generator=g, dtype=dtype) * scale).requires_grad_(True)
    targets = torch.randint(11, (3, 5), generator=g)
    ours = cross_entropy(logits, targets)
    ours.backward()
    grad = logits.grad.clone()
    logits.grad = None
    theirs = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    theirs.backward()
    assert ours.dtype == dtype and torch.isfinite(ours)
    torch.testing.assert_close(ours, theirs, atol=1e-5 * scale, rtol=1e-5)
    torch.testing.assert_close(grad, logits.grad, atol=1e-6, rtol=1e-4)
    assert perplexity(ours) == (pytest.approx(math.exp(ours.item())) if ours.item() < 700 else math.inf)


def test_perplexity_is_inf_only_past_what_a_float_holds():
    """The docstring's edge: e ** loss is a float up to log(sys.float_info.max) = 709.7827, inf past it."""
    for loss in (700.0, 709.78, torch.tensor(709.78, dtype=torch.float64)):
        assert perplexity(loss) == pytest.approx(math.exp(float(loss)), rel=1e-12) and perplexity(loss) < math.inf
    for loss in (709.79, 1000.0, torch.tensor(1000.0), math.inf):
        assert perplexity(loss) == math.inf


def test_cross_entropy_refuses_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match=r"\(2, 3, 7\) and \(3, 2\)"):
        cross_entropy(torch.zeros(2, 3, 7), torch.zeros(3, 2, dtype=torch.long))


def test_get_batch_windows_and_targets():
    ids = torch.arange(1000, 1100)
    x, y = get_batch(ids, 5, 8, torch.Generator().manual_seed(3))
    starts = torch.randint(100 - 8, (5,), generator=torch.Generator().manual_seed(3))
    assert x.dtype == y.dtype == torch.long and x.shape == y.shape == (5, 8)
    assert torch.equal(x, 1000 + starts[:, None] + torch.arange(8)) and torch.equal(y, x + 1)
    x, y = get_batch(ids[:9], 3, 8)  # exactly one window fits
    assert torch.equal(x, ids[:8].expand(3, 8)) and torch.equal(y, ids[1:9].expand(3, 8))
    with pytest.raises(ValueError, match="need 9 ids, got 8"):
        get_batch(ids[:8], 1, 8)


@pytest.mark.parametrize("schedule", [dict(max_lr=6e-4, min_lr=6e-5, warmup_steps=10, max_steps=50),
                                      dict(max_lr=1e-3, min_lr=1e-3, warmup_steps=0, max_steps=5)])
def test_lr_at_is_nanogpts_schedule_and_lambdalr_follows_it(schedule):
    def nanogpt(it, max_lr, min_lr, warmup_steps, max_steps):  # nanoGPT's get_lr, written out again
        if it < warmup_steps:
            return max_lr * (it + 1) / warmup_steps
        if it > max_steps:
            return min_lr
        ratio = (it - warmup_steps) / (max_steps - warmup_steps)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)

    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=schedule["max_lr"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, **schedule) / schedule["max_lr"])
    for step in range(schedule["max_steps"] + 10):
        assert lr_at(step, **schedule) == pytest.approx(nanogpt(step, **schedule), abs=1e-15)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(step, **schedule), abs=1e-15)
        optimizer.step()
        scheduler.step()
    with pytest.raises(ValueError, match="warmup_steps < max_steps"):
        lr_at(0, max_lr=1e-3, min_lr=1e-4, warmup_steps=5, max_steps=5)


def test_train_step_is_one_adamw_step_on_the_clipped_gradient():
    # In float64: Adam divides by |gradient| + 1e-8, so in float32 a gradient whose terms cancel down to about 1e-8
    # moves a weight by lr / 1e-8 times its rounding error (1.7e-6 here between two correct losses, against the
    # step's 1e-2); float64's rounding is 1e9 times smaller, far below that 1e-8
    model, twin = tiny_gpt(1).double(), tiny_gpt(1).double()
    x, y = get_batch(stream(200), 4, TINY.block_size, torch.Generator().manual_seed(0))
    loss = train_step(model, make_optimizer(model, lr=1e-2), x, y, max_grad_norm=0.1)
    # by hand: the loss, its gradient, clipped to norm 0.1, one AdamW step
    params = dict(twin.named_parameters())
    want = F.cross_entropy(twin(x).flatten(0, 1), y.flatten())
    grads = torch.autograd.grad(want, list(params.values()))
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = min(1.0, 0.1 / (norm.item() + 1e-6))
    for (name, p), g in zip(params.items(), grads):
        step = 1e-2 * (g * scale) / ((g * scale).abs() + 1e-8)  # Adam's first step: lr * sign, almost
        decay = 1e-2 * 0.1 * p.detach() if p.dim() >= 2 else 0.0
        # a correct step is within 1e-13 (measured: 4e-15); a wrong one is off by about lr = 1e-2
        torch.testing.assert_close(dict(model.named_parameters())[name].detach(), p.detach() - decay - step,
                                   atol=1e-10, rtol=0, msg=name)
    assert loss == pytest.approx(want.item(), abs=1e-12)  # a loss of about 4.6, summed from 64 float64 terms


def test_estimate_loss_measures_without_gradients_and_gives_the_mode_back():
    model, ids = tiny_gpt(2), stream(300, 1)
    starts = spread(ids, TINY.block_size, 5)
    positions = starts[:, None] + torch.arange(TINY.block_size)
    with torch.no_grad():
        want = F.cross_entropy(model(ids[positions]).flatten(0, 1), ids[positions + 1].flatten()).item()
    for mode in (True, False):
        model.train(mode)
        assert estimate_loss(model, ids, starts, TINY.block_size, batch_size=2) == pytest.approx(want, abs=1e-5)
        assert model.training is mode
        assert all(p.grad is None for p in model.parameters())


def test_a_run_split_in_two_at_a_checkpoint_equals_the_run_in_one_go():
    schedule = dict(max_lr=3e-3, min_lr=3e-4, warmup_steps=2, max_steps=8)
    ids = stream(500, 2)

    def run(split: int | None):
        model = tiny_gpt(3)
        optimizer = make_optimizer(model, lr=3e-3)
        generator = torch.Generator().manual_seed(4)
        if split is None:
            return train(model, optimizer, ids, steps=8, batch_size=3, schedule=schedule, generator=generator,
                         progress=False)["losses"], model
        first = train(model, optimizer, ids, steps=split, batch_size=3, schedule=schedule, generator=generator,
                      progress=False)["losses"]
        # a checkpoint: the state dicts and the generator's state, saved and loaded into new objects
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": generator.get_state()}
        model = tiny_gpt(99)
        model.load_state_dict(state["model"])
        optimizer = make_optimizer(model, lr=3e-3)
        optimizer.load_state_dict(state["optimizer"])
        generator = torch.Generator()
        generator.set_state(state["rng"])
        second = train(model, optimizer, ids, steps=8, batch_size=3, schedule=schedule, generator=generator,
                       start_step=split, progress=False)["losses"]
        return first + second, model

    whole, model = run(None)
    split, resumed = run(5)
    assert whole == split
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_hidden_checks_pass_the_reference():
    import minigpt.training as t
    from autograder.sandboxed.hidden import check
    from autograder.trusted import forget_here

    forget_here()
    check("test_get_batch", t.get_batch)
    check("test_cross_entropy", t.cross_entropy, t.perplexity)
    check("test_estimate_loss", t.estimate_loss)
    check("test_lr_at", t.lr_at)
    check("test_train_step", t.train_step)
    check("test_train", t.train)


NOT_FINITE = [float("nan"), float("inf")]


def _judged(grade_id: str, *functions) -> dict[str, bool]:
    """{part: passed} of the hidden checks of ``grade_id`` run on ``functions`` in this process."""
    from autograder.judge import judge
    from autograder.trusted import LocalSession

    session = LocalSession(functions)
    stand_ins = [session.remote(session.server.describe(i)) for i in range(len(functions))]
    return {p.name: p.passed for p in judge(session, grade_id, stand_ins, {}).parts}


def _failed(parts: dict[str, bool]) -> set[str]:
    return {name for name, passed in parts.items() if not passed}


@pytest.mark.parametrize("bad", NOT_FINITE)
def test_the_hidden_checks_fail_a_loss_or_perplexity_that_is_not_finite(bad):
    """A check written `abs(got - want) > tol` passes every NaN: each value is compared with coursekit's close."""
    import minigpt.training as t

    assert "loss values" in _failed(_judged("test_cross_entropy", lambda z, y: t.cross_entropy(z, y) * bad,
                                            t.perplexity))
    assert _failed(_judged("test_cross_entropy", t.cross_entropy, lambda loss: bad)) == {"perplexity"}
    assert _failed(_judged("test_estimate_loss", lambda *a: t.estimate_loss(*a) * bad)) == {"the mean loss"}
    assert _failed(_judged("test_train_step", lambda *a: t.train_step(*a) * bad)) == {"the loss of each step"}

    def train(*args, **kwargs):
        log = t.train(*args, **kwargs)
        return {**log, "losses": [loss * bad for loss in log["losses"]]}

    assert _failed(_judged("test_train", train)) == {"the loss of each step"}


@pytest.mark.parametrize("bad", NOT_FINITE)
def test_the_hidden_checks_fail_a_learning_rate_that_is_not_finite(bad):
    import minigpt.training as t

    assert _failed(_judged("test_lr_at", lambda step, **schedule: t.lr_at(step, **schedule) * bad)) == {
        "the warm-up", "the cosine decay", "min_lr after max_steps"}

    def train(model, optimizer, *args, **kwargs):
        step = optimizer.step

        def step_at_bad_rate(*a, **k):  # whatever rate train set
            for group in optimizer.param_groups:
                group["lr"] = bad
            return step(*a, **k)

        optimizer.step = step_at_bad_rate
        return t.train(model, optimizer, *args, **kwargs)

    assert "the learning rate of each step" in _failed(_judged("test_train", train))


@pytest.mark.parametrize("bad", NOT_FINITE)
def test_the_hidden_checks_fail_weights_that_are_not_finite(bad):
    import minigpt.training as t

    def train_step(model, optimizer, x, y, max_grad_norm=1.0):
        loss = t.train_step(model, optimizer, x, y, max_grad_norm)
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] = bad
        return loss

    assert "the weights after the steps" in _failed(_judged("test_train_step", train_step))
