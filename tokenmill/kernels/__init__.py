"""Native CPU kernels (optional; everything has a pure-torch fallback)."""
