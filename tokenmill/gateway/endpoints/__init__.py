"""What the gateway knows of each generation endpoint's JSON: where the user's text is, how a
fallback answer looks, where usage is, and how to rewrite the output (whole or streamed)."""
