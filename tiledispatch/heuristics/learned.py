"""Learned selection models: one LightGBM ranker per (op, direction, dtype, arch).

A model scores each candidate kernel of a problem from the features of `heuristics.features`;
the `model` strategy (`core.ranking`) orders the candidates the rules accept by those scores
(`predict_cost`, the negated score: lower first). A ranker (LambdaRank over each problem's
candidates) rather than a regression of log time: selection asks only which kernel of one
problem is fastest, and on the H200's GEMM sweep the ranker picked better on unseen problems
(mean 0.983 of the oracle against 0.974, 4 picks below 0.98x cuBLAS against 27;
docs/selection.md). Its costs compare candidates of one problem only, not times.

A model is three files in a directory, never a pickle: `<key.name>.txt` (LightGBM's own text),
`<key.name>.features.json` (the `FeatureSpec`) and `<key.name>.manifest.json` (what it learns
from: the key, a hash of the rows, row and problem counts, the problems' ids, the GPUs,
the cross-validation scores, LightGBM's version and parameters, the date, and the SHA-256 of
the other two files, which `load` checks). Models that ship sit in
`tiledispatch/arch/models/<arch>/`, each loaded once per process however many threads ask
for it first; `train` is in `heuristics.training`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..bench.table import SelectionKey, selection_key
from ..core import jsonio
from ..core.memo import LruTable
from ..core.op import Score
from ..core.ranking import set_model_source
from .features import Featurizer, FeatureSpec, ModelFormatError

__all__ = ["Models", "ModelFormatError", "RANKING_OBJECTIVES", "ShippedModels", "TrainedModel", "clear_shipped",
           "data_hash", "load", "load_directory", "shipped", "shipped_keys", "train"]

log = logging.getLogger("tiledispatch.learned")

FORMAT = 1
MAX_MODEL_BYTES = 64 << 20  # a few hundred trees of 63 leaves take a few MB of text
MAX_JSON_BYTES = 16 << 20  # a manifest lists its problems' ids: 20 bytes each
SUFFIXES = {"model": ".txt", "features": ".features.json", "manifest": ".manifest.json"}
# LightGBM objectives whose score is higher for the better kernel, as `predict_cost` negates it.
# A regression of log time (higher: slower) would rank the slowest first.
RANKING_OBJECTIVES = ("lambdarank", "rank_xendcg")
_OBJECTIVE = re.compile(r"^objective=(\S+)", re.MULTILINE)


def files_of(directory: Path, key: SelectionKey) -> dict[str, Path]:
    """The model's three files in `directory` (or in its `<arch>/` folder, as `train --out` writes them)."""
    directory = Path(directory)
    if not (directory / f"{key.name}{SUFFIXES['manifest']}").exists() and (directory / key.arch).is_dir():
        directory = directory / key.arch
    return {part: directory / f"{key.name}{suffix}" for part, suffix in SUFFIXES.items()}


