"""cuda backend impls."""
