"""Draft heads: trained on the target's own hidden states they learn its continuations; the
engine drafts with them losslessly, from the right hidden state; the file format refuses
other models and malformed files; `tokenmill speculator train` runs end to end."""

from __future__ import annotations

import json

import pytest
import torch

from tests.tiny_models import make_hf_model, save_hf_folder
from tests.unit.test_invariance import run_checked
from tests.unit.test_spec_decode import repetitive_prompts
from tokenmill import LLM, SamplingParams
from tokenmill.cli import main as cli_main
from tokenmill.engine.scoring import sequence_hidden
from tokenmill.spec import training as T
from tokenmill.spec.draft_head import DraftHead, load_draft_head
from tokenmill.spec.draft_proposer import model_fingerprint, target_readout

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.1, weights="float32")


@pytest.fixture(scope="module")
def sequences(target):
    """The target's own greedy continuations of varied prompts: (ids, prompt length)."""
    prompts = repetitive_prompts(24, seed=5)
    outs = target.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    return [(p + o.outputs[0].token_ids, len(p)) for p, o in zip(prompts, outs, strict=True)]


@pytest.fixture(scope="module")
def trained(target, sequences, tmp_path_factory):
    model = target.engine.core.model
    cfg = model.config
    train_seqs = [ids for ids, _ in sequences[:20]]
    vocab = T.draft_vocabulary(train_seqs, 512, cfg.vocab_size)
    readout = target_readout(model, vocab)
    untrained = DraftHead(cfg.hidden_size, 2 * cfg.hidden_size, vocab)
    head = DraftHead(cfg.hidden_size, 2 * cfg.hidden_size, vocab)
    head.load_state_dict(untrained.state_dict())
    data = T.collect(target, train_seqs)
    losses = T.train(head, readout, data, epochs=24, lr=4e-3, batch_size=64)
    path = tmp_path_factory.mktemp("head") / "head.safetensors"
    head.save(path, "tiny", model_fingerprint(model), cfg.vocab_size)
    return head, untrained, readout, losses, path


def test_the_head_learns_the_targets_continuations(target, sequences, trained):
    """The tiny target is random (its continuations of unseen prompts are noise), so what is
    checked is learning: chains drafted from the head's own features reproduce the target's
    continuations it was trained on, where the untrained head drafts nothing right."""
    head, untrained, readout, losses, _ = trained
    assert losses[-1] < 0.2 * losses[0]
    seen = T.acceptance_length(head, readout, target, sequences[:20], 3)
    before = T.acceptance_length(untrained, readout, target, sequences[:20], 3)
    assert seen > 2.0 and before < 1.1, (seen, before)


@pytest.mark.parametrize("lookup", [True, False])
def test_drafting_with_the_head_is_lossless(tiny_llama_dir, sequences, trained, lookup):
    """Alone and batched; with n-gram lookup first (the repetitive prompts' drafts come from
    it, the others' from the head) and with the head alone."""
    path = trained[-1]
    prompts = [ids[:n] for ids, n in sequences[:6]] + repetitive_prompts(2, seed=9)
    plain = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.1, weights="float32", max_num_seqs=1)
    expected = [run_checked(plain, [p])[0] for p in prompts]
    # fixed: every draft verified; auto: chains sized by the head's calibrated scores
    for max_num_seqs, policy in ((1, "fixed"), (4, "fixed"), (4, "auto")):
        spec = LLM(
            str(tiny_llama_dir), kv_cache_memory_gib=0.1, weights="float32", speculator=str(path),
            num_speculative_tokens=4, speculative_draft_policy=policy, max_num_seqs=max_num_seqs,
            speculative_lookup=lookup,
        )  # fmt: skip
        assert run_checked(spec, prompts) == expected, (max_num_seqs, policy)
        drafter = spec.engine.core.drafter
        stats = drafter.stats
        assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
        by = stats.draft_tokens_by_proposer
        assert sum(by.values()) == stats.num_draft_tokens
        assert set(by) == ({"draft_head", "ngram"} if lookup else {"draft_head"})
        # each source's verifications feed its own server-wide estimate
        sources = drafter.policy.servers
        assert sources["proposer"].trials > 0
        assert (sources["lookup"].trials > 0) == lookup
        # the head's verified drafts calibrate its scores
        assert sum(drafter.policy.calibration.trials) > 0
    assert spec.engine.core.speculative_info()["method"] == "draft_head"
    assert spec.engine.core.speculative_info()["lookup_first"] is lookup


