"""Weight quantization and its fidelity: formats made at load (formats.py), which layer groups
get which format (groups.py, plan.py), calibration (calibration.py), KL divergence against a
float reference (kld.py), the `tokenmill quant eval|search` tools and the serving gate."""
