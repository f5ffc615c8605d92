"""How constrained JSON may be laid out: whitespace allowed between tokens but bounded, so a
small model cannot spin on whitespace forever (llguidance's default allows any amount)."""

JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,16}"}