def test_the_proposer_gets_the_targets_last_hidden_state(tiny_llama_dir, trained):
    spec = LLM(
        str(tiny_llama_dir), kv_cache_memory_gib=0.1, weights="float32",
        speculator=str(trained[-1]), num_speculative_tokens=3, speculative_draft_policy="fixed",
    )  # fmt: skip
    proposer, seen = spec.engine.core.drafter.proposer, []
    proposer = getattr(proposer, "main", proposer)  # the head behind its n-gram lookup
    original = proposer.propose_scored

    def spy(token_ids, max_tokens, feature=None, min_chain_prob=0.0):
        seen.append((list(token_ids), feature))
        return original(token_ids, max_tokens, feature, min_chain_prob)

    proposer.propose_scored = spy
    spec.generate([{"prompt_token_ids": repetitive_prompts(1, seed=2)[0]}], GREEDY)
    assert len(seen) > 3
    for ids, feature in seen[::3]:
        # the feature that produced the last token: the last position's hidden state
        expected = sequence_hidden(spec.engine.core, ids[:-1])[-1]
        assert torch.allclose(feature, expected, atol=1e-4), len(ids)


def test_a_head_for_another_model_or_a_bad_file_is_a_clear_error(
    target, trained, tmp_path, tiny_llama_dir
):
    model = target.engine.core.model
    cfg = model.config
    path = trained[-1]
    head, meta = load_draft_head(path, model_fingerprint(model), cfg.hidden_size, cfg.vocab_size)
    assert meta["format"] == "tokenmill-draft-head" and head.draft_vocab.numel() <= 512
    other_dir = save_hf_folder(make_hf_model("llama", initializer_range=0.1), tmp_path / "other")
    with pytest.raises(ValueError, match="trained for another model"):
        LLM(str(other_dir), kv_cache_memory_gib=0.1, speculator=str(path))
    with pytest.raises(ValueError, match="trained for another model"):
        load_draft_head(path, model_fingerprint(model), cfg.hidden_size + 1, cfg.vocab_size)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="not a tokenmill draft head"):
        load_draft_head(junk, "x", cfg.hidden_size, cfg.vocab_size)
    with pytest.raises(FileNotFoundError):
        load_draft_head(tmp_path / "missing.safetensors", "x", cfg.hidden_size, cfg.vocab_size)
    with pytest.raises(ValueError, match="speculator"):
        LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.1, speculative="draft_head")


def test_speculator_train_cli_from_prompts_and_from_traces(tiny_llama_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "\n".join(f"Tell me about the number {i} and its friends." for i in range(8))
        + '\n{"messages": [{"role": "user", "content": "hello there"}]}\n'
    )
    out = tmp_path / "head.safetensors"
    common = ["--model", str(tiny_llama_dir), "--out", str(out), "--max-tokens", "24",
              "--epochs", "2", "--draft-vocab", "256", "--held-out", "0.25"]  # fmt: skip
    assert cli_main(["speculator", "train", "--prompts", str(prompts), *common]) == 0
    text = capsys.readouterr().out
    assert "acceptance length (K=3): held-out" in text and "held-out decode:" in text
    saved = tmp_path / "saved"
    few = ["--prompts", str(prompts), "--max-prompts", "4", "--save-traces", str(saved)]
    assert cli_main(["speculator", "train", *few, "--no-measure", *common]) == 0
    assert len(T.read_traces(saved)) == 4  # the first 4 prompts answered
    assert cli_main(["speculator", "train", "--prompts", str(prompts), "--max-prompts", "-1",
                     *common]) == 2  # fmt: skip
    for bad in (
        ["--noise", "-0.1"],
        ["--weight-decay", "-1"],
        ["--noise", "nan"],
        ["--noise", "inf"],
    ):
        assert cli_main(["speculator", "train", *few, *bad, *common]) == 2
    traces = tmp_path / "traces"
    traces.mkdir()
    lines = [json.dumps({"messages": [{"role": "user", "content": f"q{i}"}], "output": "a b c d e f"})
             for i in range(6)]  # fmt: skip
    lines += ["not json", json.dumps({"prompt": "p", "output": 3}), json.dumps([1, 2])]
    (traces / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    assert len(T.read_traces(traces)) == 6  # malformed records skipped
    assert cli_main(["speculator", "train", "--traces", str(traces), "--no-measure", *common]) == 0
    assert "wrote" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["speculator", "train", "--traces", str(empty), *common]) == 2


