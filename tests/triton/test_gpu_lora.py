"""Multi-LoRA on the GPU path (device method, Triton attention) against PEFT on the same
random weights: three adapters and the base in one batch, fp32 within 1e-4 and, on a CUDA
device, bf16 within bf16 rounding. On a CPU-only machine the device is the CPU and the
Triton kernels run under the interpreter."""

from __future__ import annotations

import pytest
import torch

from tests.lora_models import ADAPTERS, make_peft_adapters
from tests.triton.conftest import DEVICE
from tokenmill import LLM, SamplingParams

PROMPTS = [list(range(3, 30)), [5, 9, 2, 7, 11, 40], list(range(100, 117)), [8, 1, 8, 1, 8]]


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-loras")
    return make_peft_adapters(tiny_llama_dir, root)


def _peft_logprobs(base_dir, adapter_dir, ids: list[int], dtype: torch.dtype) -> torch.Tensor:
    import transformers
    from peft import PeftModel

    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir).to(DEVICE, dtype)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir).to(DEVICE, dtype)
    with torch.no_grad():
        logits = model.eval()(torch.tensor([ids], device=DEVICE)).logits[0]
    return logits.float().log_softmax(dim=-1).cpu()


@pytest.mark.parametrize(
    "weights, rel", [("float32", 0.0)] + ([("bfloat16", 0.02)] if DEVICE == "cuda" else [])
)
def test_adapters_and_the_base_in_one_batch_equal_peft(tiny_llama_dir, adapters, weights, rel):
    """fp32: every prompt logprob within 1e-4; bf16 (against PEFT in bf16): within 2% of the
    largest, bf16's rounding."""
    llm = LLM(
        str(tiny_llama_dir), device=DEVICE, attention_backend="triton", weights=weights,
        num_kv_blocks=128, max_num_batched_tokens=64, max_lora_rank=16,
        lora_modules=tuple(f"{n}={p}" for n, p in adapters.items()),
    )  # fmt: skip
    assert llm.engine.core.runner.lora.device.type == DEVICE
    names = [a[0] for a in ADAPTERS] + [None]
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, lora_name=names)
    dtype = getattr(torch, weights)
    for name, ids, out in zip(names, PROMPTS, outs, strict=True):
        ref = _peft_logprobs(tiny_llama_dir, adapters[name] if name else None, ids, dtype)
        got = [out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))]
        want = [float(ref[i - 1, ids[i]]) for i in range(1, len(ids))]
        tol = 1e-4 + rel * max(abs(w) for w in want)
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < tol, name
