"""A shipped model's predictions through LightGBM's C library, without importing its Python package.

`import lightgbm` imports scipy, pandas and scikit-learn where they are installed: 350 ms on the
CPU machine, which a process would pay on its first call of an op whose slice ships a model,
against an instant-start budget of 50 ms. The library itself (`lib_lightgbm`, inside the
package's folder) loads in a few milliseconds, and its C API (`c_api.h`: load a model from its
text, name its features, predict for a dense matrix) is all that ranking needs. The package's
`Booster.predict` makes the same call, so the predictions are the same numbers.

A ranking predicts a shortlist of a few dozen rows at most. `LGBM_BoosterPredictForMat` parses
its parameters and makes a predictor on every call (17 us of a 16-row call's 200 on the CPU
machine), so such a matrix goes row by row through the single-row fast path instead
(`LGBM_BoosterPredictForMatSingleRowFast`: its configuration and predictor are made once per
model), whose numbers are the same: both run the predictor's one function on each row.

`booster_from_text` gives a `CBooster`, or a `lightgbm.Booster` where the library cannot be
found or loaded on its own (an unusual install): slower to start, the same results.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

_FLOAT64 = 1  # C_API_DTYPE_FLOAT64
_PREDICT_NORMAL = 0  # C_API_PREDICT_NORMAL: the raw score of a ranker
_NAME_BYTES = 256
# Matrices of at most this many rows are predicted row by row (`CBooster.predict`): a ranking's
# shortlist. A larger one (evaluation's, training's) is one call, whose fixed cost is then small.
FAST_ROWS = 64
_LIB: Any = None
_LIB_LOCK = threading.Lock()


class LightGBMLibraryError(RuntimeError):
    """LightGBM's C library refused a call; the message is its own."""


def _library_path() -> Path | None:
    """lib_lightgbm inside the installed package's folder, found without importing the package."""
    spec = importlib.util.find_spec("lightgbm")
    if spec is None or not spec.submodule_search_locations:
        return None
    name = {"win32": "lib_lightgbm.dll", "darwin": "lib_lightgbm.dylib"}.get(sys.platform, "lib_lightgbm.so")
    for folder in spec.submodule_search_locations:
        for candidate in (Path(folder) / "lib" / name, Path(folder) / name):
            if candidate.is_file():
                return candidate
    return None


