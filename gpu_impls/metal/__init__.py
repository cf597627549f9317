"""metal backend impls."""
