"""Measured machine facts: each arch's calibration, its provenance, its validation, and the ops reading it."""

import dataclasses
import importlib.resources
import json

import pytest
import torch

import tiledispatch.arch as arch
from tiledispatch import Dispatcher, Registry
from tiledispatch.arch import Calibration, Provenance
from tiledispatch.arch.calibration import FACTS
from tiledispatch.core.errors import ArchError
from tiledispatch.ops.attention import check_operands as attention_operands
from tiledispatch.ops.attention import ranking as attention_ranking
from tiledispatch.ops.conv import check_operands as conv_operands
from tiledispatch.ops.conv import ranking as conv_ranking
from tiledispatch.ops.gemm import check_operands as gemm_operands
from tiledispatch.ops.gemm import ranking as gemm_ranking

UNMEASURED = ["sm_80", "sm_86", "sm_89", "sm_100", "sm_120", "interpreter"]
# The figures the rankings use on sm_90, each as the H200 measurement (or derivation) gives it.
SM90_FIGURES = {
    "launch_s": 4e-6,
    "host_launch_s": 4.8e-6,
    "compiled_call_host_s": 100e-6,
    "eager_call_host_s": 30e-6,
    "recorded_call_host_s": 300e-6,
    "bytes_in_flight_per_sm": 36 * 1024,
    "sm_port_bytes_per_s": 70e9,
    "tma_port_bytes_per_s": 100e9,
    "clock_hz": 1.75e9,
    "issue_per_sm_cycle": 4,
    "fma_share_of_tf32": 1 / 8,
}


def test_sm90_carries_the_measured_figures_with_their_provenance():
    c = arch.load("sm_90").calibration
    assert isinstance(c, Calibration)
    assert {name: getattr(c, name) for name in FACTS} == SM90_FIGURES
    assert [name for name, _ in c.sources] == list(FACTS)
    for name in FACTS:
        source = c.provenance(name)
        assert isinstance(source, Provenance) and source.card and source.command
        assert len(source.date) == 10 and source.date.startswith("20")
    assert c.provenance("launch_s").card == "H200"  # sm_90's datasheet covers H100 and H200: say which
    assert type(c.bytes_in_flight_per_sm) is int and type(c.issue_per_sm_cycle) is int


@pytest.mark.parametrize("name", UNMEASURED)
def test_unmeasured_arches_carry_the_sm90_figures_and_say_so(name):
    c, sm90 = arch.load(name).calibration, arch.load("sm_90").calibration
    for fact in FACTS:
        assert getattr(c, fact) == getattr(sm90, fact)
        source = c.provenance(fact)
        assert source.command.startswith("unmeasured on "), (name, fact, source)
        assert source.card == sm90.provenance(fact).card


def test_unknown_fact_is_refused_by_name():
    with pytest.raises(ArchError, match="launch_seconds"):
        arch.load("sm_90").calibration.provenance("launch_seconds")


def _with_calibration(tmp_path, change):
    data = arch.load("sm_90").to_dict()
    change(data["calibration"])
    path = tmp_path / "sm_90.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "fact,change",
    [
        ("launch_s", lambda c: c.pop("launch_s")),
        ("launch_seconds", lambda c: c.update(launch_seconds=c["launch_s"])),
        ("launch_s", lambda c: c["launch_s"].update(value=0)),
        ("launch_s", lambda c: c["launch_s"].update(value=-4e-6)),
        ("launch_s", lambda c: c["launch_s"].update(value="4e-6")),
        ("clock_hz", lambda c: c["clock_hz"].update(value=float("nan"))),
        ("clock_hz", lambda c: c["clock_hz"].update(value=float("inf"))),
        ("issue_per_sm_cycle", lambda c: c["issue_per_sm_cycle"].update(value=4.5)),
        ("issue_per_sm_cycle", lambda c: c["issue_per_sm_cycle"].update(value=True)),
        ("bytes_in_flight_per_sm", lambda c: c["bytes_in_flight_per_sm"].pop("card")),
        ("bytes_in_flight_per_sm", lambda c: c["bytes_in_flight_per_sm"].update(command=" ")),
        ("sm_port_bytes_per_s", lambda c: c["sm_port_bytes_per_s"].update(date="21 Nov 2026")),
        ("tma_port_bytes_per_s", lambda c: c["tma_port_bytes_per_s"].update(note="x")),
        ("calibration", lambda c: c.clear()),
    ],
)
def test_bad_calibration_is_named(tmp_path, fact, change):
    path = _with_calibration(tmp_path, change)
    with pytest.raises(ArchError, match=fact) as e:
        arch.load_file(path)
    assert str(path) in str(e.value)


