"""Trains a draft head on the target's own hidden states over recorded (or self-distilled)
traffic, on CPU, with a held-out split.

Traces: JSONL files, one request per line: {"messages": [...]} (chat) or {"prompt": "..."}
(completion), and {"output": "..."}: what `serve --record-traffic DIR` writes. Without
traces, a prompt file (one prompt per line, or JSONL with "prompt"/"messages") is answered by
the target itself (self-distillation: no dataset download).

Each sequence (prompt + output tokens) runs through the target once; position t gives the
example (f_t, x_{t+1}) -> (f_{t+1}, x_{t+2}), unrolled one more step on the head's own
predicted feature so that it learns to continue its own chain. Loss: cross-entropy of the
target's next token over the draft vocabulary, plus the distance between the predicted and the
target's normalized features.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tokenmill.spec.draft_head import DraftHead, TargetReadout, rms

logger = logging.getLogger(__name__)

MAX_TRACE_BYTES = 1 << 20  # one trace line longer than this is skipped
BUILTIN_PROMPTS = Path(__file__).parent / "data" / "self_distill_prompts.txt"


@dataclass
class Trace:
    messages: list[dict] | None
    prompt: str | None
    output: str
    token_ids: tuple[list[int], list[int]] | None = None  # (prompt, output) when recorded


def read_traces(directory: str | Path, limit: int = 100_000) -> list[Trace]:
    """Every well-formed record of the JSONL files in `directory` (bad lines skipped)."""
    traces: list[Trace] = []
    files = sorted(Path(directory).glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no *.jsonl traces in {directory}")
    for path in files:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if len(line) > MAX_TRACE_BYTES or len(traces) >= limit:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                trace = _trace(rec)
                if trace is not None:
                    traces.append(trace)
    return traces


def _trace(rec: object) -> Trace | None:
    if not isinstance(rec, dict) or not isinstance(rec.get("output"), str):
        return None
    ids = rec.get("prompt_token_ids"), rec.get("output_token_ids")
    if all(isinstance(x, list) and all(type(t) is int and t >= 0 for t in x) for x in ids):
        return Trace(None, rec.get("prompt"), rec["output"], (ids[0], ids[1]))
    messages, prompt = rec.get("messages"), rec.get("prompt")
    if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
        return Trace(messages, None, rec["output"])
    if isinstance(prompt, str):
        return Trace(None, prompt, rec["output"])
    return None


def write_traces(directory: str | Path, traces: list[Trace]) -> Path:
    """Traces as one JSONL file (what read_traces reads back)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "self-distilled.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for t in traces:
            rec = {"messages": t.messages} if t.messages is not None else {"prompt": t.prompt}
            f.write(json.dumps({**rec, "output": t.output}, ensure_ascii=False) + "\n")
    return path


def read_prompts(path: str | Path) -> list[Trace]:
    """Prompts to self-distill: plain lines, or JSONL records with "prompt" or "messages"."""
    out: list[Trace] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        rec = None
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                rec = None
        if isinstance(rec, dict) and isinstance(rec.get("messages"), list):
            out.append(Trace(rec["messages"], None, ""))
        elif isinstance(rec, dict) and isinstance(rec.get("prompt"), str):
            out.append(Trace([{"role": "user", "content": rec["prompt"]}], None, ""))
        else:
            out.append(Trace([{"role": "user", "content": line}], None, ""))
    if not out:
        raise ValueError(f"no prompts in {path}")
    return out


def self_distill(llm, prompts: list[Trace], max_tokens: int) -> list[Trace]:
    """The target's own greedy answers to the prompts."""
    from tokenmill.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    outs = llm.chat([p.messages for p in prompts], params)
    return [Trace(p.messages, None, o.outputs[0].text) for p, o in zip(prompts, outs, strict=True)]


def tokenize(llm, trace: Trace, max_len: int) -> tuple[list[int], int]:
    """(prompt + output token ids, prompt length), cut to max_len."""
    vocab = llm.engine.core.model.config.vocab_size
    if trace.token_ids is not None and all(t < vocab for x in trace.token_ids for t in x):
        prompt, output = trace.token_ids
        return (prompt + output)[:max_len], min(len(prompt), max_len)
    processor = llm.engine.processor
    if trace.messages is not None:
        _, ids = processor.render_chat(trace.messages, True, None, None)
    else:
        ids = llm.get_tokenizer().encode(trace.prompt or "")
    prompt = list(ids)
    out = prompt + llm.get_tokenizer().encode(trace.output, add_special_tokens=False)
    return out[:max_len], min(len(prompt), max_len)


@dataclass
class Examples:
    features: torch.Tensor  # [N, H] f_t
    tokens: torch.Tensor  # [N, 3] x_{t+1}, x_{t+2}, x_{t+3}
    next_features: torch.Tensor  # [N, 2, H] normalized f_{t+1}, f_{t+2}


