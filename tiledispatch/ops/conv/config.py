"""Every conv config type, and their union. Each is defined by its family's module (``families/``);
what they share (the signature, the family name, the split) is in signature.py."""

from __future__ import annotations

from .families.direct import DirectConfig
from .families.igemm_tma import TmaConfig
from .families.implicit_gemm import ImplicitGemmConfig
from .families.pointwise import PointwiseConfig
from .families.toeplitz import ToeplitzConfig
from .families.vendor import VendorConfig
from .signature import ConvSignature, Family, SplitMode, SplitReduction

AnyConvConfig = ImplicitGemmConfig | TmaConfig | DirectConfig | ToeplitzConfig | PointwiseConfig | VendorConfig

__all__ = ["AnyConvConfig", "ConvSignature", "DirectConfig", "Family", "ImplicitGemmConfig", "PointwiseConfig",
           "SplitMode", "SplitReduction", "TmaConfig", "ToeplitzConfig", "VendorConfig"]
