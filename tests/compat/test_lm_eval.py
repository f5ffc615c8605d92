"""lm-evaluation-harness (`local-completions`, remote tokenizer) against a live server.

Every loglikelihood lm-eval computes from the server's echoed prompt logprobs must match
Hugging Face transformers on the same GGUF file, on a first run and on a second run whose
prompts are served from the prefix cache.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import torch

from tests.compat.common import DATA, MODEL, SKIP_REASON
from tests.model.test_native_embedded import LOGIT_BOUND

pytest.importorskip("lm_eval", reason=SKIP_REASON)

TASK = "tokenmill_tiny_mc"
# nats: the embedded model's logit bound at the integer-dot kernels' activation bits (measured
# 2.4e-5 at 24 bits, prefix cache off and on; 3.2e-3 at 16, the default)
TOL = LOGIT_BOUND


def make_lm(server, tokenizer_backend: str = "remote", **kwargs: Any):
    from lm_eval.api.registry import get_model

    return get_model("local-completions")(
        base_url=f"{server.v1}/completions",
        model=MODEL,
        tokenizer_backend=tokenizer_backend,
        max_retries=1,  # a server error fails the test at once instead of after backoff
        timeout=300,
        **kwargs,
    )


def evaluate(lm, monkeypatch: pytest.MonkeyPatch) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(DATA)  # the task YAML names its data file relative to its folder
    tm = TaskManager(include_path=str(DATA), include_defaults=False)
    out = simple_evaluate(
        model=lm, tasks=[TASK], task_manager=tm, log_samples=True, bootstrap_iters=0
    )
    assert out is not None
    return out


def prefix_cache_hits(server) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    m = re.search(r"^tokenmill:prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert m, "tokenmill:prefix_cache_hits_total missing from /metrics"
    return float(m.group(1))


def references(
    hf_model, pairs: list[tuple[list[int], list[int]]]
) -> list[tuple[float, bool, float]]:
    """Per (context, continuation) ids: (loglikelihood, is_greedy, smallest top-1 margin over
    the continuation), from one right-padded transformers batch."""
    width = max(len(c) + len(x) for c, x in pairs)
    ids = torch.zeros(len(pairs), width, dtype=torch.long)
    mask = torch.zeros(len(pairs), width, dtype=torch.long)
    for i, (ctx, cont) in enumerate(pairs):
        ids[i, : len(ctx) + len(cont)] = torch.tensor(ctx + cont)
        mask[i, : len(ctx) + len(cont)] = 1
    with torch.no_grad():
        logp = torch.log_softmax(hf_model(ids, attention_mask=mask).logits.float(), dim=-1)
    out = []
    for i, (ctx, cont) in enumerate(pairs):
        rows = logp[i, len(ctx) - 1 : len(ctx) + len(cont) - 1]
        target = torch.tensor(cont)
        top2 = rows.topk(2, dim=-1).values
        out.append(
            (
                float(rows.gather(1, target[:, None]).sum()),
                bool((rows.argmax(-1) == target).all()),
                float((top2[:, 0] - top2[:, 1]).min()),
            )
        )
    return out


def test_remote_tokenizer_endpoints(compat_server):
    """lm-eval's RemoteTokenizer: /tokenizer_info, /tokenize, /detokenize, chat template."""
    from lm_eval.utils import RemoteTokenizer

    tok = RemoteTokenizer(f"{compat_server.v1}/completions", timeout=30)
    info = tok.tokenizer_info
    for key in ("eos_token", "bos_token", "pad_token", "chat_template", "model_max_length"):
        assert key in info, f"/tokenizer_info lacks {key!r}: {sorted(info)}"
    assert info["eos_token"] == "<|im_end|>"
    assert len(tok.encode(info["eos_token"])) == 1
    assert tok.eos_token_id == 2
    ids = tok.encode("The quick brown fox jumps over the lazy dog.")
    assert tok.decode(ids) == "The quick brown fox jumps over the lazy dog."
    messages = [{"role": "user", "content": "Hello there"}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True)
    served = httpx.post(
        f"{compat_server.base_url}/tokenize",
        json={"messages": messages, "add_generation_prompt": True},
        timeout=30,
    ).json()["tokens"]
    assert tok.encode(rendered) == served


@pytest.fixture(scope="module")
def two_runs(compat_server):
    """The task evaluated twice on the default server (prefix cache on): the second run's
    prompts were all computed by the first, so their blocks sit in the prefix cache (prompt
    logprobs must still be complete: such requests skip cache reads, as in vLLM)."""
    lm = make_lm(compat_server, num_concurrent=4)
    with pytest.MonkeyPatch.context() as mp:
        first = evaluate(lm, mp)
        second = evaluate(lm, mp)
    return lm, [first, second]


def test_runs_met_a_warm_prefix_cache(compat_server, two_runs):
    """The situation that used to fail (a 500 on every multiple-choice run): the runs'
    prompts are cached, as a plain request of one of them shows."""
    lm, runs = two_runs
    ctx, cont = runs[1]["samples"][TASK][0]["arguments"][0]
    context_ids, continuation_ids = lm._encode_pair(ctx, cont)
    hits_before = prefix_cache_hits(compat_server)
    body = {"model": MODEL, "prompt": context_ids + continuation_ids, "max_tokens": 1}
    r = httpx.post(f"{compat_server.v1}/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert prefix_cache_hits(compat_server) > hits_before


def test_loglikelihood_parity_with_transformers(two_runs, hf_model):
    lm, runs = two_runs
    requests = sorted(
        {tuple(a) for run in runs for s in run["samples"][TASK] for a in s["arguments"]}
    )
    pairs = [lm._encode_pair(ctx, cont) for ctx, cont in requests]  # lm-eval's own token ids
    refs = dict(zip(requests, references(hf_model, pairs), strict=True))
    worst = 0.0
    for run in runs:
        samples = run["samples"][TASK]
        assert len(samples) == 10
        ref_correct = 0
        for s in samples:
            ref_lls = []
            for (ctx, cont), (ll, greedy) in zip(s["arguments"], s["filtered_resps"], strict=True):
                ref_ll, ref_greedy, margin = refs[ctx, cont]
                worst = max(worst, abs(ll - ref_ll))
                assert abs(ll - ref_ll) <= TOL, (ctx, cont, ll, ref_ll)
                if margin > TOL:
                    assert greedy == ref_greedy, (ctx, cont)
                ref_lls.append(ref_ll)
            pred = max(range(len(ref_lls)), key=ref_lls.__getitem__)
            ref_correct += pred == s["target"]
            assert s["acc"] == float(pred == s["target"]), s["doc"]
        assert run["results"][TASK]["acc,none"] == pytest.approx(ref_correct / len(samples))
    print(f"max |lm-eval - transformers| = {worst:.2e} over {len(refs)} requests x 2 runs")


def test_bad_request_surfaces_as_http_400(compat_server):
    import requests
    from lm_eval.api.instance import Instance

    lm = make_lm(compat_server, tokenizer_backend="none")  # string prompts, no /tokenize
    bad = Instance(
        request_type="generate_until",
        doc={},
        arguments=("Hello", {"until": ["\n"], "max_gen_toks": -1}),
        idx=0,
    )
    with pytest.raises(requests.HTTPError) as err:
        lm.generate_until([bad])
    assert err.value.response.status_code == 400
    assert err.value.response.json()["error"]["type"] == "invalid_request_error"
