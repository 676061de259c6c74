"""The reference generation loop (minigpt.generation) against its oracles, chapter 5.

Greedy decoding against Hugging Face's `generate(do_sample=False)` on random-weight GPT-2s and on the course's
trained model; past the window, against Hugging Face's forward on the last block_size tokens, step by step.
Stop strings and streaming against tiktoken's `decode` of the ids, on scripted token sequences that split stop
strings and UTF-8 characters across tokens. The hidden checks' own fixtures are tested here too: they must
pass on the reference, and no greedy step they rely on may be a near tie.
"""
import codecs
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import GPT2LMHeadModel

import coursekit
from autograder.checks import generation as checks
from autograder.sandboxed.helpers.generation import NotAModule, Scripted, drain
from minigpt import generation
from minigpt.generation import (TextStream, end_of_text_id, find_stop, generate, greedy, held_back, last_logits,
                                token_stream)
from minigpt.samplers import Sampler
from minigpt.tokens import gpt2_tokenizer
from minigpt.transformer import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("torch_one_thread")

MARGIN = 1e-3  # the smallest gap between the two best logits at a greedy step the checks rely on
END = 50256


@pytest.fixture(scope="module")
def enc():
    return coursekit.gpt2_encoding()


@pytest.fixture(scope="module")
def shipped():
    """(minigpt GPT, Hugging Face GPT2LMHeadModel) of the course's trained model."""
    folder = coursekit.shipped_model_dir()
    # float32 like minigpt's GPT (the file may store float16; HF would keep that and round differently)
    return GPT.from_pretrained(folder), GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tiny_gpt2():
    """A random GPT with GPT-2's vocabulary and a window of 16, for argument checks and streaming."""
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50257, block_size=16, n_layer=1, n_head=1, n_embd=8)).eval()


# ---------------------------------------------------------------- greedy against Hugging Face

@pytest.mark.parametrize("shape", sorted(checks.SHAPES))
@pytest.mark.parametrize("prompt_len", [1, 4])
def test_greedy_equals_hugging_face_generate(shape, prompt_len):
    hf, model = checks._models(shape)
    block = model.config.block_size
    prompt = checks._ids(prompt_len, model.config.vocab_size, seed=prompt_len)
    n = block - prompt_len
    want = checks.hf_generate(hf, prompt, n)
    assert list(token_stream(model, prompt, n)) == want
    assert checks.hf_loop(hf, prompt, n) == want, "the step-wise oracle must agree with generate where both run"


def test_greedy_equals_hugging_face_on_the_shipped_model(shipped, enc):
    model, hf = shipped
    prompt = enc.encode("ROMEO:\nWhat light through yonder window breaks?\n")
    want = checks.hf_generate(hf, prompt, 40)
    assert list(token_stream(model, prompt, 40)) == want
    result = generate(model, enc, prompt, 40, eos_ids=())
    assert result.ids == want and result.text == enc.decode(want) and result.finish_reason == "length"


def test_end_of_text_equals_hugging_face_eos(shipped, enc):
    """HF's generate stops after an eos_token_id and keeps it; so must token_stream."""
    model, hf = shipped
    prompt = enc.encode("JULIET:\n")
    free = checks.hf_generate(hf, prompt, 20)
    k = next(i for i in range(1, len(free)) if free[i] not in free[:i])
    want = checks.hf_generate(hf, prompt, 20, eos_ids={free[k]})
    assert want == free[:k + 1]
    assert list(token_stream(model, prompt, 20, eos_ids=[free[k]])) == want


def test_the_window_slides_like_hugging_face_step_by_step(shipped, enc):
    """Past block_size tokens the model reads the last block_size: compare each step with HF's forward on them."""
    model, hf = shipped
    block = model.config.block_size
    prompt = enc.encode(coursekit.corpus_texts()["hamlet"][:4000])[:block - 5]
    want = checks.hf_loop(hf, prompt, 12)
    assert list(token_stream(model, prompt, 12)) == want
    for ids in (prompt, prompt + want):
        assert torch.allclose(last_logits(model, ids), checks._hf_logits(hf, ids[-block:]), atol=1e-4)


