"""The GEMM problem: sizes, cost, keys, type and layout names, layouts read off tensors."""

from dataclasses import fields, replace

import pytest
import torch

from tiledispatch.core.dtypes import DType
from tiledispatch.core.errors import InvalidProblemError, UnsupportedError
from tiledispatch.ops.gemm.problem import (
    Activation,
    Align,
    Alignment,
    Epilogue,
    GemmLayout,
    GemmProblem,
    GemmTypes,
    Layout,
)

R, C, S = Layout.ROW, Layout.COL, Layout.STRIDED


# --- sizes and cost ------------------------------------------------------------------


def test_flops_by_hand():
    assert GemmProblem(m=3, n=5, k=7).flops() == 2 * 3 * 5 * 7 == 210
    assert GemmProblem(m=3, n=5, k=7, batch=4).flops() == 4 * 210


def test_bytes_fp16_plain_by_hand():
    # A: 3x7, B: 7x5, C: 3x5, all 2 bytes.
    p = GemmProblem(m=3, n=5, k=7)
    assert p.bytes() == (21 + 35 + 15) * 2 == 142
    assert GemmProblem(m=3, n=5, k=7, batch=2).bytes() == 2 * 142


def test_bytes_with_bias_and_residual_by_hand():
    # fp32 out: C is written and the residual read (2 x 15 x 4), bias once per batch set (5 x 4).
    types = GemmTypes(DType.FP16, DType.FP16, DType.FP32)
    p = GemmProblem(m=3, n=5, k=7, batch=2, types=types, epilogue=Epilogue(bias=True, residual=True))
    per_batch = 21 * 2 + 35 * 2 + 15 * 4 * 2
    assert p.bytes() == 2 * per_batch + 5 * 4 == 484


def test_bytes_fp8_inputs_are_one_byte():
    types = GemmTypes(DType.FP8E4M3, DType.FP8E5M2, DType.BF16)
    p = GemmProblem(m=4, n=8, k=16, types=types)
    assert p.bytes() == 4 * 16 * 1 + 16 * 8 * 1 + 4 * 8 * 2


@pytest.mark.parametrize("dims", [dict(m=0), dict(n=-1), dict(k=0), dict(batch=0), dict(m=True), dict(k=2.0)])
def test_bad_sizes_raise(dims):
    sizes = {**dict(m=4, n=4, k=4), **dims}
    with pytest.raises(InvalidProblemError, match=list(dims)[0].upper()):
        GemmProblem(**sizes)


def test_sizes_must_stay_below_2_31():
    with pytest.raises(InvalidProblemError, match="2\\*\\*31"):
        GemmProblem(m=2**31, n=1, k=1)
    GemmProblem(m=2**31 - 1, n=1, k=1)  # the largest that fits


# --- keys ------------------------------------------------------------------------------


def test_key_is_hashable_and_equal_for_equal_problems():
    a = GemmProblem(m=64, n=32, k=16, layout=GemmLayout.parse("rcr"), epilogue=Epilogue(True, Activation.GELU))
    b = GemmProblem(m=64, n=32, k=16, layout=GemmLayout.parse("rcr"), epilogue=Epilogue(True, Activation.GELU))
    assert a is not b
    assert a.key() == b.key() and hash(a.key()) == hash(b.key())
    memo = {a.key(): "x"}
    assert memo[b.key()] == "x"


@pytest.mark.parametrize("other", [
    dict(m=65), dict(batch=2), dict(layout=GemmLayout.parse("rrr")),
    dict(epilogue=Epilogue(True, Activation.RELU)), dict(types=GemmTypes(DType.FP16, DType.FP16, DType.FP32)),
    dict(alignment=Alignment(b=False)),
])
def test_keys_differ_when_anything_differs(other):
    base = dict(m=64, n=32, k=16, layout=GemmLayout.parse("rcr"), epilogue=Epilogue(True, Activation.GELU))
    assert GemmProblem(**base).key() != GemmProblem(**{**base, **other}).key()


def test_describe_is_json_shaped():
    p = GemmProblem(m=2, n=3, k=4, layout=GemmLayout.parse("crs"), epilogue=Epilogue(residual=True))
    d = p.describe()
    assert d["op"] == "gemm" and (d["m"], d["n"], d["k"], d["batch"]) == (2, 3, 4, 1)
    assert d["layout"] == "crs" and d["epilogue"] == "res" and d["dtype"] == "fp16" and d["flops"] == 48
    assert d["types"] == {"a": "fp16", "b": "fp16", "c": "fp16", "acc": "fp32", "allow_tf32": False}


# --- names ---------------------------------------------------------------------------


