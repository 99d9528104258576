"""Architecture facts: shipped data, name parsing, validation, detection and the env override."""

import dataclasses
import importlib.resources
import json
import pickle
from types import SimpleNamespace

import pytest
import torch

import tiledispatch.arch as arch
from tiledispatch.arch import ArchInfo, Feature
from tiledispatch.core.dtypes import DType
from tiledispatch.core.errors import ArchError, UnsupportedError

GPUS = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]
FP8 = {DType.FP8E4M3, DType.FP8E5M2}
MiB = 1 << 20


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("TILEDISPATCH_ARCH", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return monkeypatch


def fake_cuda(monkeypatch, capability, **props):
    """Pretend torch sees one CUDA device with this capability and these properties."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(**props))


H200 = dict(
    name="NVIDIA H200",
    multi_processor_count=132,
    shared_memory_per_block_optin=232448,
    shared_memory_per_multiprocessor=233472,
    L2_cache_size=60 * MiB,
    regs_per_multiprocessor=65536,
    max_threads_per_multi_processor=2048,
)


def test_available_matches_shipped_files_in_order():
    assert arch.available() == GPUS + ["interpreter"]
    data = importlib.resources.files("tiledispatch.arch") / "data"
    assert sorted(p.name for p in data.iterdir() if p.name.endswith(".json")) == sorted(
        f"{n}.json" for n in arch.available()
    )


@pytest.mark.parametrize("name", GPUS + ["interpreter"])
def test_every_file_loads_and_is_consistent(name):
    info = arch.load(name)
    assert isinstance(info, ArchInfo) and info.name == name
    assert set(info.peak_tflops) == info.tensor_core_dtypes
    assert info.warp_size == 32 and info.registers_per_sm == 65536 and info.registers_per_thread_max == 255
    assert info.shared_memory_per_block_optin < info.shared_memory_per_sm
    if not info.is_interpreter:  # the interpreter emulates fp8 dots but has no features
        assert info.has(Feature.FP8) == (FP8 <= info.tensor_core_dtypes)
    # the shipped file is exactly what to_dict writes back, and it round-trips
    assert arch._from_dict(info.to_dict(), "x") == info
    assert pickle.loads(pickle.dumps(info)) == info
    hash(info)


def test_representative_numbers():
    h = arch.load("sm_90")
    assert h.compute_capability == (9, 0) and h.sm == 90 and h.tag == "sm90"
    assert (h.sm_count, h.l2_bytes, h.shared_memory_per_block_optin) == (132, 50 * MiB, 232448)
    assert h.peak_tflops[DType.BF16] == 989 and h.peak_tflops[DType.FP32] == 494
    assert h.peak_tflops[DType.FP8E4M3] == 1979 and h.memory_bandwidth_gbs == 4800
    a = arch.load("sm_80")
    assert (a.sm_count, a.l2_bytes, a.max_blocks_per_sm) == (108, 40 * MiB, 32)
    assert a.peak_tflops[DType.FP16] == 312 and a.peak_tflops[DType.FP32] == 156
    assert arch.load("sm_86").max_threads_per_sm == 1536 and arch.load("sm_86").max_blocks_per_sm == 16
    assert arch.load("sm_120").sm_count == 170 and arch.load("sm_100").tag == "sm100"


def test_fp8_only_from_sm89():
    for name in GPUS:
        info = arch.load(name)
        expected = info.sm >= 89
        assert info.supports_dtype(DType.FP8E4M3) is expected
        assert info.supports_dtype("fp8e5m2") is expected
        assert info.has("fp8") is expected
        assert {DType.FP16, DType.BF16, DType.FP32} <= info.tensor_core_dtypes
        assert not info.supports_dtype(DType.FP64)


def test_tma_wgmma_tcgen05_by_arch():
    tma = {n for n in GPUS if arch.load(n).has(Feature.TMA)}
    wgmma = {n for n in GPUS if arch.load(n).has(Feature.WGMMA)}
    tcgen05 = {n for n in GPUS if arch.load(n).has(Feature.TCGEN05)}
    cluster = {n for n in GPUS if arch.load(n).has(Feature.CLUSTER)}
    assert tma == cluster == {"sm_90", "sm_100", "sm_120"}
    assert wgmma == {"sm_90"} and tcgen05 == {"sm_100"}
    assert all(arch.load(n).has(Feature.ASYNC_COPY) for n in GPUS)


def test_interpreter_is_h100_like_without_bf16_and_with_tma_only():
    i, h = arch.load("interpreter"), arch.load("sm_90")
    assert i.is_interpreter and i.sm is None and i.tag == "interp" and i.compute_capability is None
    assert not h.is_interpreter
    limits = ("sm_count", "shared_memory_per_block_optin", "shared_memory_per_sm", "l2_bytes", "max_threads_per_sm")
    assert [getattr(i, f) for f in limits] == [getattr(h, f) for f in limits]
    assert i.tensor_core_dtypes == {DType.FP16, DType.FP32} | FP8
    # It executes tensor descriptors (so the TMA family is tested on the CPU), nothing else of Hopper.
    assert not i.supports_dtype("bf16") and i.features == frozenset({arch.Feature.TMA})


@pytest.mark.parametrize(
    "alias,name",
    [
        ("sm_90", "sm_90"), ("sm90", "sm_90"), ("90", "sm_90"), ("9.0", "sm_90"), ("SM_90", "sm_90"),
        (" sm_86 ", "sm_86"), ("8.9", "sm_89"), ("sm100", "sm_100"), ("10.0", "sm_100"), ("120", "sm_120"),
        ("interpreter", "interpreter"), ("interp", "interpreter"), ("Interpreter", "interpreter"),
    ],
)
def test_aliases(alias, name):
    assert arch.load(alias) is arch.load(name)
    assert arch.load(arch.load(name).tag) is arch.load(name)  # tags parse back


@pytest.mark.parametrize("bad", ["sm_75", "7.5", "hopper", "sm_9", "", "sm_90x"])
def test_unknown_name_lists_known(bad):
    with pytest.raises(ArchError) as e:
        arch.load(bad)
    assert repr(bad) in str(e.value)
    for name in arch.available():
        assert name in str(e.value)


def write(tmp_path, data, name="sm_90.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_load_file_reads_a_valid_file(tmp_path):
    data = arch.load("sm_90").to_dict() | {"sm_count": 114}
    info = arch.load_file(write(tmp_path, data))
    assert info.sm_count == 114 and info.has(Feature.WGMMA)


def test_missing_field_names_file_and_field(tmp_path):
    data = arch.load("sm_90").to_dict()
    del data["l2_bytes"]
    path = write(tmp_path, data)
    with pytest.raises(ArchError, match="l2_bytes") as e:
        arch.load_file(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize(
    "field,value",
    [
        ("sm_count", 0),
        ("sm_count", "132"),
        ("warp_size", True),
        ("compute_capability", [9]),
        ("compute_capability", None),  # null only for the interpreter
        ("tensor_core_dtypes", ["fp16", "int4"]),
        ("features", ["tma", "warp_specialize"]),
        ("peak_tflops", {"fp16": 989}),  # must cover every tensor-core dtype
        ("peak_tflops", {"fp16": 1, "bf16": 1, "fp32": 1, "fp8e4m3": 1, "fp8e5m2": -1}),
        ("memory_bandwidth_gbs", None),
        ("description", ""),
        ("typo_field", 1),
    ],
)
def test_bad_field_is_named(tmp_path, field, value):
    path = write(tmp_path, arch.load("sm_90").to_dict() | {field: value})
    with pytest.raises(ArchError, match=field) as e:
        arch.load_file(path)
    assert str(path) in str(e.value)


def test_unreadable_file(tmp_path):
    with pytest.raises(ArchError, match="nope.json"):
        arch.load_file(tmp_path / "nope.json")
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ArchError, match="broken.json"):
        arch.load_file(path)


def test_env_override(clean_env):
    clean_env.setenv("TILEDISPATCH_ARCH", "sm80")
    assert arch.current() is arch.load("sm_80")
    clean_env.setenv("TILEDISPATCH_ARCH", "9.0")
    assert arch.current().name == "sm_90"  # not cached across env changes
    clean_env.setenv("TRITON_INTERPRET", "1")
    assert arch.current().name == "sm_90"  # the explicit arch wins over the interpreter
    clean_env.setenv("TILEDISPATCH_ARCH", "sm_75")
    with pytest.raises(ArchError, match="sm_75"):
        arch.current()


def test_no_cuda_means_interpreter(clean_env):
    assert not torch.cuda.is_available()
    assert arch.current().is_interpreter
    with pytest.raises(ArchError, match="no CUDA device"):
        arch.detect()


def test_triton_interpret_wins_over_a_gpu(clean_env):
    fake_cuda(clean_env, (9, 0), **H200)
    assert arch.current().name == "sm_90"
    clean_env.setenv("TRITON_INTERPRET", "1")
    assert arch.current().is_interpreter


def test_detect_takes_device_values(clean_env):
    fake_cuda(clean_env, (9, 0), **H200)
    info = arch.detect()
    assert info.name == "sm_90" and info.sm_count == 132 and info.l2_bytes == 60 * MiB
    assert "H200" in info.description
    assert arch.load("sm_90").l2_bytes == 50 * MiB  # the cached JSON facts are untouched
    assert arch.current() == info


def test_detect_prefers_device_and_falls_back_to_json(clean_env):
    fake_cuda(clean_env, (9, 0), multi_processor_count=114, L2_cache_size=None)  # e.g. an H100 PCIe
    info = arch.detect(0)
    json_facts = arch.load("sm_90")
    assert info.sm_count == 114 and info.l2_bytes == json_facts.l2_bytes
    assert info.shared_memory_per_block_optin == json_facts.shared_memory_per_block_optin
    assert dataclasses.replace(info, sm_count=132, description=json_facts.description) == json_facts


@pytest.mark.parametrize(
    "capability,name",
    [((8, 0), "sm_80"), ((8, 7), "sm_86"), ((8, 9), "sm_89"), ((9, 0), "sm_90"),
     ((10, 0), "sm_100"), ((10, 3), "sm_100"), ((12, 0), "sm_120"), ((12, 1), "sm_120")],
)
def test_detect_maps_capability_to_nearest_known(clean_env, capability, name):
    fake_cuda(clean_env, capability)
    assert arch.detect().name == name


@pytest.mark.parametrize("capability", [(7, 5), (11, 0), (13, 0)])
def test_detect_unknown_capability(clean_env, capability):
    fake_cuda(clean_env, capability)
    with pytest.raises(ArchError, match=f"{capability[0]}.{capability[1]}"):
        arch.detect()


def test_triton_target():
    target = arch.load("sm_90").triton_target()
    assert (target.backend, target.arch, target.warp_size) == ("cuda", 90, 32)
    assert arch.load("sm_120").triton_target().arch == 120
    with pytest.raises(ArchError, match="interpreter"):
        arch.load("interpreter").triton_target()


def test_unknown_feature_and_dtype():
    with pytest.raises(ArchError, match="tma"):
        arch.load("sm_90").has("warp_specialize")
    with pytest.raises(UnsupportedError, match="int4"):
        arch.load("sm_90").supports_dtype("int4")


def test_archinfo_is_immutable():
    info = arch.load("sm_90")
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.sm_count = 1
    with pytest.raises(TypeError):
        info.peak_tflops[DType.FP16] = 1.0
