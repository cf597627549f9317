"""mlx backend impls."""