@pytest.mark.parametrize("shape", sorted(checks.SHAPES))
def test_the_window_slides_on_random_models(shape):
    hf, model = checks._models(shape)
    block = model.config.block_size
    for prompt_len, n in [(2, 3 * block), (3 * block, 5)]:
        prompt = checks._ids(prompt_len, model.config.vocab_size, seed=n)
        assert list(token_stream(model, prompt, n)) == checks.hf_loop(hf, prompt, n)


def test_the_checks_can_tell_each_named_mistake_from_the_right_answer():
    """Each mistake the checks name gives another answer than the oracle on at least one of their cases."""
    for mistake, why in checks.WINDOW_MISTAKES:
        window, pos = mistake.get("window", checks._last), mistake.get("pos", -1)
        assert any(not torch.allclose(checks._hf_logits(hf, window(ids, block), pos),
                                      checks._hf_logits(hf, ids[-block:]), atol=1e-3)
                   for hf, _, ids, block in _last_logits_inputs()), why
    cases = [(case, checks._loop_case(case)) for case in checks.LOOP_CASES]
    for mistake, why in checks.LOOP_MISTAKES:
        assert any(checks.hf_loop(hf, prompt, case.n, set(eos), choose, **mistake) != want
                   for case, (hf, _, prompt, eos, choose, want) in cases), why


def _last_logits_inputs():
    for shape, length in checks.LAST_LOGITS_CASES:
        hf, model = checks._models(shape)
        block = model.config.block_size
        yield hf, model, checks._ids(length, model.config.vocab_size, seed=100 * length + block), block


def test_last_logits_is_the_last_position_without_a_graph():
    hf, model = checks._models("a")
    ids = checks._ids(5, model.config.vocab_size, seed=3)
    got = last_logits(model, ids)
    assert got.shape == (model.config.vocab_size,) and not got.requires_grad
    assert torch.allclose(got, checks._hf_logits(hf, ids), atol=1e-4)


def test_token_stream_is_lazy_and_leaves_the_prompt_alone():
    _, model = checks._models("a")
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))  # the model is shared: the hook goes after
    try:
        prompt = [1, 2, 3]
        stream = token_stream(model, prompt, 10)
        assert calls == []
        next(stream)
        assert calls == [1]
    finally:
        hook.remove()
    assert list(token_stream(model, prompt, 0)) == []
    list(token_stream(model, prompt, 5))
    assert prompt == [1, 2, 3]


def test_choose_gets_the_logits_and_all_ids_so_far():
    hf, model = checks._models("b")
    prompt = checks._ids(10, model.config.vocab_size, seed=4)  # longer than the window of 7
    seen = []

    def lowest(logits, ids):
        seen.append((logits, list(ids)))
        return int(torch.argmin(logits))

    got = list(token_stream(model, prompt, 4, choose=lowest))
    assert got == checks.hf_loop(hf, prompt, 4, choose=checks._lowest)
    assert [ids for _, ids in seen] == [prompt + got[:k] for k in range(4)]
    assert all(logits.shape == (model.config.vocab_size,) for logits, _ in seen)


