"""Deterministic scanners: each finds spans in a text, scanning from `pos` (the text before
`pos` is context for lookbehinds and word boundaries, never matched)."""

from __future__ import annotations

from tokenmill.gateway.guardrails.scanners.base import Detector, PatternScanner, Scanner

__all__ = ["Detector", "PatternScanner", "Scanner"]