def test_recorded_traffic_trains_a_head(tiny_llama_dir, tmp_path, capsys):
    """--record-traffic writes completed requests (text and ids, private files, capped);
    `speculator train --traces` reads them back as the same token ids."""
    traces = tmp_path / "traffic"
    llm = LLM(
        str(tiny_llama_dir), kv_cache_memory_gib=0.1, record_traffic=str(traces),
        record_traffic_max_mib=1,
    )  # fmt: skip
    prompts = repetitive_prompts(6, seed=4)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    (part,) = traces.glob("*.jsonl")
    assert part.stat().st_mode & 0o777 == 0o600
    recs = [json.loads(line) for line in part.read_text().splitlines()]
    assert sorted((r["prompt_token_ids"], r["output_token_ids"]) for r in recs) == sorted(
        (p, o.outputs[0].token_ids) for p, o in zip(prompts, outs, strict=True)
    )
    assert all(r["finish_reason"] == "length" and isinstance(r["output"], str) for r in recs)
    read = T.read_traces(traces)
    assert sorted(T.tokenize(llm, t, 10_000) for t in read) == sorted(
        (p + o.outputs[0].token_ids, len(p)) for p, o in zip(prompts, outs, strict=True)
    )
    out = tmp_path / "head.safetensors"
    args = ["speculator", "train", "--model", str(tiny_llama_dir), "--traces", str(traces),
            "--out", str(out), "--epochs", "1", "--draft-vocab", "128", "--max-tokens", "8"]  # fmt: skip
    assert cli_main(args) == 0 and out.is_file()
    # the cap: recording stops, nothing is overwritten
    capped = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.1, record_traffic=str(tmp_path / "c"))
    recorder = capped.engine.core.recorder
    recorder.max_bytes = 2000
    capped.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    assert recorder.full and 0 < recorder.written <= 2000


@pytest.fixture(scope="module")
def packed_target(tmp_path_factory):
    from tests.unit.test_model_parity import write_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny-Q4_1.gguf"
    write_gguf(make_hf_model("llama"), path, "Q4_1")
    return LLM(str(path), kv_cache_memory_gib=0.05, weights="native")


@pytest.mark.parametrize("draft_vocab_size", [64, 61])
def test_a_packed_target_reads_drafts_out_through_its_own_kernel(packed_target, draft_vocab_size):
    """On native weights the draft vocabulary's lm_head rows stay packed (the target's own
    integer-dot GEMV, also for a vocabulary that is no multiple of its 16-row groups): the
    same logits as the float rows, to the activation rounding."""
    from tokenmill.kernels import ops

    model = packed_target.engine.core.model
    vocab = torch.randperm(model.config.vocab_size)[:draft_vocab_size].sort().values
    readout = target_readout(model, vocab)
    assert readout.packed_rows is not None
    if ops.int_dot_kind() > 0:
        assert readout.packed_rows.int_dot is not None
    head = DraftHead(model.config.hidden_size, 128, vocab)
    feature = torch.randn(model.config.hidden_size) * 5
    with torch.inference_mode():
        packed = head.draft_logits(feature, readout)
    with torch.no_grad():
        x = torch.nn.functional.rms_norm(feature, (feature.numel(),), eps=readout.eps)
        exact = (x * readout.final_norm) @ readout.lm_head_rows.t()
    assert torch.allclose(packed, exact, atol=1e-3), (packed - exact).abs().max()


