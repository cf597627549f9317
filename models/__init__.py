"""Model-level gate (issue 28): a real model's decode loop assembled from kparity's registered
ops, judged on its logits against the float64 reference and timed in tokens/s."""