@dataclass(frozen=True, eq=False)
class TrainedModel:
    """A trained ranker with its feature spec and manifest; gives each candidate a cost."""

    key: SelectionKey
    spec: FeatureSpec
    booster: Any  # lgbm_c.CBooster, or a lightgbm.Booster (training's, or where the C library will not load alone)
    manifest: Mapping[str, Any]
    featurizer: Featurizer = field(init=False, repr=False)  # made with the model: no lazy race

    def __post_init__(self) -> None:
        object.__setattr__(self, "featurizer", Featurizer(self.spec))

    def covers(self, problem: Any) -> bool:
        """Whether the model learned from problems like `problem`: every categorical field of it
        (layouts, dtypes, epilogue) holds a value some training problem held. A value it never
        saw reads as missing, and the model would rank the candidates as for another problem;
        the rules rank such a problem instead."""
        return not self.featurizer.unknown_categories(problem)

    @property
    def label(self) -> str:
        """`sm_90/gemm_forward_bf16@<data hash>`: the slice and the rows it learned from."""
        return f"{self.key.arch}/{self.key.name}@{str(self.manifest.get('data_hash', ''))[:12]}"

    def predict_cost(self, problem: Any, configs: Sequence[Any], arch: Any,
                     scores: Sequence[Score] | None = None) -> np.ndarray:
        """The cost of each config on `problem`, in order, lower ranking first (one batched
        prediction). `scores` are the configs' rule scores where the caller has them (the
        dispatcher does)."""
        if not configs:
            return np.empty(0)
        matrix = self.featurizer.matrix(problem, configs, arch, scores)
        return -self.booster.predict(matrix, num_threads=1)

    def save(self, directory: str | os.PathLike) -> dict[str, Path]:
        """Writes the three files into `directory` (made if missing); returns their paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = {part: directory / f"{self.key.name}{suffix}" for part, suffix in SUFFIXES.items()}
        texts = {"model": self.booster.model_to_string(),
                 "features": json.dumps(self.spec.to_dict(), indent=1) + "\n"}
        manifest = {**self.manifest, "files": {paths[p].name: _sha256(t) for p, t in texts.items()}}
        texts["manifest"] = json.dumps(manifest, indent=1) + "\n"
        for part, text in texts.items():
            tmp = paths[part].with_name(f".{paths[part].name}.tmp")
            tmp.write_text(text, encoding="utf-8")  # as `load` reads it, whatever the locale
            os.replace(tmp, paths[part])
        return paths


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _read_text(path: Path, max_bytes: int) -> str:
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ModelFormatError(f"{path} has more than {max_bytes} bytes; a model file is smaller")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelFormatError(f"{path} is not UTF-8 text ({e}); write it again with `tiledispatch train`") from None


def _json(path: Path, text: str) -> Any:
    try:
        return jsonio.loads(text)
    except jsonio.JsonFileError as e:
        raise ModelFormatError(f"{path} {e}") from None


def load(directory: str | os.PathLike, key: SelectionKey) -> TrainedModel:
    """The model of `key` saved in `directory`, checked: the manifest names this key and the
    spec and model text are the ones it hashed, and the model reads the spec's columns.
    FileNotFoundError where a file is missing; ModelFormatError where one cannot be used."""
    paths = files_of(Path(directory), key)
    texts = {part: _read_text(path, MAX_MODEL_BYTES if part == "model" else MAX_JSON_BYTES)
             for part, path in paths.items()}
    manifest = _json(paths["manifest"], texts["manifest"])
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ModelFormatError(f"{paths['manifest']}: not a format-{FORMAT} model manifest; train the model "
                               "again with this tiledispatch (`tiledispatch train`)")
    if manifest.get("key") != _key_dict(key):
        raise ModelFormatError(f"{paths['manifest']}: its key {manifest.get('key')!r} is not {_key_dict(key)}")
    hashes = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    for part in ("model", "features"):
        if hashes.get(paths[part].name) != _sha256(texts[part]):
            raise ModelFormatError(f"{paths[part]} is not the file its manifest {paths['manifest'].name} was "
                                   "written with (SHA-256 differs): it was edited or replaced; train again")
    spec = FeatureSpec.from_dict(_json(paths["features"], texts["features"]), str(paths["features"]))
    if spec.op != key.op:
        raise ModelFormatError(f"{paths['features']}: a spec of op {spec.op!r}, not {key.op!r}")
    objective = _OBJECTIVE.search(texts["model"])
    if objective is None or objective[1] not in RANKING_OBJECTIVES:
        raise ModelFormatError(f"{paths['model']}: objective {objective[1] if objective else 'none'!r} is not a "
                               f"ranker's ({', '.join(RANKING_OBJECTIVES)}), whose higher score marks the faster "
                               "kernel; train the model again with this tiledispatch (`tiledispatch train`)")
    booster = _booster(texts["model"], paths["model"])
    if booster.feature_name() != spec.names:
        raise ModelFormatError(f"{paths['model']} reads {booster.num_feature()} columns that are not the "
                               f"{len(spec.columns)} of {paths['features'].name}")
    return TrainedModel(key, spec, booster, manifest)


def _booster(text: str, path: Path) -> Any:
    """The model for prediction: through LightGBM's C library alone where it loads (`lgbm_c`), since
    importing the package costs a process's first ranking hundreds of milliseconds."""
    from .lgbm_c import LightGBMLibraryError, booster_from_text

    try:
        return booster_from_text(text)
    except LightGBMLibraryError as e:
        raise ModelFormatError(f"{path} is not a LightGBM model: {e}") from None
    except Exception as e:  # the package's LightGBMError, where the library would not load alone
        if type(e).__name__ != "LightGBMError":
            raise
        raise ModelFormatError(f"{path} is not a LightGBM model: {e}") from None