def test_a_model_that_is_not_a_module_gives_the_same_tokens():
    """The model may be any callable with .config: the checks' NotAModule (which, like chapter 7's cache, returns
    only the positions it has not seen) and chapter 7's CachedModel itself give what the GPT gives."""
    from minigpt.kv_cache import CachedModel

    hf, model = checks._models("a")
    block = model.config.block_size
    prompt = checks._ids(4, model.config.vocab_size, seed=2)
    want = checks.hf_loop(hf, prompt, 12)
    assert list(token_stream(NotAModule(model), prompt, 12)) == want
    assert list(token_stream(CachedModel(model), prompt, 12)) == want
    plain = NotAModule(model)
    ids = checks._ids(max(checks.NOT_A_MODULE_LENGTHS), model.config.vocab_size, seed=5)
    returned = []
    for n in checks.NOT_A_MODULE_LENGTHS:
        returned.append(plain(torch.tensor([ids[:n][-block:]])).shape[1])
    assert returned == [3, 1, 1, 12, 12], "after the first call, the next two return the new position only"
    plain = NotAModule(model)
    for n in checks.NOT_A_MODULE_LENGTHS:
        assert torch.allclose(last_logits(plain, ids[:n]), checks._hf_logits(hf, ids[:n][-block:]), atol=1e-5)
    assert not any(hasattr(plain, name) for name in ("parameters", "eval", "forward", "device"))


def test_drain_gives_a_stop_iteration_back_at_its_line():
    """Inside a generator, a StopIteration becomes "RuntimeError: generator raised StopIteration", which names no line
    of the code that raised it; drain raises it again as the StopIteration it was, with its traceback."""
    from coursekit.testing import learner_frame

    def parameters_of_nothing():
        yield 1
        next(iter([]))  # the learner's next(model.parameters()) on a model that has none

    def outer():  # TextStream iterating token_stream
        yield from parameters_of_nothing()

    with pytest.raises(StopIteration) as caught:
        drain(outer(), 5)
    where = learner_frame(caught.value.__traceback__)
    assert where["function"].endswith("parameters_of_nothing") and where["text"].startswith("next(iter([]))")
    assert drain(iter([1, 2, 3]), 2) == ([1, 2], False)
    assert drain([1, 2], 5) == ([1, 2], True)
    assert drain((i for i in range(3)), 3) == ([0, 1, 2], False), "nothing read past the limit"
    with pytest.raises(RuntimeError, match="other"):
        drain(_raises(RuntimeError("other")), 5)


def _raises(err):
    yield 0
    raise err


def test_the_checks_never_rely_on_a_near_tie():
    """Every greedy step of the checks' oracle has a clear winner, so float rounding cannot flip it."""
    def margin(hf, window):
        top = torch.topk(checks._hf_logits(hf, window), 2).values
        return (top[0] - top[1]).item()

    for case in checks.LOOP_CASES:
        hf, shape, prompt, eos, choose, want = checks._loop_case(case)
        block = shape.block_size
        for k in range(len(want)):
            window = (prompt + want[:k])[-block:]
            logits = checks._hf_logits(hf, window)
            if case.choose:
                low = torch.topk(-logits, 2).values
                assert (low[0] - low[1]).item() > MARGIN, (case, k)
            else:
                assert margin(hf, window) > MARGIN, (case, k)
    for hf, model, ids, block in _last_logits_inputs():  # the checks compare logits with atol 1e-4
        assert torch.allclose(last_logits(model, ids), checks._hf_logits(hf, ids[-block:]), atol=1e-5)


# ---------------------------------------------------------------- stop strings

@pytest.mark.parametrize("text, stops", checks.FIND_STOP_CASES)
def test_find_stop_equals_re_search(text, stops):
    assert find_stop(text, stops) == checks.oracle_find_stop(text, stops)


@pytest.mark.parametrize("text, stops", checks.HELD_BACK_CASES)
def test_held_back_equals_brute_force(text, stops):
    assert held_back(text, stops) == checks.oracle_held_back(text, stops)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.text(alphabet="ab\n🎉", max_size=12), st.lists(st.text(alphabet="ab\n🎉", min_size=1, max_size=4),
                                                          max_size=3))
def test_stop_functions_on_random_text(text, stops):
    assert find_stop(text, stops) == checks.oracle_find_stop(text, stops)
    assert held_back(text, stops) == checks.oracle_held_back(text, stops)


# ---------------------------------------------------------------- streaming