@pytest.mark.parametrize("types, name", [
    (GemmTypes(DType.FP16, DType.FP16, DType.FP16), "fp16"),
    (GemmTypes(DType.BF16, DType.BF16, DType.BF16), "bf16"),
    (GemmTypes(DType.FP32, DType.FP32, DType.FP32), "fp32"),
    (GemmTypes(DType.FP32, DType.FP32, DType.FP32, allow_tf32=True), "tf32"),
    (GemmTypes(DType.FP16, DType.FP16, DType.FP32), "fp16-fp32"),
    (GemmTypes(DType.BF16, DType.BF16, DType.FP32), "bf16-fp32"),
    (GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.BF16), "fp8e4m3-bf16"),
    (GemmTypes(DType.FP8E4M3, DType.FP8E5M2, DType.BF16), "fp8e4m3xfp8e5m2-bf16"),
    (GemmTypes(DType.FP16, DType.FP16, DType.FP16, DType.FP16), "fp16-accfp16"),
])
def test_gemm_types_names(types, name):
    assert types.name == name


@pytest.mark.parametrize("text, types", [
    ("fp16", GemmTypes(DType.FP16, DType.FP16, DType.FP16)),
    ("BF16", GemmTypes(DType.BF16, DType.BF16, DType.BF16)),
    ("tf32", GemmTypes(DType.FP32, DType.FP32, DType.FP32, allow_tf32=True)),
    ("fp8e4m3", GemmTypes(DType.FP8E4M3, DType.FP8E4M3, DType.BF16)),
    ("fp8e4m3xfp8e5m2", GemmTypes(DType.FP8E4M3, DType.FP8E5M2, DType.BF16)),
])
def test_gemm_types_parse(text, types):
    assert GemmTypes.parse(text) == types


def test_gemm_types_parse_unknown_dtype():
    with pytest.raises(UnsupportedError, match="int8"):
        GemmTypes.parse("int8")


def test_scaled_only_for_fp8():
    assert GemmTypes.parse("fp8e4m3").scaled and not GemmTypes.parse("fp16").scaled


@pytest.mark.parametrize("epilogue, name", [
    (Epilogue(), "none"),
    (Epilogue(bias=True), "bias"),
    (Epilogue(activation=Activation.RELU), "relu"),
    (Epilogue(residual=True), "res"),
    (Epilogue(True, Activation.GELU, True), "bias-gelu-res"),
    (Epilogue(False, Activation.SILU, True), "silu-res"),
])
def test_epilogue_names(epilogue, name):
    assert epilogue.name == name


def test_activation_parse():
    assert Activation.parse(None) is Activation.NONE
    assert Activation.parse("GELU") is Activation.GELU
    assert Activation.parse(Activation.SILU) is Activation.SILU
    with pytest.raises(UnsupportedError, match="tanh.*none, relu, gelu, silu"):
        Activation.parse("tanh")


# --- layouts -------------------------------------------------------------------------


def test_gemm_layout_parse_and_name():
    assert GemmLayout.parse("rcs") == GemmLayout(R, C, S)
    assert GemmLayout.parse("RCR").name == "rcr"
    assert GemmLayout().name == "rrr"


@pytest.mark.parametrize("text", ["xyz", "rc", "rcrr", "", "r c", "rrx"])
def test_gemm_layout_parse_errors(text):
    with pytest.raises(UnsupportedError, match="three letters of r/c/s"):
        GemmLayout.parse(text)


@pytest.mark.parametrize("rows, cols, row_stride, col_stride, layout", [
    (4, 3, 3, 1, R),  # contiguous row-major
    (4, 3, 8, 1, R),  # rows padded (a column slice of a wider matrix)
    (4, 3, 1, 4, C),  # column-major
    (4, 3, 1, 6, C),  # columns padded
    (4, 3, 6, 2, S),  # every other column
    (4, 3, 2, 1, R),  # overlapping rows: only the unit column stride is fixed
    (4, 3, 0, 1, R),  # broadcast rows, likewise
    (1, 3, 99, 1, R),  # one row: its stride does not matter
    (1, 3, 1, 5, C),  # one row, strided columns: column-major with a unit row stride
    (4, 1, 1, 99, R),  # one column: its stride does not matter
    (4, 1, 1, 1, R),  # a contiguous column vector is row-major too
    (1, 1, 7, 5, R),  # a single element has any strides
])
def test_layout_of(rows, cols, row_stride, col_stride, layout):
    assert Layout.of(rows, cols, row_stride, col_stride) is layout


def _layout(problem):
    return problem.layout.name


def test_from_tensors_contiguous_is_rrr():
    a, b = torch.randn(6, 4), torch.randn(4, 5)
    p = GemmProblem.from_tensors(a, b)
    assert (p.m, p.n, p.k, p.batch) == (6, 5, 4, 1) and _layout(p) == "rrr"
    assert p.types == GemmTypes(DType.FP32, DType.FP32, DType.FP32)


