"""Incremental detokenization with stop strings that may span tokens."""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from tokenmill.model.tokenizer import Tokenizer
from tokenmill.sampling_params import SamplingParams

# Prompt tokens fed to the decoder first, so the first output token decodes in context
# (e.g. SentencePiece's leading-space handling).
_PROMPT_CONTEXT = 4


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.stream = DecodeStream(prompt_token_ids[-_PROMPT_CONTEXT:], params.skip_special_tokens)
        self.output_text = ""
        self._stop_len = max((len(s) for s in params.stop), default=0)  # type: ignore[union-attr]
        self._sent = 0  # characters already returned by get_delta()
        self.tokens_kept = 0  # of the last update's tokens (all but those after a stop string)

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Decode new tokens; returns the stop string if one appeared (text is cut there, and
        `tokens_kept` says how many of the new tokens came up to it: several arrive at once
        under speculative decoding, and those after the stop are not part of the output).

        A final stop token (EOS or a stop_token_id) is not rendered into the text.
        """
        self.tokens_kept = len(new_token_ids)
        if stop_terminated:
            new_token_ids = new_token_ids[:-1]
        for i, token in enumerate(new_token_ids):
            before = len(self.output_text)
            piece = self.stream.step(self.tokenizer.hf, token)
            if piece:
                self.output_text += piece
                if self._stop_len:
                    stop = self._find_stop(before)
                    if stop is not None:
                        self.tokens_kept = i + 1
                        return stop
        return None

    def _find_stop(self, new_from: int) -> str | None:
        text = self.output_text
        search_from = max(0, new_from - self._stop_len + 1)
        best: tuple[int, str] | None = None
        for stop in self.params.stop:  # type: ignore[union-attr]
            idx = text.find(stop, search_from)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return None
        idx, stop = best
        self.output_text = (
            text[: idx + len(stop)] if self.params.include_stop_str_in_output else text[:idx]
        )
        return stop

    def get_delta(self, finished: bool) -> str:
        """New text since the last call. While running, the tail that could still become a stop
        string is held back."""
        end = len(self.output_text)
        if not finished and self._stop_len and not self.params.include_stop_str_in_output:
            end = max(self._sent, end - (self._stop_len - 1))
        delta = self.output_text[self._sent : end]
        self._sent = end
        return delta
