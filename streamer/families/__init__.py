"""How each checkpoint family maps onto mlx-lm's model: which model types stream, how their
experts are named and stored, config.json checked and read as mlx-lm reads it, and transformers 5's
spellings (transformers/) read as the published checkpoints mean them."""
