"""config.json and tensor names as transformers 5 writes them, read as mlx-lm's models expect."""