def test_from_tensors_transposed_operands_are_column_major():
    a = torch.randn(4, 6).t()  # 6x4, strides (1, 6)
    b = torch.randn(5, 4).t()  # 4x5, strides (1, 4)
    assert _layout(GemmProblem.from_tensors(a, b)) == "ccr"
    assert _layout(GemmProblem.from_tensors(torch.randn(6, 4), b)) == "rcr"
    assert _layout(GemmProblem.from_tensors(a, torch.randn(4, 5))) == "crr"


def test_from_tensors_sliced_operands():
    wide = torch.randn(6, 10)
    assert _layout(GemmProblem.from_tensors(wide[:, :4], torch.randn(4, 5))) == "rrr"  # padded rows
    assert _layout(GemmProblem.from_tensors(wide[:, ::2][:, :4], torch.randn(4, 5))) == "srr"  # strided columns
    b = torch.randn(5, 8).t()[::2]  # 4x5 with strides (2, 8): neither dim contiguous
    assert _layout(GemmProblem.from_tensors(torch.randn(6, 4), b)) == "rsr"


def test_from_tensors_batched_transposed():
    a = torch.randn(3, 4, 6).transpose(1, 2)  # batch of 6x4 column-major matrices
    b = torch.randn(3, 4, 5)
    p = GemmProblem.from_tensors(a, b, bias=torch.randn(5), activation="relu")
    assert (p.batch, p.m, p.n, p.k) == (3, 6, 5, 4)
    assert _layout(p) == "crr" and p.epilogue == Epilogue(True, Activation.RELU, False)


def test_from_tensors_output_layout_from_out():
    a, b = torch.randn(6, 4), torch.randn(4, 5)
    out = torch.empty(5, 6).t()  # 6x5 column-major
    p = GemmProblem.from_tensors(a, b, out=out, residual=torch.randn(6, 5))
    assert _layout(p) == "rrc" and p.epilogue.residual


def test_from_tensors_dtypes():
    a, b = torch.randn(8, 16, dtype=torch.float16), torch.randn(16, 8, dtype=torch.float16)
    assert GemmProblem.from_tensors(a, b).types.name == "fp16"
    assert GemmProblem.from_tensors(a, b, out_dtype=torch.float32).types.name == "fp16-fp32"
    a32, b32 = a.float(), b.float()
    assert GemmProblem.from_tensors(a32, b32, allow_tf32=True).types.name == "tf32"
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e5m2)
    assert GemmProblem.from_tensors(a8, b8).types.name == "fp8e4m3xfp8e5m2-bf16"


@pytest.mark.parametrize("a, b, match", [
    (torch.randn(6, 4), torch.randn(5, 5), "inner dims"),
    (torch.randn(6, 0), torch.randn(0, 5), "zero-size"),
    (torch.randn(2, 6, 4), torch.randn(3, 4, 5), "batch sizes"),
    (torch.randn(6), torch.randn(6, 5), "2-D"),
])
def test_from_tensors_mismatches_raise(a, b, match):
    with pytest.raises(InvalidProblemError, match=match):
        GemmProblem.from_tensors(a, b)


# --- alignment -----------------------------------------------------------------------


def test_alignment_default_and_tag():
    default = GemmProblem(m=1, n=1, k=1).alignment
    assert default == Alignment() and default.a and default.b and default.c  # the common case: all aligned
    assert default.tag.startswith("al-") and set(default.tag[3:]) == {"2"}  # ELEMS16 everywhere
    unaligned_a = replace(default, a=False)
    assert unaligned_a.a is Align.NONE and unaligned_a.tag[3] == "0" and set(unaligned_a.tag[4:]) == {"2"}
    assert len({replace(default, **{f.name: False}).tag for f in fields(Alignment)}) == len(fields(Alignment))
    # Each field has its own digit per level: the artifact's key tells the three apart.
    levels = {replace(default, k=level).tag for level in Align}
    assert len(levels) == 3 and Alignment(True, False).a is Align.ELEMS16 and Alignment(True, False).b is Align.NONE
    assert not Align.NONE and Align.BYTES16 and Align.ELEMS16  # truthy: 16-byte vectors are legal