def stream_case(case: checks.StreamCase, enc):
    script = [i for p in case.choose for i in enc.encode(p)] or case.script()
    model = Scripted(len(enc.encode(case.prompt)), case.script())
    options = {"stop": case.stop}
    if case.eos_ids is not None:
        options["eos_ids"] = case.eos_ids
    if case.choose:
        n = len(enc.encode(case.prompt))
        options["choose"] = lambda logits, ids: script[len(ids) - n]
    max_new = len(case.script()) if case.max_new is None else case.max_new
    stops = [case.stop] if isinstance(case.stop, str) else list(case.stop)
    eos = {END} if case.eos_ids is None else set(case.eos_ids)
    return model, max_new, options, checks.expected_stream(script, stops, eos, max_new)


@pytest.mark.parametrize("case", checks.STREAM_CASES, ids=lambda c: c.what)
def test_stream_equals_tiktoken_decode_cut_at_the_stop(case, enc):
    model, max_new, options, want = stream_case(case, enc)
    stream = TextStream(model, enc, case.prompt, max_new, **options)
    pieces = list(stream)
    assert "".join(pieces) == stream.text == want.text
    assert (stream.ids, stream.finish_reason) == (want.ids, want.finish_reason)
    if "\ufffd" not in want.text:
        assert all("\ufffd" not in p for p in pieces)
    assert all(p for p in pieces), "no empty pieces"
    result = generate(model, enc, case.prompt, max_new, **options)  # the non-streamed text is the same
    assert (result.text, result.ids, result.finish_reason) == (want.text, want.ids, want.finish_reason)


def test_stop_string_split_across_tokens_is_never_shown(enc):
    """While "THE END" arrives in pieces, its start is held back, never yielded."""
    script = enc.encode(" So it ends.") + enc.encode(" TH") + enc.encode("E") + enc.encode(" E") + enc.encode("ND")
    model = Scripted(len(enc.encode("ROMEO:")), script + enc.encode(" after"))
    pieces = list(TextStream(model, enc, "ROMEO:", 20, stop="THE END"))
    assert "".join(pieces) == " So it ends. "
    assert all("TH" not in p for p in pieces)


def test_an_emoji_split_across_tokens_streams_whole(enc):
    ids = enc.encode(" Party 🎉 and 語 done")
    assert len(ids) > len(" Party 🎉 and 語 done".split()), "the characters must really be split across tokens"
    model = Scripted(1, ids)
    stream = TextStream(model, enc, [END], len(ids))
    pieces = list(stream)
    assert any("🎉" in p for p in pieces) and any("語" in p for p in pieces)
    assert "".join(pieces) == enc.decode(ids)
    assert not any("\ufffd" in p for p in pieces)


POOL = [" the", " end", "\n", "\n\n", " THE", " EN", "D", "!", " ok", 12520, 236, 231, 8582, 45739, 252, 236, END]
STOP_POOL = ["\n\n", "THE END", "🎉", "!", "the", "語", " E", "d!"]


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(POOL), max_size=12), st.lists(st.sampled_from(STOP_POOL), max_size=3),
       st.integers(0, 12))
def test_stream_on_random_scripts(pieces, stops, max_new):
    enc = coursekit.gpt2_encoding()
    script = checks.StreamCase("random", tuple(pieces)).script() + [END]
    model = Scripted(1, script)
    stream = TextStream(model, enc, [END], max_new, stop=stops)
    got = list(stream)
    want = checks.expected_stream(script, stops, {END}, max_new)
    assert "".join(got) == stream.text == want.text
    assert (stream.ids, stream.finish_reason) == (want.ids, want.finish_reason)
    if "\ufffd" not in want.text:
        assert not any("\ufffd" in p for p in got)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.binary(max_size=5), max_size=8))