def test_calibration_is_required(tmp_path):
    data = arch.load("sm_90").to_dict()
    del data["calibration"]
    path = tmp_path / "sm_90.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ArchError, match="calibration"):
        arch.load_file(path)


def bumped(info, **figures):
    """`info` with some calibration figures replaced."""
    return dataclasses.replace(info, calibration=dataclasses.replace(info.calibration, **figures))


SM90 = arch.load("sm_90")
ONE_US = 1e-6


def _ranked(op, problem):
    return Dispatcher(Registry.from_rule_set(op, "default", SM90), SM90).ranked(problem)


def test_gemm_reads_the_launch_and_host_figures_of_its_arch():
    a = torch.empty(4096, 4096, device="meta", dtype=torch.bfloat16)
    p = gemm_operands(a, a).problem
    config = next(c.spec.config for c in _ranked("gemm", p)
                  if c.spec.family == "tiled" and c.spec.config.split_k == 1)
    slower = bumped(SM90, launch_s=SM90.calibration.launch_s + ONE_US)
    before = gemm_ranking.device_score(config, p, SM90).terms["modelled_us"]
    assert gemm_ranking.device_score(config, p, slower).terms["modelled_us"] == pytest.approx(before + 1)
    host = bumped(SM90, host_launch_s=SM90.calibration.host_launch_s + ONE_US)
    assert gemm_ranking.host_seconds(config, p, host) == pytest.approx(gemm_ranking.host_seconds(config, p, SM90)
                                                                       + ONE_US)


def test_conv_and_attention_read_the_launch_figure_of_their_arch():
    x = torch.empty(8, 64, 28, 28, device="meta", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w = torch.empty(64, 64, 3, 3, device="meta", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    conv = conv_operands("forward", x=x, w=w, padding=1).problem
    q = torch.empty(1, 8, 512, 64, device="meta", dtype=torch.bfloat16)
    attention = attention_operands(q, q, q).problem
    slower = bumped(SM90, launch_s=SM90.calibration.launch_s + ONE_US)
    for op, ranking, problem in (("conv", conv_ranking, conv), ("attention", attention_ranking, attention)):
        config = next(c.spec.config for c in _ranked(op, problem)
                      if c.spec.family in ("igemm", "fwd", "fwd-tma"))
        before = ranking.rule_score(config, problem, SM90).terms["modelled_us"]
        after = ranking.rule_score(config, problem, slower).terms["modelled_us"]
        assert after == pytest.approx(before + 1), (op, config)


def test_no_op_keeps_its_own_copy_of_a_machine_fact():
    for module, names in (
        (gemm_ranking, ("LAUNCH_SECONDS", "BYTES_IN_FLIGHT_PER_SM", "SM_PORT_BYTES_PER_S", "TMA_SM_PORT_BYTES_PER_S",
                        "HOST_LAUNCH_SECONDS", "VENDOR_CALL_SECONDS")),
        (conv_ranking, ("LAUNCH_SECONDS", "BYTES_IN_FLIGHT_PER_SM", "CLOCK_HZ", "ISSUE_PER_SM_CYCLE",
                        "FMA_FRACTION_OF_TF32")),
        (attention_ranking, ("LAUNCH_SECONDS",)),
    ):
        assert [n for n in names if hasattr(module, n)] == [], module.__name__


@pytest.mark.parametrize("name", ["sm_90", *UNMEASURED])
def test_shipped_file_is_what_to_dict_writes(name):
    """The JSON on disk holds exactly the loaded facts: no figure is read differently from how it is written."""
    shipped = json.loads((importlib.resources.files("tiledispatch.arch") / "data" / f"{name}.json").read_text())
    assert shipped == arch.load(name).to_dict()