def _key_dict(key: SelectionKey) -> dict[str, str]:
    return {"op": key.op, "direction": key.direction, "dtype": key.dtype, "arch": key.arch}


def load_directory(directory: str | os.PathLike) -> list[TrainedModel]:
    """Every model saved in `directory` and its `<arch>/` folders (as `tiledispatch train --out` writes);
    FileNotFoundError where `directory` is not one."""
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"no directory of models at {directory}; give the folder `tiledispatch train --out` "
                                "wrote (or one of its <arch>/ folders)")
    models = []
    for manifest in sorted(Path(directory).glob("**/*" + SUFFIXES["manifest"])):
        key = _manifest_key(manifest)
        if key is None:
            raise ModelFormatError(f"{manifest}: no key (op, direction, dtype, arch) in this manifest")
        models.append(load(manifest.parent, key))
    return models


class Models:
    """A `core.ranking.ModelSource` over given models, one per key: `Dispatcher(..., models=Models(m))`."""

    def __init__(self, models: Iterable[TrainedModel] = ()) -> None:
        self._by_key: dict[SelectionKey, TrainedModel] = {}
        for model in models:
            key = getattr(model, "key", None)
            if not isinstance(key, SelectionKey) or not callable(getattr(model, "predict_cost", None)):
                raise TypeError(f"models must be TrainedModels (learned.load, learned.train); got {model!r}")
            if key in self._by_key:
                raise ValueError(f"models: two models rank {key.name} on {key.arch}; give one per (op, direction, "
                                 "dtype, arch)")
            self._by_key[key] = model

    @classmethod
    def from_directory(cls, directory: str | os.PathLike) -> "Models":
        return cls(load_directory(directory))

    def model_for(self, problem: Any, arch: Any) -> TrainedModel | None:
        """The model of the problem's key on `arch`, where it covers the problem (`TrainedModel.covers`)."""
        return _covering(self._by_key.get(selection_key(problem, arch.name)), problem)

    def ships(self, arch: Any) -> bool:
        return any(key.arch == arch.name for key in self._by_key)


def _shipped_folder(arch: str) -> Path:
    """`tiledispatch/arch/models/<arch>/`: package data, installed as files (the wheel is unpacked)."""
    return Path(str(importlib.resources.files("tiledispatch.arch"))) / "models" / arch


# The shipped models, read once per process: the dispatcher ranks from many threads, and the
# threads that meet a slice's first problem together wait for one load (`LruTable.get_or_make`)
# rather than each parsing the model's text. Keys: ("keys", arch name) for `shipped_keys`,
# ("model", key) for `shipped` and ("usable", key) for `_usable`.
_SHIPPED = LruTable(None)


def clear_shipped() -> None:
    """Forgets the shipped models read so far (tests that ship models of their own)."""
    _SHIPPED.clear()


def shipped_keys(arch: str) -> frozenset[SelectionKey]:
    """The keys of the models that ship for `arch` (an arch name such as ``sm_90``)."""
    return _SHIPPED.get_or_make(("keys", arch), functools.partial(_shipped_keys, arch), share_errors=True)


