"""torch backend impls."""
