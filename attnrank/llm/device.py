"""Device and dtype names -> torch objects, with clear errors for what this machine lacks."""

from __future__ import annotations

import torch

from attnrank import config
from attnrank.errors import InputError

from . import quantize

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Quantized precisions: name -> the dtype the weights are loaded in before quantization
# (:mod:`attnrank.llm.quantize`).
QUANTIZED = {"int8": torch.float32}


def resolve_device(device: str) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` -> a usable :class:`torch.device`."""
    name = config.check_device_name(device)
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():  # "cuda" or "cuda:N"
        raise InputError(
            f"device={device!r} but CUDA is not available (torch {torch.__version__}); use device='cpu' or 'auto'"
        )
    idx = name.partition(":")[2] or "0"  # a digit string: check_device_name
    if int(idx) >= torch.cuda.device_count():
        raise InputError(f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s) (cuda:0..)")
    return torch.device(f"cuda:{idx}")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Map a dtype name to a torch dtype usable on ``device`` (a quantized name: the dtype its
    weights are loaded in before quantization). ``"auto"``: on a CPU,
    :func:`attnrank.config.cpu_auto_dtype` (bfloat16 with AMX or AVX-512 BF16, else float32); on CUDA bfloat16
    where supported, else float16."""
    name = config.check_dtype_name(dtype)
    if name == "auto":
        if device.type != "cuda":
            try:
                return DTYPES[config.cpu_auto_dtype()]
            except ValueError as e:
                raise InputError(str(e)) from e
        with torch.cuda.device(device):
            # native bfloat16 only: on a pre-Ampere GPU torch reports an emulated one as supported, and it is slow
            return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    if name in QUANTIZED:
        if device.type != "cpu":
            raise InputError(
                f"dtype={dtype!r} (dynamic int8 linear layers) runs on CPU only, not on {device}; "
                "use device='cpu', or dtype='bfloat16'/'float16' on a GPU"
            )
        quantize.check_int8()  # (before the weights load: on a CPU without an engine it failed after them)
        return QUANTIZED[name]
    if name == "float16" and device.type == "cpu":
        raise InputError(config.FLOAT16_ON_CPU)
    return DTYPES[name]


def dtype_name(dtype: str, device: torch.device) -> str:
    """The canonical precision name for ``dtype`` on ``device``: a key of :data:`DTYPES` or
    :data:`QUANTIZED` (``"auto"`` resolved), checked as :func:`resolve_dtype` does."""
    torch_dtype = resolve_dtype(dtype, device)
    name = (dtype or "").strip().lower()
    return name if name in QUANTIZED else next(k for k, v in DTYPES.items() if v == torch_dtype)