def test_the_packed_head_drafts_what_the_float_head_predicts(trained):
    """Drafting runs the head's layers as Q8_0 blocks through the integer-dot GEMV: the
    predicted feature within the Q8_0 rounding of the float head's."""
    from tokenmill.spec.draft_proposer import PackedDraftHead

    head = trained[0]
    if not PackedDraftHead.supported(head):
        pytest.skip("no integer-dot kernel on this machine")
    packed = PackedDraftHead(head)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for _ in range(8):
            feature = torch.randn(head.hidden_size, generator=gen) * 4
            embedding = torch.randn(head.hidden_size, generator=gen)
            exact, got = head.step(feature, embedding), packed.step(feature, embedding)
            assert got.shape == exact.shape
            assert float((got - exact).norm() / exact.norm()) < 0.02


def test_the_built_in_prompts_are_many_and_leave_the_benchmark_out():
    """Self-distillation without traffic: thousands of distinct chat prompts (tasks x
    subjects), none of the chat prompts benchmarks/spec_decode.py measures a head on."""
    from benchmarks.spec_decode import tasks

    prompts = [t.messages[0]["content"] for t in T.read_prompts(T.BUILTIN_PROMPTS)]
    assert len(prompts) == len(set(prompts)) > 2000
    assert not set(tasks(False)["chat"]) & set(prompts)


def test_the_native_chain_drafts_what_the_python_loop_drafts(packed_target):
    """On native weights a chain of drafts is one native call (kernels/csrc/draft_chain.c):
    the same drafts as the loop it replaces (PackedDraftHead.step, the packed readout over a
    draft vocabulary that is no multiple of 16 rows, argmax), capped by max_tokens."""
    from tokenmill.spec.draft_proposer import DraftHeadProposer

    model = packed_target.engine.core.model
    cfg = model.config
    gen = torch.Generator().manual_seed(3)
    vocab = torch.randperm(cfg.vocab_size, generator=gen)[:100].sort().values
    head = DraftHead(cfg.hidden_size, 2 * cfg.hidden_size, vocab)
    with torch.no_grad():  # a head that is not fc alone (down starts at zero)
        head.down.weight.normal_(0.0, 0.2, generator=gen)
    proposer = DraftHeadProposer(head, target_readout(model, vocab), k=5)
    if proposer.chain is None:
        pytest.skip("no integer-dot kernel on this machine")
    chain, drafted = proposer.chain, set()
    for _ in range(12):
        feature = torch.randn(cfg.hidden_size, generator=gen) * 4
        context = torch.randint(0, cfg.vocab_size, (3,), generator=gen).tolist()
        proposer.chain = None
        loop = proposer.propose_scored(context, 5, feature)[0]
        proposer.chain = chain
        assert proposer.propose_scored(context, 5, feature)[0] == loop and len(loop) == 5
        assert proposer.propose_scored(context, 2, feature)[0] == loop[:2]
        assert set(loop) <= set(vocab.tolist())
        drafted.update(loop)
        # each draft's probability under the head: the softmax at its pick, as the loop's
        proposer.chain = None
        _, loop_probs = proposer.propose_scored(context, 5, feature)
        proposer.chain = chain
        drafts, probs = proposer.propose_scored(context, 5, feature)
        assert drafts == loop and len(probs) == 5
        assert all(0.0 < p <= 1.0 for p in probs)
        assert probs == pytest.approx(loop_probs, rel=1e-4)
        # the chain stops before the product of the probabilities falls below the floor
        floor = probs[0] * probs[1] * (1.0 + probs[2]) / 2
        assert proposer.propose_scored(context, 5, feature, floor)[0] == loop[:2]
        proposer.chain = None
        assert proposer.propose_scored(context, 5, feature, floor)[0] == loop[:2]
        proposer.chain = chain
    assert len(drafted) > 5  # the chains differ: features and tokens reach the drafts
