"""Each loss's value and gradient equal a hand computation of the Tinker doc formula; AdamW step."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import tinker
import torch
from tinker import types

from sailrl.runtime.backends.local import LocalServiceClient
from sailrl.runtime.backends.local.engine.losses import LossInputError

SEQS = [[72, 101, 108, 108, 111, 35, 50, 43], [35, 51, 45, 52, 61, 63]]


@pytest.fixture(scope="module")
def tc(tmp_path_factory):
    # float64, so batched (padded) and one-by-one computations agree to ~1e-12, not float32's ~1e-6
    svc = LocalServiceClient(base_dir=tmp_path_factory.mktemp("ckpt"), seed=0, dtype=torch.float64)
    client = svc.create_lora_training_client("sailrl/tiny", rank=4, seed=7)
    with torch.no_grad():  # make the adapters non-trivial so every LoRA matrix gets a gradient
        gen = torch.Generator().manual_seed(0)
        for name, p in client.peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.05)
    return client


def _hand_logprobs(model, seq: list[int]) -> torch.Tensor:
    """Learner logprobs of seq[1:] given seq[:-1], computed alone (no batching, no padding)."""
    logits = model(input_ids=torch.tensor([seq[:-1]])).logits[0]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq[1:])[:, None]).squeeze(-1)


def _hand_loss(loss_fn: str, lp: torch.Tensor, inp: dict, cfg: dict) -> torch.Tensor:
    # formulas copied from the Tinker doc "Basic loss functions"
    if loss_fn == "cross_entropy":
        return (-lp * inp["weights"]).sum()
    ratio = torch.exp(lp - inp["logprobs"])
    adv = inp["advantages"]
    if loss_fn == "importance_sampling":
        return -(ratio * adv).sum()
    low, high = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
    clipped = torch.clamp(ratio, low, high)
    if loss_fn == "ppo":
        return -torch.min(ratio * adv, clipped * adv).sum()
    if loss_fn == "cispo":
        return -(clipped.detach() * lp * adv).sum()
    beta = cfg.get("beta", 0.05)
    return -(lp * adv - 0.5 * beta * (lp - inp["logprobs"]) ** 2).sum()


def _inputs(model, loss_fn: str) -> list[dict[str, torch.Tensor]]:
    """Per-datum inputs; sampling logprobs are offset from the learner's so ratios straddle the clip
    range (ratio e^{+-0.5} = 1.65 / 0.61 on alternate tokens) and advantages alternate in sign."""
    out = []
    for seq in SEQS:
        n = len(seq) - 1
        with torch.no_grad():
            lp = _hand_logprobs(model, seq)
        offsets = torch.tensor([0.5 if i % 2 else -0.5 for i in range(n)])
        adv = torch.tensor([1.0 if i % 3 else -0.7 for i in range(n)])
        inp = {"target_tokens": torch.tensor(seq[1:])}
        if loss_fn == "cross_entropy":
            inp["weights"] = torch.tensor([0.0] + [1.0] * (n - 1))
        else:
            inp["logprobs"] = lp - offsets
            inp["advantages"] = adv
        out.append(inp)
    return out


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


CASES = [
    ("cross_entropy", {}),
    ("importance_sampling", {}),
    ("ppo", {}),
    ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    ("cispo", {}),
    ("dro", {}),
    ("dro", {"beta": 0.5}),
]


@pytest.mark.parametrize(("loss_fn", "cfg"), CASES)
def test_loss_and_gradient_match_hand_computation(tc, loss_fn, cfg):
    model = tc.peft_model
    inputs = _inputs(model, loss_fn)
    data = [
        types.Datum(model_input=types.ModelInput.from_ints(seq[:-1]), loss_fn_inputs=dict(inp))
        for seq, inp in zip(SEQS, inputs, strict=True)
    ]
    model.zero_grad(set_to_none=True)
    out = tc.forward_backward(data, loss_fn, cfg or None).result()
    got_grads = _grads(model)
    model.zero_grad(set_to_none=True)

    # the hand computation reads the inputs back from the Datums (float32 on the wire, as Tinker's)
    sent = [{k: v.to_torch().double() for k, v in d.loss_fn_inputs.items()} for d in data]
    hand = sum(
        _hand_loss(loss_fn, _hand_logprobs(model, seq), inp, cfg) for seq, inp in zip(SEQS, sent, strict=True)
    )
    hand.backward()
    want_grads = _grads(model)
    model.zero_grad(set_to_none=True)

    assert out.metrics["loss:sum"] == pytest.approx(float(hand.detach()), rel=1e-10, abs=1e-10)
    assert [o["logprobs"].to_torch().shape[0] for o in out.loss_fn_outputs] == [len(s) - 1 for s in SEQS]
    assert set(got_grads) == set(want_grads) and len(got_grads) > 0
    for name in want_grads:
        assert float((got_grads[name] - want_grads[name]).abs().max()) < 1e-9, name
    assert any(float(g.abs().max()) > 0 for g in got_grads.values())


def test_cross_entropy_datums_without_weights_weigh_every_token_1_beside_datums_with_them(tc):
    """The learner sums the loss over all datums' tokens at once: a datum sent without ``weights`` (optional for
    cross_entropy) counts each token once, beside one whose weights zero some tokens."""
    model = tc.peft_model
    weights = [0.0, 1.0, 2.0, 0.0, 1.0, 1.0, 0.5]
    data = [
        types.Datum(model_input=types.ModelInput.from_ints(SEQS[0][:-1]),
                    loss_fn_inputs={"target_tokens": SEQS[0][1:], "weights": weights}),
        types.Datum(model_input=types.ModelInput.from_ints(SEQS[1][:-1]), loss_fn_inputs={"target_tokens": SEQS[1][1:]}),
    ]
    model.zero_grad(set_to_none=True)
    out = tc.forward_backward(data, "cross_entropy").result()
    got = _grads(model)
    model.zero_grad(set_to_none=True)
    hand = (-_hand_logprobs(model, SEQS[0]) * torch.tensor(weights, dtype=torch.float64)).sum() - \
        _hand_logprobs(model, SEQS[1]).sum()
    hand.backward()
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    assert out.metrics["loss:sum"] == pytest.approx(float(hand.detach()), rel=1e-10)
    for name in want:
        assert float((got[name] - want[name]).abs().max()) < 1e-9, name


def test_ppo_clipping_engages(tc):
    """Every ratio above clip_high with A > 0: the clipped objective is constant, gradient exactly 0;
    cispo keeps a gradient there (its clipped ratio is only a detached weight)."""
    model = tc.peft_model
    seq = SEQS[0]
    with torch.no_grad():
        lp = _hand_logprobs(model, seq)
    inp = {"target_tokens": seq[1:], "logprobs": (lp - 0.5).tolist(), "advantages": [1.0] * (len(seq) - 1)}
    datum = types.Datum(model_input=types.ModelInput.from_ints(seq[:-1]), loss_fn_inputs=inp)
    model.zero_grad(set_to_none=True)
    out = tc.forward_backward([datum], "ppo").result()
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    assert all(float(g.abs().max()) == 0.0 for g in grads)
    assert out.metrics["loss:sum"] == pytest.approx(-1.2 * (len(seq) - 1), rel=1e-6)
    model.zero_grad(set_to_none=True)
    tc.forward_backward([datum], "cispo").result()
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    assert any(float(g.abs().max()) > 0 for g in grads)
    model.zero_grad(set_to_none=True)


def test_gradients_accumulate_until_optim_step(tc):
    model = tc.peft_model
    data = [
        types.Datum(model_input=types.ModelInput.from_ints(s[:-1]), loss_fn_inputs={"target_tokens": s[1:]})
        for s in SEQS
    ]
    model.zero_grad(set_to_none=True)
    tc.forward_backward(data, "cross_entropy").result()
    both = _grads(model)
    model.zero_grad(set_to_none=True)
    tc.forward_backward(data[:1], "cross_entropy").result()
    tc.forward_backward(data[1:], "cross_entropy").result()
    split = _grads(model)
    model.zero_grad(set_to_none=True)
    for name in both:
        assert torch.allclose(both[name], split[name], rtol=1e-5, atol=1e-7), name


def test_optim_step_is_adamw_with_the_given_params(tmp_path):
    svc = LocalServiceClient(base_dir=tmp_path, seed=0)
    client = svc.create_lora_training_client("sailrl/tiny", rank=2, seed=1)
    model = client.peft_model
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(SEQS[1][:-1]), loss_fn_inputs={"target_tokens": SEQS[1][1:]}
    )
    params = types.AdamParams(learning_rate=0.01, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1)
    shadow = copy.deepcopy(model)
    ref_params = [p for p in shadow.parameters() if p.requires_grad]
    ref_opt = torch.optim.AdamW(ref_params, lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
    for _ in range(2):
        client.forward_backward([datum], "cross_entropy").result()
        for p_ref, p in zip(ref_params, [p for p in model.parameters() if p.requires_grad], strict=True):
            p_ref.grad = p.grad.detach().clone()
        response = client.optim_step(params).result()
        ref_opt.step()
        ref_opt.zero_grad()
        assert response.metrics["learning_rate"] == 0.01
    for p_ref, p in zip(ref_params, [p for p in model.parameters() if p.requires_grad], strict=True):
        assert torch.equal(p_ref, p)
        assert p.grad is None


def test_bad_inputs_are_explained(tc):
    seq = SEQS[1]
    with_mask = types.Datum(
        model_input=types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={
            "target_tokens": seq[1:],
            "logprobs": [0.0] * 5,
            "advantages": [1.0] * 5,
            "mask": torch.ones(5),
        },
    )
    with pytest.raises(LossInputError, match="unexpected mask"):
        tc.forward_backward([with_mask], "importance_sampling").result()
    plain = types.Datum(
        model_input=types.ModelInput.from_ints(seq[:-1]), loss_fn_inputs={"target_tokens": seq[1:]}
    )
    with pytest.raises(LossInputError, match="missing advantages, logprobs"):
        tc.forward([plain], "ppo").result()
    with pytest.raises(LossInputError, match="no loss function 'reinforce'"):
        tc.forward([plain], "reinforce").result()
    with pytest.raises(LossInputError, match="not used by 'cross_entropy'"):
        tc.forward([plain], "cross_entropy", {"beta": 0.1}).result()
    short = types.Datum(
        model_input=types.ModelInput.from_ints(seq[:-1]), loss_fn_inputs={"target_tokens": seq[2:]}
    )
    with pytest.raises(ValueError, match="one value per token"):
        tc.forward([short], "cross_entropy").result()
    with pytest.raises(TypeError, match="only Adam"):
        tc.optim_step(tinker.types.DimuonParams(learning_rate=0.1))


def _group_datums(vocab: int, seed: int) -> list[types.Datum]:
    """Three RL groups (a prompt, 4 completions of 1-6 tokens each) plus a lone datum, as a step lists them."""
    gen = torch.Generator().manual_seed(seed)
    data = []
    for g, plen in enumerate((9, 7, 11)):
        prompt = torch.randint(3, vocab, (plen,), generator=gen).tolist()
        for _ in range(4):
            completion = torch.randint(3, vocab, (int(torch.randint(1, 7, (1,), generator=gen)),), generator=gen).tolist()
            full = prompt + completion
            data.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={
                "target_tokens": full[1:],
                "logprobs": [0.0] * (plen - 1) + [-3.0] * len(completion),
                "advantages": [0.0] * (plen - 1) + [0.25 * g - 0.3 + 0.1 * len(completion)] * len(completion),
            }))
    lone = torch.randint(3, vocab, (6,), generator=gen).tolist()
    data.append(types.Datum(model_input=types.ModelInput.from_ints(lone[:-1]), loss_fn_inputs={
        "target_tokens": lone[1:], "logprobs": [-3.0] * 5, "advantages": [0.5] * 5}))
    return data


@pytest.mark.parametrize("arch", ["sailrl/tiny", "llama", "gpt2"])
def test_datums_sharing_a_prompt_share_its_forward_with_the_same_logprobs_and_gradients(arch, tmp_path, monkeypatch):
    """An RL step's groups share their prompt's forward pass (trainer.shared_prefixes); the logprobs, loss and
    every LoRA gradient equal the one-pass forward's up to float32 rounding (a float64 model still normalises
    in float32: RMSNorm upcasts to float32, so gradients summed in another order differ by ~1e-8 relative)."""
    from sailrl.runtime.backends.local.engine import trainer as trainer_mod
    from tests.fakes.tiny_models import save_model_dir

    name = arch
    if arch != "sailrl/tiny":
        save_model_dir(arch, tmp_path / arch)
        name = str(tmp_path / arch)
    svc = LocalServiceClient(name, base_dir=tmp_path / "ck", seed=0, dtype=torch.float64)
    client = svc.create_lora_training_client(name, rank=4, seed=3)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for pname, p in client.peft_model.named_parameters():
            if "lora_B" in pname:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.05)
    data = _group_datums(min(client.peft_model.get_output_embeddings().out_features, 250), seed=2)
    plan = trainer_mod.shared_prefixes([d.model_input.to_ints() for d in data])
    assert plan is not None and plan[0] == [0] * 4 + [1] * 4 + [2] * 4 + [3]

    def run(shared: bool):
        if not shared:
            monkeypatch.setattr(trainer_mod, "shared_prefixes", lambda tokens, *_: None)
        out = client.forward_backward(data, "importance_sampling").result()
        monkeypatch.undo()
        grads = {n: p.grad.clone() for n, p in client.peft_model.named_parameters() if p.grad is not None}
        client.peft_model.zero_grad(set_to_none=True)
        return out, grads

    one_pass, one_grads = run(shared=False)
    shared, shared_grads = run(shared=True)
    # micro-batches of at most 20 tokens as padded (the step's 13 datums are 5-16 tokens long): 12 forward + backward
    # passes, some cutting a group (which then shares its prompt within each pass only)
    assert len(trainer_mod.micro_batches([d.model_input.length for d in data], 20)) == 12
    monkeypatch.setattr(trainer_mod, "tokens_per_chunk", lambda config: 20)
    chunked = client.forward_backward(data, "importance_sampling").result()
    monkeypatch.undo()
    chunked_grads = {n: p.grad.clone() for n, p in client.peft_model.named_parameters() if p.grad is not None}
    client.peft_model.zero_grad(set_to_none=True)
    # the completions after each shared prompt in passes of like lengths (a pass costing 1 token: as many passes as
    # there are lengths), each pass with its own copy of the prompt cache rows
    own = [d.model_input.length - plan[1][g] for d, g in zip(data, plan[0], strict=True)]
    assert len(trainer_mod.length_batches(own, 1)) > 2
    monkeypatch.setattr(trainer_mod, "pass_tokens", lambda config: 1)
    split = client.forward_backward(data, "importance_sampling").result()
    monkeypatch.undo()
    split_grads = {n: p.grad.clone() for n, p in client.peft_model.named_parameters() if p.grad is not None}
    client.peft_model.zero_grad(set_to_none=True)
    assert set(one_grads) == set(shared_grads) == set(chunked_grads) == set(split_grads) and len(one_grads) >= 8
    for other, other_grads in ((shared, shared_grads), (chunked, chunked_grads), (split, split_grads)):
        for a, b in zip(one_pass.loss_fn_outputs, other.loss_fn_outputs, strict=True):
            torch.testing.assert_close(b["logprobs"].to_torch(), a["logprobs"].to_torch(), atol=1e-6, rtol=0)
        assert other.metrics["loss:sum"] == pytest.approx(one_pass.metrics["loss:sum"], rel=1e-6)
        for n in one_grads:
            scale = float(one_grads[n].abs().max())
            assert scale > 0
            assert float((other_grads[n] - one_grads[n]).abs().max()) <= 1e-6 * scale, n


def test_micro_batches_bound_the_tokens_of_each_pass_and_keep_the_datums_in_order():
    from sailrl.runtime.backends.local.weights.tiny import tiny_config
    from sailrl.runtime.backends.local.engine.trainer import micro_batches, tokens_per_chunk

    assert micro_batches([5, 5, 5, 5], 10) == [range(0, 2), range(2, 4)]
    assert micro_batches([20, 3, 3], 10) == [range(0, 1), range(1, 3)]  # a longer datum runs alone
    assert micro_batches([1] * 3, 100) == [range(0, 3)]
    # counted as the learner pads a pass (its datums x its longest), not as the sum of their lengths
    assert micro_batches([50] + [1] * 50, 100) == [range(0, 2), range(2, 51)]
    assert micro_batches([], 10) == []
    # the built-in models never split a step; SmolLM2-135M's shape (30 layers, 576 / 1536, vocabulary 49,152)
    # takes about 900 tokens a pass within the 2 GiB budget
    assert tokens_per_chunk(tiny_config()) > 50_000
    smol = SimpleNamespace(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, vocab_size=49152)
    assert 800 <= tokens_per_chunk(smol) <= 1000
    assert tokens_per_chunk(smol, budget=4 << 30) // 2 == tokens_per_chunk(smol)


def test_length_batches_split_only_where_padding_costs_more_than_a_pass():
    from sailrl.runtime.backends.local.weights.tiny import tiny_config
    from sailrl.runtime.backends.local.engine.trainer import length_batches, pass_tokens

    assert length_batches([64] * 8, 75) == [list(range(8))]  # one length: one pass, in order
    assert length_batches([50, 60, 55, 64], 112) == [[0, 1, 2, 3]]  # 28 padded tokens do not pay for a pass
    assert length_batches([5, 60, 6, 64], 112) == [[0, 2], [1, 3]]  # 116 do
    assert len(length_batches([40, 60, 45, 64], 20)) > 1  # and 38 do at SmolLM2's pass cost
    assert length_batches([3], 1) == [[0]] and length_batches([], 1) == [[]]
    lengths = [4, 64, 30, 50, 12, 64, 5, 40]
    batches = length_batches(lengths, 4)
    assert sorted(i for b in batches for i in b) == list(range(8))
    padded = sum(len(b) * max(lengths[i] for i in b) + 4 for b in batches)
    assert padded < len(lengths) * 64 + 4  # fewer padded tokens, passes counted
    assert pass_tokens(tiny_config()) == 112  # measured: 111
    smol = SimpleNamespace(hidden_size=576, intermediate_size=1536)
    assert pass_tokens(smol) == 20  # measured: 22


def test_shared_prefixes_groups_runs_that_start_alike_and_declines_when_it_saves_little():
    from sailrl.runtime.backends.local.engine.trainer import shared_prefixes

    prompt_a, prompt_b = list(range(10, 30)), [10, 11, 12, 13, 14] + list(range(50, 65))  # both start with 10..14
    rows = [prompt_a + [1], prompt_a + [2, 3], prompt_b + [4], prompt_b + [5, 6, 7]]
    assert shared_prefixes(rows) == ([0, 0, 1, 1], [20, 20])  # not one group on the 5 shared tokens
    assert shared_prefixes([[1, 2, 3, 4, 5, 6, 7, 8], [9, 8, 7, 6, 5, 4]]) is None  # nothing shared
    long_tails = [prompt_a[:4] + list(range(100 + 40 * i, 140 + 40 * i)) for i in range(2)]
    assert shared_prefixes(long_tails) is None  # 4 of 44 tokens shared: under a quarter saved
    assert shared_prefixes(long_tails, 2) is None and shared_prefixes(long_tails, 1) == ([0, 0], [4])  # 4 > 2 passes
    step = [p + list(range(100 + 64 * i, 164 + 64 * i)) for p in (prompt_a, prompt_b) for i in range(4)]
    assert shared_prefixes(step) is None  # 2 x 3 x 20 of 672 tokens shared (18%) ...
    assert shared_prefixes(step, 111) is None and shared_prefixes(step, 59)[1] == [20, 20]  # ... pays over 2 x 59
    assert shared_prefixes([prompt_a, prompt_a]) == ([0, 0], [19])  # identical datums keep one token each


def test_a_long_prompt_beside_long_completions_stays_within_absolute_positions(tmp_path, monkeypatch):
    """GPT-2 numbers its 256 positions absolutely: a group with a 200-token prompt and 30-token completions in one
    pass beside one with a 5-token prompt and 60-token completions pads the first group's completions to 60 places,
    which must not be numbered past its last token (an IndexError at position 259 before). Same logprobs as the
    forward without shared prompts."""
    from sailrl.runtime.backends.local.engine import trainer as trainer_mod
    from tests.fakes.tiny_models import save_model_dir

    save_model_dir("gpt2", tmp_path / "gpt2")
    svc = LocalServiceClient(str(tmp_path / "gpt2"), base_dir=tmp_path / "ck", seed=0)
    client = svc.create_lora_training_client(str(tmp_path / "gpt2"), rank=4, seed=3)
    gen = torch.Generator().manual_seed(5)

    def datum(prompt: list[int], n: int) -> types.Datum:
        full = prompt + torch.randint(3, 250, (n,), generator=gen).tolist()
        return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={
            "target_tokens": full[1:], "logprobs": [-3.0] * (len(full) - 1),
            "advantages": [0.0] * (len(prompt) - 1) + [0.5] * n})

    long_prompt, short_prompt = (torch.randint(3, 250, (k,), generator=gen).tolist() for k in (200, 5))
    data = [datum(long_prompt, 30) for _ in range(3)] + [datum(short_prompt, 60) for _ in range(3)]
    assert max(d.model_input.length for d in data) < 256
    shared = client.forward_backward(data, "importance_sampling").result()
    monkeypatch.setattr(trainer_mod, "shared_prefixes", lambda tokens, *_: None)
    whole = client.forward_backward(data, "importance_sampling").result()
    for a, b in zip(whole.loss_fn_outputs, shared.loss_fn_outputs, strict=True):
        torch.testing.assert_close(b["logprobs"].to_torch(), a["logprobs"].to_torch(), atol=1e-5, rtol=0)