def test_incremental_decoding_equals_decoding_at_once(chunks):
    """Why streaming can match tiktoken: the incremental decoder gives what decoding all bytes at once gives."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = "".join(decoder.decode(c) for c in chunks) + decoder.decode(b"", final=True)
    assert text == b"".join(chunks).decode("utf-8", errors="replace")


def test_stream_on_the_shipped_model_equals_the_whole_text(shipped, enc):
    model, _ = shipped
    for stop in ((), "\n", ["\n\n", "ROMEO", ","]):
        stream = TextStream(model, enc, "ROMEO:\n", 40, stop=stop)
        pieces = list(stream)
        assert stream.ids == list(token_stream(model, enc.encode("ROMEO:\n"), len(stream.ids), eos_ids=[END]))
        full = enc.decode([i for i in stream.ids if i != END])
        cut = find_stop(full, [stop] if isinstance(stop, str) else stop)
        assert "".join(pieces) == stream.text == (full if cut is None else full[:cut])
    result = generate(model, enc, "ROMEO:\n", 40, stop=stop)  # not streamed: the same
    assert (result.ids, result.text, result.finish_reason) == (stream.ids, stream.text, stream.finish_reason)


def test_finish_reasons(tiny_gpt2, enc):
    first = generate(tiny_gpt2, enc, "Hi", 1).ids[0]
    assert generate(tiny_gpt2, enc, "Hi", 5, eos_ids=[first]).finish_reason == "eos"
    assert generate(tiny_gpt2, enc, "Hi", 5, eos_ids=[first]).ids == [first]
    assert generate(tiny_gpt2, enc, "Hi", 3, eos_ids=[]).finish_reason == "length"
    empty = generate(tiny_gpt2, enc, "Hi", 0)
    assert (empty.ids, empty.text, empty.finish_reason) == ([], "", "length")


def test_the_chapter_1_tokenizer_works_too(tiny_gpt2, enc):
    tok = gpt2_tokenizer()
    assert end_of_text_id(tok) == end_of_text_id(enc) == END
    a, b = generate(tiny_gpt2, tok, "To be", 12), generate(tiny_gpt2, enc, "To be", 12)
    assert (a.ids, a.text) == (b.ids, b.text)


# ---------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("args, options, what", checks.BAD_ARGUMENTS, ids=lambda x: x if isinstance(x, str) else "")
def test_the_checks_bad_arguments_raise_a_value_error(enc, args, options, what):
    with pytest.raises(ValueError):
        TextStream(Scripted(2, [13]), enc, *args, **options)


@pytest.mark.parametrize("prompt, max_new_tokens, stop, match", [
    ("", 5, (), "prompt is empty"),
    ([], 5, (), "prompt is empty"),
    ("Hi", -1, (), "non-negative integer"),
    ("Hi", 2.5, (), "non-negative integer"),
    ("Hi", "3", (), "non-negative integer"),
    ("Hi", True, (), "non-negative integer"),
    ([1, 50257], 5, (), "50257 is not in the model's vocabulary"),
    ([-1], 5, (), "-1 is not in the model's vocabulary"),
    ([1.0], 5, (), "1.0 is not in the model's vocabulary"),
    ([True], 5, (), "True is not in the model's vocabulary"),
    ("Hi", 5, "", "non-empty strings"),
    ("Hi", 5, ["\n", ""], "non-empty strings"),
    ("Hi", 5, [None], "non-empty strings"),
])
def test_bad_arguments_raise_a_clear_value_error(tiny_gpt2, enc, prompt, max_new_tokens, stop, match):
    with pytest.raises(ValueError, match=match):
        TextStream(tiny_gpt2, enc, prompt, max_new_tokens, stop=stop)
    with pytest.raises(ValueError, match=match):
        generate(tiny_gpt2, enc, prompt, max_new_tokens, stop=stop)


def test_an_over_long_prompt_warns_and_keeps_its_end(tiny_gpt2, enc):
    prompt = list(range(100, 140))  # 40 ids, window 16
    with pytest.warns(UserWarning, match="40 tokens but the model reads 16"):
        result = generate(tiny_gpt2, enc, prompt, 4)
    assert result.ids == list(token_stream(tiny_gpt2, prompt[-16:], 4))


# ---------------------------------------------------------------- the command line

CLI = str(Path(sys.executable).parent / "minigpt-generate")
CLI_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # a small model: threads would only wait on each other


def test_cli_streams_the_shipped_model(shipped, enc):
    """Greedy (--temperature 0): the text of generate, arriving while the command still writes."""
    model, _ = shipped
    prompt = "Romeo.\n"
    # (32 tokens: some 100 characters, the first 20 of them written while it still computes the rest)
    proc = subprocess.Popen([CLI, prompt, "--max-new-tokens", "32", "--temperature", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=CLI_ENV)
    seen = b""
    while len(seen) <= len(prompt) + 20:
        chunk = os.read(proc.stdout.fileno(), 4096)
        assert chunk, "the command ended before writing 20 characters of text"
        seen += chunk
    still_running = proc.poll() is None
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert still_running, "the text came out only when the command ended"
    text = (seen + out).decode()
    want = generate(model, enc, prompt, 32)
    assert text == prompt + want.text
    assert f"finish_reason={want.finish_reason}]" in err.decode() and "seed=" not in err.decode()


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of minigpt-generate run in this process."""
    try:
        status = generation.main(list(args))
    except SystemExit as exit_:
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_samples_with_chapter_6s_settings(shipped, enc, capsys):
    """By default it samples (temperature 0.8, top-k 40, top-p 0.95); a seed gives generate's text with the same
    Sampler, and a run without one prints the seed it drew, which gives the same text again."""
    model, _ = shipped
    prompt, stops = "Juliet.\n", ["\n\n"]
    ids = enc.encode(prompt)
    settings = dict(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3, seed=11)
    status, out, err = run_cli(capsys, prompt, "--max-new-tokens", "40", "--stop", stops[0], "--temperature", "0.7",
                               "--top-k", "20", "--top-p", "0.9", "--repetition-penalty", "1.3", "--seed", "11")
    want = generate(model, enc, prompt, 40, stop=stops,
                    choose=Sampler(do_sample=True, **settings, prompt_len=len(ids)))
    assert status == 0 and out == prompt + want.text, err
    assert f"finish_reason={want.finish_reason}, seed=11]" in err
    assert want.text != generate(model, enc, prompt, 40, stop=stops).text  # not greedy's text

    status, first, err = run_cli(capsys, prompt, "--max-new-tokens", "30")
    assert status == 0
    seed = int(err.rsplit("seed=", 1)[1].rstrip("]\n"))
    assert run_cli(capsys, prompt, "--max-new-tokens", "30", "--seed", str(seed))[1] == first