def library() -> Any:
    """The loaded C library with the signatures used here, or None where it cannot be loaded alone."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            path = _library_path()
            try:
                lib = ctypes.cdll.LoadLibrary(str(path)) if path is not None else False
            except OSError:
                lib = False
            if lib:
                lib.LGBM_GetLastError.restype = ctypes.c_char_p
                lib.LGBM_BoosterPredictForMatSingleRowFast.argtypes = [
                    ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p]
            _LIB = lib
        return _LIB or None


def _check(lib: Any, status: int) -> None:
    if status != 0:
        raise LightGBMLibraryError(lib.LGBM_GetLastError().decode(errors="replace"))


class CBooster:
    """A LightGBM model loaded from its text by the C library: `predict`, `feature_name`,
    `num_feature` and `model_to_string` as `lightgbm.Booster` has them."""

    def __init__(self, lib: Any, text: str) -> None:
        self._lib, self._text = lib, text
        self._handle = ctypes.c_void_p()
        iterations = ctypes.c_int()
        _check(lib, lib.LGBM_BoosterLoadModelFromString(ctypes.c_char_p(text.encode()), ctypes.byref(iterations),
                                                        ctypes.byref(self._handle)))
        count = ctypes.c_int()
        _check(lib, lib.LGBM_BoosterGetNumFeature(self._handle, ctypes.byref(count)))
        self._names = self._feature_names(count.value)
        self._fast = ctypes.c_void_p()  # the single-row path's configuration, made on first use
        self._fast_lock = threading.Lock()

    def _feature_names(self, count: int) -> list[str]:
        buffers = [ctypes.create_string_buffer(_NAME_BYTES) for _ in range(count)]
        pointers = (ctypes.c_char_p * count)(*map(ctypes.addressof, buffers))
        got, needed = ctypes.c_int(), ctypes.c_size_t()
        _check(self._lib, self._lib.LGBM_BoosterGetFeatureNames(
            self._handle, ctypes.c_int(count), ctypes.byref(got), ctypes.c_size_t(_NAME_BYTES),
            ctypes.byref(needed), pointers))
        if needed.value > _NAME_BYTES:
            raise LightGBMLibraryError(f"a feature name of {needed.value} bytes is longer than {_NAME_BYTES}")
        return [b.value.decode() for b in buffers[:got.value]]

    def feature_name(self) -> list[str]:
        return list(self._names)

    def num_feature(self) -> int:
        return len(self._names)

    def model_to_string(self) -> str:
        return self._text

    def predict(self, matrix: np.ndarray, num_threads: int = 1) -> np.ndarray:
        """The raw score of each row of a dense float matrix, every tree counted: row by row where
        it is a ranking's few rows on one thread (see the module's docstring), else in one call."""
        data = np.ascontiguousarray(matrix, dtype=np.float64)
        if data.ndim != 2 or data.shape[1] != len(self._names):
            raise ValueError(f"a model of {len(self._names)} features predicts for a (rows, {len(self._names)}) "
                             f"matrix, not {data.shape}")
        out = np.empty(data.shape[0], dtype=np.float64)
        if num_threads == 1 and data.shape[0] <= FAST_ROWS:
            self._predict_rows(data, out)
            return out
        written = ctypes.c_int64()
        _check(self._lib, self._lib.LGBM_BoosterPredictForMat(
            self._handle, data.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(_FLOAT64), ctypes.c_int32(data.shape[0]),
            ctypes.c_int32(data.shape[1]), ctypes.c_int(1), ctypes.c_int(_PREDICT_NORMAL), ctypes.c_int(0),
            ctypes.c_int(-1), ctypes.c_char_p(f"num_threads={num_threads}".encode()), ctypes.byref(written),
            out.ctypes.data_as(ctypes.POINTER(ctypes.c_double))))
        if written.value != data.shape[0]:
            raise LightGBMLibraryError(f"{written.value} predictions for {data.shape[0]} rows")
        return out

    def _predict_rows(self, data: np.ndarray, out: np.ndarray) -> None:
        """`data`'s rows into `out`, one fast single-row call each (the library serialises the calls
        of one model, so threads may share it)."""
        lib, fast = self._lib, self._fast_config()
        predict, written = lib.LGBM_BoosterPredictForMatSingleRowFast, ctypes.c_int64()
        row, stride, result = data.ctypes.data, data.strides[0], out.ctypes.data
        for i in range(data.shape[0]):
            _check(lib, predict(fast, row + i * stride, ctypes.byref(written), result + 8 * i))
            if written.value != 1:
                raise LightGBMLibraryError(f"{written.value} predictions for one row")

    def _fast_config(self) -> ctypes.c_void_p:
        if not self._fast:
            with self._fast_lock:
                if not self._fast:
                    fast = ctypes.c_void_p()
                    _check(self._lib, self._lib.LGBM_BoosterPredictForMatSingleRowFastInit(
                        self._handle, ctypes.c_int(_PREDICT_NORMAL), ctypes.c_int(0), ctypes.c_int(-1),
                        ctypes.c_int(_FLOAT64), ctypes.c_int32(len(self._names)), ctypes.c_char_p(b"num_threads=1"),
                        ctypes.byref(fast)))
                    self._fast = fast
        return self._fast

    def __del__(self) -> None:
        fast, self._fast = getattr(self, "_fast", None), None
        if fast:
            self._lib.LGBM_FastConfigFree(fast)
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.LGBM_BoosterFree(handle)


def booster_from_text(text: str) -> Any:
    """A model from LightGBM's text: a CBooster, or the package's Booster where the library will
    not load alone. LightGBMLibraryError (or the package's LightGBMError) where the text is no model."""
    lib = library()
    if lib is not None:
        return CBooster(lib, text)
    import lightgbm

    return lightgbm.Booster(model_str=text)
