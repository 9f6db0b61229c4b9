"""A folder becomes a streaming model: `load` (load.py) decides its options once (options.py),
opens the folder as a Source (source.py): a repacked folder (repacked_source.py) or an MLX
download read where it lies (download_source.py; download_folder.py finds its experts,
download_tensors.py each layer's tensors), then assembles either in one order: the resident
weights, the residency plan (residency.py) applied (assembly.py, pools.py), the handle on the
returned model (handle.py); the tokenizer, the backend's defaults and model names (hub.py)."""