def _shipped_keys(arch: str) -> frozenset[SelectionKey]:
    """The keys the manifests in the arch's folder name; one that cannot be read is logged and
    left out, so that the rules rank its slice rather than every dispatcher failing to start."""
    folder = _shipped_folder(arch)
    if not folder.is_dir():
        return frozenset()
    keys = set()
    for manifest in folder.glob("*" + SUFFIXES["manifest"]):
        try:
            key = _manifest_key(manifest)
        except (OSError, ModelFormatError) as e:
            log.warning("the shipped model manifest %s cannot be read (%s); ranking its slice by rules", manifest, e)
            continue
        if key is not None and key.arch == arch:
            keys.add(key)
    return frozenset(keys)


def _manifest_key(manifest: Path) -> SelectionKey | None:
    """The key a manifest names, or None where it names none."""
    data = _json(manifest, _read_text(manifest, MAX_JSON_BYTES))
    key = data.get("key") if isinstance(data, dict) else None
    if not isinstance(key, dict) or set(key) != {"op", "direction", "dtype", "arch"}:
        return None
    return SelectionKey(**{k: str(v) for k, v in key.items()})


def shipped(key: SelectionKey) -> TrainedModel | None:
    """The model that ships for `key` (in `tiledispatch/arch/models/<arch>/`), or None. Loaded once."""
    if key not in shipped_keys(key.arch):
        return None
    return _SHIPPED.get_or_make(("model", key), lambda: load(_shipped_folder(key.arch), key), share_errors=True)


class ShippedModels:
    """The models shipped with tiledispatch: the `model` strategy's default source."""

    def model_for(self, problem: Any, arch: Any) -> TrainedModel | None:
        """The shipped model of the problem's key on `arch`, where it covers the problem."""
        key = selection_key(problem, arch.name)
        return _covering(_SHIPPED.get_or_make(("usable", key), functools.partial(_usable, key)), problem)

    def ships(self, arch: Any) -> bool:
        return bool(shipped_keys(arch.name))


def _covering(model: Any, problem: Any) -> Any:
    """`model` where it covers `problem` (a model without `covers`, given by a caller, covers all)."""
    covers = getattr(model, "covers", None)
    return model if model is None or covers is None or covers(problem) else None


def _usable(key: SelectionKey) -> TrainedModel | None:
    """`shipped(key)`, or None (logged once) where it cannot be loaded here: the rules rank that
    slice, and `explain` shows no model, rather than every call of the slice failing."""
    try:
        return shipped(key)
    except ImportError as e:
        log.warning("the shipped model %s needs LightGBM, a dependency of tiledispatch (pip install lightgbm): %s; "
                    "ranking by rules", key.name, e)
    except (OSError, ModelFormatError) as e:
        log.warning("the shipped model %s/%s cannot be used (%s); ranking by rules", key.arch, key.name, e)
    return None


def data_hash(rows: Any) -> str:
    """SHA-256 of the rows a model learns from: the ok rows with a time, one per (problem id,
    kernel) with the median time, sorted, each as `id<TAB>kernel<TAB>repr(ms)`. Rows already so
    reduced (as training holds them) hash the same, so a table's rows of one key can be checked
    against a manifest."""
    times = rows["time_ms"].astype(float)
    keep = np.isfinite(times) & (times > 0)
    if "status" in rows.columns:
        keep &= rows["status"] == "ok"
    kept = rows[keep].assign(time_ms=times[keep])
    reduced = kept.groupby(["problem_id", "kernel"], sort=True)["time_ms"].median()
    digest = hashlib.sha256()
    for (pid, kernel), ms in reduced.items():
        digest.update(f"{pid}\t{kernel}\t{float(ms)!r}\n".encode())
    return digest.hexdigest()


def train(frame: Any, key: SelectionKey, *, folds: int = 5, seed: int = 0,
          params: Mapping[str, Any] | None = None, pool: tuple[str, ...] = ()) -> TrainedModel:
    """Trains the model of `key` on a results table (`heuristics.training.train`)."""
    from .training import train as train_model

    return train_model(frame, key, folds=folds, seed=seed, params=params, pool=pool)


set_model_source(ShippedModels())
