from __future__ import annotations

from tests.tiny_models import embedded_tokenizer
from tokenmill.engine.detokenizer import IncrementalDetokenizer
from tokenmill.sampling_params import SamplingParams

TEXT = "Größe: 日本語 🎉🎉 naïve — done. The END marker ### follows here."


def feed_one_by_one(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[list[str], str | None]:
    deltas = []
    for t in ids:
        stop = detok.update([t], stop_terminated=False)
        deltas.append(detok.get_delta(finished=stop is not None))
        if stop is not None:
            return deltas, stop
    deltas.append(detok.get_delta(finished=True))
    return deltas, None


def test_multibyte_characters_split_across_tokens():
    tok = embedded_tokenizer()
    ids = tok.encode(TEXT)
    pieces = [tok.decode([t]) for t in ids]
    assert any("\ufffd" in p for p in pieces), (
        "the text must contain characters split across tokens"
    )
    detok = IncrementalDetokenizer(tok, tok.encode("Hi"), SamplingParams())
    deltas, stop = feed_one_by_one(detok, ids)
    assert stop is None
    assert "".join(deltas) == TEXT == detok.output_text
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_spanning_tokens_is_cut():
    tok = embedded_tokenizer()
    ids = tok.encode(TEXT)
    detok = IncrementalDetokenizer(tok, [], SamplingParams(stop=["END mark", "zzz"]))
    deltas, stop = feed_one_by_one(detok, ids)
    assert stop == "END mark"
    assert detok.output_text == "Größe: 日本語 🎉🎉 naïve — done. The "
    assert "".join(deltas) == detok.output_text, "streamed deltas never leak a stop-string prefix"


def test_stop_string_included_when_asked():
    tok = embedded_tokenizer()
    detok = IncrementalDetokenizer(
        tok, [], SamplingParams(stop=["###"], include_stop_str_in_output=True)
    )
    _, stop = feed_one_by_one(detok, tok.encode(TEXT))
    assert stop == "###" and detok.output_text.endswith("marker ###")


def test_earliest_stop_string_wins():
    tok = embedded_tokenizer()
    detok = IncrementalDetokenizer(tok, [], SamplingParams(stop=["follows", "done"]))
    detok.update(tok.encode(TEXT), stop_terminated=False)
    assert detok.output_text == "Größe: 日本語 🎉🎉 naïve — "


def test_final_stop_token_not_rendered():
    tok = embedded_tokenizer()
    ids = tok.encode("Hello there") + [tok.encode("<|im_end|>", add_special_tokens=False)[0]]
    detok = IncrementalDetokenizer(tok, [], SamplingParams(skip_special_tokens=False))
    detok.update(ids, stop_terminated=True)
    assert detok.output_text == "Hello there"