@pytest.mark.parametrize("args, message", [
    (["Romeo.", "--max-new-tokens", "many"], "argument --max-new-tokens: invalid int value: 'many'"),
    (["Romeo.", "--max-new-tokens", "-3"], "argument --max-new-tokens: must be a non-negative integer, got -3"),
    (["", "--max-new-tokens", "5"], "the prompt is empty"),
    (["Romeo.", "--stop", ""], "argument --stop: must not be empty"),
    (["Romeo.", "--stop", "\n", "--stop", ""], "argument --stop: must not be empty"),
    (["Romeo.", "--top-p", "1.5"], "argument --top-p: must be in (0, 1], got 1.5"),
    (["Romeo.", "--temperature", "-1"], "argument --temperature: must be >= 0, got -1.0"),
    (["Romeo.", "--min-p", "2"], "argument --min-p: must be in [0, 1], got 2.0"),
    (["Romeo.", "--no-repeat-ngram-size", "-1"], "argument --no-repeat-ngram-size: must be an integer >= 0, got -1"),
    (["Romeo.", "--presence-penalty", "nan"], "argument --presence-penalty: must be a finite number, got 'nan'"),
    (["Romeo.", "--model", "no/such/folder"], "--model no/such/folder: not a GPT-2 folder (it has no config.json and "
                                              "no model.safetensors)"),
])
def test_cli_bad_arguments_exit_2_with_a_message(capsys, args, message):
    """Each in the flag's name as typed (--top-p), never the Python parameter's (top_p)."""
    status, _, err = run_cli(capsys, *args)
    assert status == 2 and message in err and "Traceback" not in err, err
    assert "_" not in err.split("error: ", 1)[1], err