def collect(llm, sequences: list[list[int]]) -> Examples:
    """The target's features over each sequence, cut into training examples."""
    from tokenmill.engine.scoring import sequence_hidden

    feats, toks, nexts = [], [], []
    for ids in sequences:
        if len(ids) < 5:
            continue
        h = sequence_hidden(llm.engine.core, ids)
        t = torch.tensor(ids)
        n = len(ids) - 3
        feats.append(h[:n])
        toks.append(torch.stack([t[1 : n + 1], t[2 : n + 2], t[3 : n + 3]], 1))
        hn = rms(h)
        nexts.append(torch.stack([hn[1 : n + 1], hn[2 : n + 2]], 1))
    if not feats:
        raise ValueError("no sequence long enough to train on")
    return Examples(torch.cat(feats), torch.cat(toks), torch.cat(nexts))


def draft_vocabulary(sequences: list[list[int]], size: int, vocab_size: int) -> torch.Tensor:
    counts = Counter(t for ids in sequences for t in ids if 0 <= t < vocab_size)
    ids = [t for t, _ in counts.most_common(size)]
    return torch.tensor(sorted(ids), dtype=torch.long)


def _draft_index(draft_vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    index = torch.full((vocab_size,), -100, dtype=torch.long)  # -100: ignored by the loss
    index[draft_vocab] = torch.arange(draft_vocab.numel())
    return index


def train(
    head: DraftHead,
    readout: TargetReadout,
    data: Examples,
    epochs: int = 4,
    lr: float = 2e-3,
    batch_size: int = 256,
    feature_weight: float = 1.0,
    noise: float = 0.5,
    weight_decay: float = 0.1,
    seed: int = 0,
    progress=None,
) -> list[float]:
    """AdamW over the examples; returns the mean loss of each epoch. The input features get
    uniform noise of `noise` times their RMS (as EAGLE does), so the head also learns to
    continue from its own imperfect predictions and overfits less."""
    torch.manual_seed(seed)
    # tensors made under inference mode (the engine's) cannot take part in autograd
    readout = TargetReadout(
        readout.embed_tokens, readout.final_norm.clone(), readout.lm_head_rows.clone(), readout.eps
    )
    data = Examples(data.features.clone(), data.tokens.clone(), data.next_features.clone())
    index = _draft_index(head.draft_vocab, readout.embed_tokens.shape[0])
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    n = data.features.shape[0]
    steps = epochs * ((n + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=max(steps, 1))
    ce, smooth = nn.CrossEntropyLoss(ignore_index=-100), nn.SmoothL1Loss()
    losses = []
    head.train()
    for epoch in range(epochs):
        order = torch.randperm(n)
        total, batches = 0.0, 0
        for start in range(0, n, batch_size):
            b = order[start : start + batch_size]
            f, x = data.features[b], data.tokens[b]
            if noise:
                scale = f.pow(2).mean(-1, keepdim=True).sqrt() * noise
                f = f + (torch.rand_like(f) * 2 - 1) * scale
            emb = readout.embed_tokens
            loss = torch.zeros(())
            for step in range(2):  # the second step continues from the predicted feature
                f = head.step(f, emb[x[:, step]].float().clone())
                logits = head.draft_logits(f, readout)
                loss = loss + ce(logits, index[x[:, step + 1]])
                loss = loss + feature_weight * smooth(rms(f), data.next_features[b, step])
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
            total += float(loss.detach())
            batches += 1
        losses.append(total / max(batches, 1))
        if progress is not None:
            progress(epoch, losses[-1])
    head.eval()
    return losses


@torch.inference_mode()
def acceptance_length(
    head: DraftHead, readout: TargetReadout, llm, sequences: list[tuple[list[int], int]], k: int
) -> float:
    """Mean tokens per verification step if the head drafted k tokens at every output
    position of these (ids, prompt length) sequences, greedy outputs of the target: a draft
    is accepted while it matches. All positions of a sequence draft their chains together."""
    from tokenmill.engine.scoring import sequence_hidden

    total, steps = 0, 0
    for ids, prompt_len in sequences:
        if len(ids) < prompt_len + 2:
            continue
        h = sequence_hidden(llm.engine.core, ids)
        tokens = torch.tensor(ids)
        starts = torch.arange(max(prompt_len - 1, 0), len(ids) - 1)  # each chain's position t
        feature, token = h[starts], tokens[starts + 1]
        alive = torch.ones(len(starts), dtype=torch.bool)
        accepted = torch.zeros(len(starts), dtype=torch.long)
        for i in range(k):
            target = starts + 2 + i  # the position draft i guesses
            alive &= target < len(ids)
            if not alive.any():
                break
            feature = head.step(feature, readout.embed_tokens[token].float())
            token = head.draft_vocab[head.draft_logits(feature, readout).argmax(-1)]
            alive &= token == tokens[target.clamp(max=len(ids) - 1)]
            accepted += alive
        total += int((1 + accepted).sum())
        steps += len(starts)
    return total / max(steps, 1)


def split(items: list, held_out: float, seed: int = 0) -> tuple[list, list]:
    items = list(items)
    random.Random(seed).shuffle(items)
    cut = max(1, int(len(items) * held_out)) if len(items) > 1 else 0
    return items[cut:], items[:cut]


def timed(fn, *args, **kw):
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t
