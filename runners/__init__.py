"""kparity runners: correctness, timing, A/B, process isolation, the oracle cache."""