def test_cli_a_model_folder_that_does_not_load_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    status, _, err = run_cli(capsys, "Romeo.", "--model", str(tmp_path))
    assert status == 2 and f"--model {tmp_path}: cannot load it (" in err, err


def test_cli_on_a_package_with_exercises_left_says_which(shipped, capsys, monkeypatch):
    """A learner's package exported before chapter 6 is done: one line that names the function, not a traceback."""
    learners = {}  # what an exported samplers.py holds before the exercise is done
    exec(compile("class Sampler:\n    def __call__(self, logits, ids):\n        raise NotImplementedError()\n",
                 "samplers.py", "exec"), learners)
    monkeypatch.setattr(Sampler, "__call__", learners["Sampler"].__call__)
    status, out, err = run_cli(capsys, "Romeo.\n", "--max-new-tokens", "3", "--seed", "1")
    assert status == 1 and out == "Romeo.\n", err
    assert err.strip() == ("minigpt-generate: Sampler.__call__ (samplers.py) is not written yet in this package: "
                           "finish its exercise and export the package again, or use --temperature 0 (greedy)")
    assert run_cli(capsys, "Romeo.\n", "--max-new-tokens", "3", "--temperature", "0")[0] == 0


# ---------------------------------------------------------------- the hidden checks on the reference

@pytest.mark.parametrize("grade_id, args", [
    ("test_last_logits", (last_logits,)),
    ("test_token_stream", (token_stream,)),
    ("test_stop_strings", (find_stop, held_back)),
    ("test_text_stream", (TextStream,)),
])
def test_hidden_checks_pass_on_the_reference(grade_id, args):
    """The checks judge stand-ins of the learner's objects: they run as a hidden test cell runs them (the judge in
    this process, through the same plain data)."""
    from autograder.sandboxed.hidden import check
    from autograder.trusted import forget_here

    forget_here()
    check(grade_id, *args)


def test_the_learner_side_builds_the_checks_models_without_transformers_or_this_chapter():
    """The helpers run in chapter 5's sandbox: minigpt.generation cannot be imported there, and importing
    transformers would cost seconds in every notebook. The GPT they build holds the weights the judge's Hugging
    Face model holds."""
    from autograder.run import blocked_modules

    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked_modules('05-generation')!r}))\n"
            "import torch\n"
            "from autograder.sandboxed.helpers import make\n"
            f"model = make('generation.seeded_gpt', **{checks._recipe('a')!r})\n"
            "make('generation.Scripted', 1, [1, 2])\n"
            "make('generation.NotAModule', model)(torch.tensor([[1, 2]]))\n"
            "assert make('generation.drain', make('generation.generator_of', [4, 5]), 9) == ([4, 5], True)\n"
            "assert 'transformers' not in sys.modules, 'the helpers imported transformers'\n"
            "print(repr(model(torch.tensor([[1, 2, 3]]))[0, -1].tolist()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    got = torch.tensor(eval(out.stdout))
    hf, _ = checks._models("a")
    assert torch.allclose(got, checks._hf_logits(hf, [1, 2, 3]), atol=1e-5)


def test_greedy_breaks_ties_like_argmax():
    assert greedy(torch.tensor([1.0, 3.0, 3.0, 0.0]), []) == 1
