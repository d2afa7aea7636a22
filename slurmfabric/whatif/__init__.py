"""The what-if model of a training step on a fabric."""
