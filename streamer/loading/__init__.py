"""A folder becomes a streaming model: `load` (load.py) for a repacked folder, load_in_place.py for
an MLX download read where it lies (download_folder.py finds its experts, download_tensors.py each
layer's tensors), and what both share: resident weights and budgets (assembly.py), the handle on
the returned model (handle.py), the tokenizer, the backend's defaults and model names (hub.py)."""
