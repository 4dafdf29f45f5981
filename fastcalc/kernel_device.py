"""The device context in which fastcalc launches its own Triton kernels."""

from __future__ import annotations

import contextlib

import torch


def kernel_device(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """``tensor``'s CUDA device, on which a kernel given it must launch; on the CPU (Triton's
    interpreter, as the tests run the kernels) no context."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()
