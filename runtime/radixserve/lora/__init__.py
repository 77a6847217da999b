"""LoRA adapters served beside the model: PEFT adapters read and checked (`adapter.py`), their
device slots (`pool.py`) and which adapters fill them (`manager.py`). The layers' side, each
token's update by its adapter, is `layers/lora.py`; the kernels `radixserve_kernels.lora`."""