@pytest.mark.parametrize("dtype, strides, level", [
    # 16 bytes: 8 halves, 4 floats, 16 fp8 elements (where 16 bytes and 16 elements agree).
    (DType.FP16, [1024, 64], Align.ELEMS16),
    (DType.BF16, [1000], Align.BYTES16),  # 2000 bytes: 16-byte vectors, but 1000 % 16 == 8
    (DType.BF16, [1000, 1004], Align.NONE),  # 2008 bytes is not a multiple of 16
    (DType.FP16, [24], Align.BYTES16),
    (DType.FP16, [4], Align.NONE),
    (DType.FP32, [4, 12], Align.BYTES16),
    (DType.FP32, [2], Align.NONE),
    (DType.FP32, [48], Align.ELEMS16),
    (DType.FP8E4M3, [16, 4096], Align.ELEMS16),
    (DType.FP8E4M3, [8], Align.NONE),
    (DType.FP8E4M3, [1000], Align.NONE),  # 1000 bytes
    (DType.FP16, [], Align.ELEMS16),  # nothing to step over
])
def test_align_levels_are_in_bytes(dtype, strides, level):
    assert Align.of(strides, dtype.itemsize) is level
    assert Align.of(strides, dtype.itemsize, base=8) is Align.NONE  # the base must be 16-byte aligned too
    assert Align.of(strides, dtype.itemsize, base=4096) is level


def test_align_divisor_is_what_holds_in_elements():
    assert [Align.BYTES16.divisor(dt.itemsize) for dt in (DType.FP8E4M3, DType.BF16, DType.FP32)] == [16, 8, 4]
    assert {Align.ELEMS16.divisor(size) for size in (1, 2, 4)} == {16}
    assert {Align.NONE.divisor(size) for size in (1, 2, 4)} == {1}


def _operand_alignment(problem):
    return (problem.alignment.a, problem.alignment.b, problem.alignment.c)


E16, B16, NONE = Align.ELEMS16, Align.BYTES16, Align.NONE


def test_from_tensors_alignment():
    a, b = torch.randn(32, 64, dtype=torch.float16), torch.randn(64, 48, dtype=torch.float16)
    assert _operand_alignment(GemmProblem.from_tensors(a, b)) == (E16, E16, E16)
    # A row stride of 65 halves (130 bytes) is not a multiple of 16 bytes.
    a_odd = torch.randn(32, 65, dtype=torch.float16)[:, :64]
    assert _operand_alignment(GemmProblem.from_tensors(a_odd, b)) == (NONE, E16, E16)
    # A row stride of 72 halves is 144 bytes: 16-byte vectors, but not 16 elements.
    a_padded = torch.randn(32, 72, dtype=torch.float16)[:, :64]
    assert _operand_alignment(GemmProblem.from_tensors(a_padded, b)) == (B16, E16, E16)
    # A base pointer 2 bytes past an aligned one.
    flat = torch.randn(64 * 48 + 1, dtype=torch.float16)
    b_shifted = flat[1:].view(64, 48)
    assert b_shifted.data_ptr() % 16 == 2
    assert _operand_alignment(GemmProblem.from_tensors(a, b_shifted)) == (E16, NONE, E16)
    # The output we allocate is contiguous: rows of 40 halves are 80 bytes.
    assert _operand_alignment(GemmProblem.from_tensors(a, b[:, :40])) == (E16, E16, B16)  # B's stride is 48
    assert _operand_alignment(GemmProblem.from_tensors(a, b[:, :36])) == (E16, E16, NONE)  # 72 bytes
    out = torch.empty(32, 50, dtype=torch.float16)[:, :48]
    assert _operand_alignment(GemmProblem.from_tensors(a, b, out=out)) == (E16, E16, NONE)
    # fp32 out from fp16 inputs: rows of 36 floats are 144 bytes.
    assert GemmProblem.from_tensors(a, b[:, :36], out_dtype=torch.float32).alignment.c is B16
    # A column-major A steps over M: a 1000-row bf16 column is 2000 bytes.
    a_col = torch.randn(64, 1000, dtype=torch.bfloat16).t()
    assert GemmProblem.from_tensors(a_col, b.bfloat16()).alignment.a is B16


def test_from_tensors_size_divisibility():
    p = GemmProblem.from_tensors(torch.randn(32, 64), torch.randn(64, 48))
    assert (p.alignment.m, p.alignment.n, p.alignment.k) == (E16, E16, E16)
    # fp32: 16 bytes are 4 elements (M=33 is not even that).
    p = GemmProblem.from_tensors(torch.randn(33, 40), torch.randn(40, 24))
    assert (p.alignment.m, p.alignment.n, p.alignment.k) == (NONE, B16, B16)
    p = GemmProblem.from_tensors(torch.randn(33, 41), torch.randn(41, 26))
    assert (p.alignment.m, p.alignment.n, p.alignment.k) == (NONE, NONE, NONE)
    # A size counts in the smallest element laid along it: N of fp16 B with fp32 C needs 8.
    a, b = torch.randn(1000, 1000, dtype=torch.float16), torch.randn(1000, 1004, dtype=torch.float16)
    p = GemmProblem.from_tensors(a, b, out_dtype=torch.float32)  # 1004 floats are 4016 bytes, 1004 halves 2008
    assert (p.alignment.m, p.alignment.n, p.alignment.k) == (B16, NONE, B16)
