#!/usr/bin/python3
"""Generates the tensor layer's golden files from real PyTorch.

    /usr/bin/python3 scripts/gen_tensor_golden.py      # needs torch (1.13 on this project's CI box)

writes

    tests/golden/tensor_repr.txt     repr(t) for ~400 tensors: every dtype, every printing rule
    tests/golden/tensor_convert.txt  src.to(dtype) for all 100 dtype pairs, bit-exact

The C++ tests (tests/tensor/test_golden_*.cpp) read these files; torch is not needed at test time.
Re-run this script only to extend the cases; the output is deterministic (fixed seeds).

File format (line based, '#' lines are comments):

    case <name>
    dtype <dtype>                 repr file: the tensor's dtype, e.g. float16
    shape <size> <size> ...       no sizes for a 0-d tensor
    from <dtype> / to <dtype>     convert file: source and destination dtypes
    count <n>                     convert file: number of elements
    data <hex>                    raw little-endian element bytes; several lines concatenate
    expect <hex>                  convert file: the converted bytes; several lines concatenate
    repr <n>                      repr file: followed by n lines, each '|' + one line of repr(t)
    end
"""

import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN_DIR = os.path.join(HERE, "..", "tests", "golden")

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
U8, I8, I16, I32, I64 = torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64
BOOL = torch.bool
ALL_DTYPES = [BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64]
FLOAT_DTYPES = [F16, BF16, F32, F64]
INT_DTYPES = [U8, I8, I16, I32, I64]

NAN, INF = float("nan"), float("inf")
HEX_PER_LINE = 128


def short(dtype):
    return str(dtype).replace("torch.", "")


def raw_bytes(t):
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def hex_lines(key, data):
    text = data.hex()
    if not text:
        return [key]
    return [key + " " + text[i:i + HEX_PER_LINE] for i in range(0, len(text), HEX_PER_LINE)]


def bits_tensor(bit_patterns, dtype):
    """A tensor of `dtype` holding exactly these bit patterns (for NaN payloads, -nan, ...)."""
    int_type = {F16: I16, BF16: I16, F32: I32, F64: I64}[dtype]
    width = {I16: 16, I32: 32, I64: 64}[int_type]
    signed = [b - (1 << width) if b >= (1 << (width - 1)) else b for b in bit_patterns]
    return torch.tensor(signed, dtype=int_type).view(dtype)


# --------------------------------------------------------------------------------------------
# repr cases
# --------------------------------------------------------------------------------------------

class ReprCases:
    def __init__(self):
        self.cases = []
        self.names = set()

    def add(self, name, t):
        assert name not in self.names, name
        self.names.add(name)
        self.cases.append((name, t))

    def lines(self):
        out = []
        for name, t in self.cases:
            text = repr(t)
            out.append("case " + name)
            out.append("dtype " + short(t.dtype))
            out.append(("shape " + " ".join(str(s) for s in t.shape)).rstrip())
            out.extend(hex_lines("data", raw_bytes(t)))
            rows = text.split("\n")
            out.append("repr %d" % len(rows))
            out.extend("|" + row for row in rows)
            out.append("end")
        return out


def add_reference_examples(c):
    """torch_semantics.md section 7, examples 1-57, in order."""
    T = torch.tensor
    c.add("ex01_int64", T([10, 20, 30, 40]))
    c.add("ex02_int_mode", T([7., 8., 9.]))
    c.add("ex03_fixed", T([1.5, 2.25, 3.0]))
    c.add("ex04_fixed_small", T([0.1, 0.2]))
    c.add("ex05_round", T([1.12345]))
    c.add("ex06_int_pad", T([-5, 100, 7]))
    c.add("ex07_fixed_neg", T([-1.5, 2.0]))
    c.add("ex08_int_mode_neg", T([-1., 2.]))
    c.add("ex09_fixed_pad", T([123.456, 0.5]))
    c.add("ex10_float32_value", T([12345.6789]))
    c.add("ex11_sci_small", T([1e-5, 1.0]))
    c.add("ex12_sci_float32_1e-4", T([0.0001]))
    c.add("ex13_fixed_float64_1e-4", T([0.0001], dtype=F64))
    c.add("ex14_sci_ratio", T([0.5, 501.0]))
    c.add("ex15_int_ratio_1000", T([1., 1000.]))
    c.add("ex16_sci_ratio_1001", T([1., 1001.]))
    c.add("ex17a_int_1e8", T([1e8]))
    c.add("ex17b_sci_1e9", T([1e9]))
    c.add("ex18_sci_3digit_exp", T([1e100, 1.0], dtype=F64))
    c.add("ex19a_neg_zero", T([-0.0]))
    c.add("ex19b_zero_neg_zero", T([0., -0.]))
    c.add("ex20_neg_zero_fixed", T([-0.0, 1.5]))
    c.add("ex21_neg_zero_sci", T([-0.0, 1e-5]))
    c.add("ex22_neg_zero_int", T([-0.0, 1000.0, 1.0, 5.0]))
    c.add("ex23_inf", T([INF, 1.0]))
    c.add("ex24_nan_fixed", T([NAN, 1.5]))
    c.add("ex25_nonfinite_only", T([INF, -INF, NAN]))
    c.add("ex26_nan_sci", T([1e-5, NAN]))
    c.add("ex27_2d_nonfinite", T([[1.5, NAN], [INF, -2.0]]))
    c.add("ex28a_scalar_int", T(3))
    c.add("ex28b_scalar_int_mode", T(3.))
    c.add("ex28c_scalar_fixed", T(3.5))
    c.add("ex28d_scalar_neg_zero", T(-0.))
    c.add("ex28e_scalar_sci", T(1e-5))
    c.add("ex28f_scalar_nan", T(NAN))
    c.add("ex28g_scalar_bool", T(True))
    c.add("ex28h_scalar_int32", T(5, dtype=I32))
    c.add("ex28i_scalar_float64", T(2.5, dtype=F64))
    c.add("ex29_bool", T([True, False]))
    c.add("ex30_bool_2d", T([[True, False], [False, True]]))
    for dt in [I32, I8, I16, U8]:
        c.add("ex31_suffix_" + short(dt), T([1, 2], dtype=dt))
    c.add("ex32a_float64", T([1., 2.], dtype=F64))
    c.add("ex32b_float16", T([1.5, 2.0], dtype=F16))
    c.add("ex32c_bfloat16", T([1.5, 2.0], dtype=BF16))
    c.add("ex33_int8_pad", T([-1, 0, 1], dtype=I8))
    c.add("ex34a_empty", T([]))
    c.add("ex34b_empty_int64", T([], dtype=I64))
    c.add("ex34c_empty_int32", T([], dtype=I32))
    c.add("ex34d_empty_bool", T([], dtype=BOOL))
    c.add("ex35a_empty_0x3", torch.zeros(0, 3))
    c.add("ex35b_empty_2x0_int64", torch.zeros(2, 0, dtype=I64))
    c.add("ex35c_empty_1x0x2", torch.zeros(1, 0, 2))
    c.add("ex36_2d", T([[1, 2], [3, 4]]))
    c.add("ex37_2d_pad", T([[1, -200], [30, 4]]))
    c.add("ex38_3d", torch.arange(8).reshape(2, 2, 2))
    c.add("ex39_4d", torch.arange(16).reshape(2, 2, 2, 2))
    c.add("ex40_wrap_int", torch.arange(30))
    c.add("ex41_wrap_int_mode", torch.arange(30.))
    c.add("ex42_wrap_fixed", torch.arange(30) / 7)
    c.add("ex43_wrap_2d", torch.arange(40.).reshape(2, 20) / 3)
    c.add("ex44_suffix_same_line", torch.arange(10, dtype=I32))
    c.add("ex45_suffix_wraps", torch.arange(16, dtype=I32))
    c.add("ex46_suffix_after_wrap", torch.arange(36, dtype=I32))
    c.add("ex47a_1000_not_summarized", torch.arange(1000))
    c.add("ex47b_1001_summarized", torch.arange(1001))
    c.add("ex48_summary_int_mode", torch.arange(1001.))
    c.add("ex49_summary_wraps", torch.arange(1001) * 1.5)
    c.add("ex50_summary_bool", torch.ones(1001, dtype=BOOL))
    c.add("ex51_summary_int32", torch.arange(1001, dtype=I32))
    c.add("ex52_summary_rows_kept", torch.arange(1200).reshape(3, 400))
    c.add("ex53_summary_2d", torch.arange(2000).reshape(40, 50))
    c.add("ex54_summary_rows", torch.arange(2002).reshape(1001, 2))
    c.add("ex55_summary_3d", torch.arange(8000).reshape(20, 20, 20))
    c.add("ex56a_round_float32", T([1.00005]))
    c.add("ex56b_round_float64", T([1.00005], dtype=F64))
    c.add("ex56c_round_half_even", T([0.5, 1.5, 2.5]).round())
    c.add("ex57a_zeros", torch.zeros(3))
    c.add("ex57b_zeros_int32", torch.zeros(3, dtype=I32))
    c.add("ex57c_int64_wide", T([2**62, -1]))


def base_values(dtype):
    """A short list of typical values for a dtype (before conversion)."""
    if dtype == BOOL:
        return [True, False, True, True, False]
    if dtype == U8:
        return [0, 1, 7, 128, 255]
    if dtype == I8:
        return [-128, -1, 0, 5, 127]
    if dtype == I16:
        return [-32768, -300, 0, 42, 32767]
    if dtype == I32:
        return [-2147483648, -70000, 0, 12, 2147483647]
    if dtype == I64:
        return [-2**63, -5, 0, 99, 2**63 - 1]
    return [0.1, -2.5, 3.14159, 100.0, -0.001]


def add_per_dtype(c, g):
    """The same shapes and rules for each of the ten dtypes."""
    for dt in ALL_DTYPES:
        n = short(dt)
        vals = base_values(dt)
        c.add("dt_%s_1d" % n, torch.tensor(vals, dtype=dt))
        c.add("dt_%s_scalar" % n, torch.tensor(vals[1], dtype=dt))
        c.add("dt_%s_scalar_zero" % n, torch.tensor(0, dtype=dt))
        c.add("dt_%s_empty" % n, torch.empty(0, dtype=dt))
        c.add("dt_%s_empty_0x3" % n, torch.empty(0, 3, dtype=dt))
        c.add("dt_%s_empty_2x0x4" % n, torch.empty(2, 0, 4, dtype=dt))
        c.add("dt_%s_ones_1x1x1" % n, torch.ones(1, 1, 1, dtype=dt))
        if dt == BOOL:
            big = torch.rand(3, 4, generator=g) > 0.5
            c.add("dt_bool_2d", big)
            c.add("dt_bool_3d", torch.rand(2, 3, 4, generator=g) > 0.3)
            c.add("dt_bool_4d", torch.rand(2, 2, 2, 3, generator=g) > 0.6)
            c.add("dt_bool_wrap", torch.rand(40, generator=g) > 0.5)
            c.add("dt_bool_summary", torch.rand(1001, generator=g) > 0.5)
            c.add("dt_bool_summary_2d", torch.rand(40, 50, generator=g) > 0.5)
            c.add("dt_bool_all_false", torch.zeros(7, dtype=BOOL))
            continue
        if dt.is_floating_point:
            c.add("dt_%s_2d" % n, (torch.randn(3, 4, generator=g) * 10).to(dt))
            c.add("dt_%s_3d" % n, (torch.randn(2, 3, 4, generator=g)).to(dt))
            c.add("dt_%s_4d" % n, torch.arange(24.).reshape(2, 2, 2, 3).to(dt) - 12)
            c.add("dt_%s_wrap" % n, (torch.randn(40, generator=g) * 3).to(dt))
            c.add("dt_%s_summary" % n, (torch.arange(1001.) / 8).to(dt))
            c.add("dt_%s_summary_2d" % n, torch.randn(40, 50, generator=g).to(dt))
            c.add("dt_%s_arange_int_mode" % n, torch.arange(20).to(dt))
        else:
            lo, hi = (0, 256) if dt == U8 else (-100, 100)
            c.add("dt_%s_2d" % n, torch.randint(lo, hi, (3, 4), generator=g).to(dt))
            c.add("dt_%s_3d" % n, torch.randint(lo, hi, (2, 3, 4), generator=g).to(dt))
            c.add("dt_%s_4d" % n, torch.randint(lo, hi, (2, 2, 2, 3), generator=g).to(dt))
            c.add("dt_%s_wrap" % n, torch.randint(lo, hi, (45,), generator=g).to(dt))
            c.add("dt_%s_summary" % n, torch.arange(1001).to(dt))
            c.add("dt_%s_summary_2d" % n, torch.randint(lo, hi, (40, 50), generator=g).to(dt))
            info = torch.iinfo(dt)
            c.add("dt_%s_extremes" % n, torch.tensor([info.min, info.max, 0], dtype=dt))
            c.add("dt_%s_scalar_min" % n, torch.tensor(info.min, dtype=dt))


def add_float_rules(c, g):
    """Formatter modes, non-finite values and signed zeros, per floating dtype."""
    for dt in FLOAT_DTYPES:
        n = short(dt)
        T = lambda v: torch.tensor(v, dtype=dt)  # noqa: E731
        c.add("fl_%s_int_mode" % n, T([1., -2., 30., 400.]))
        c.add("fl_%s_int_mode_sci_ratio" % n, T([1., 2000.]))
        c.add("fl_%s_fixed" % n, T([0.1, 0.2, 0.3, -1.25]))
        c.add("fl_%s_fixed_rounding" % n, T([1.23456, 9.87654, 0.33333]))
        c.add("fl_%s_sci_small" % n, T([0.00005, 1.0]))
        c.add("fl_%s_sci_ratio" % n, T([0.01, 20.5]))
        c.add("fl_%s_nan_inf_zero" % n, T([NAN, INF, -INF, 0., -0.]))
        c.add("fl_%s_nan_int_mode" % n, T([NAN, 2., -3.]))
        c.add("fl_%s_inf_fixed" % n, T([-INF, 0.5, 0.25]))
        c.add("fl_%s_nan_sci" % n, T([NAN, 1e-3, 30.]))
        c.add("fl_%s_neg_zero_fixed" % n, T([-0., 0.25]))
        c.add("fl_%s_neg_zero_sci" % n, T([-0., 1e-3, 5.]))
        c.add("fl_%s_all_zero" % n, torch.zeros(4, dtype=dt))
        c.add("fl_%s_all_nan" % n, T([NAN, NAN]))
        c.add("fl_%s_scalar_inf" % n, T(-INF))
        c.add("fl_%s_scalar_neg_zero" % n, T(-0.))
        c.add("fl_%s_scalar_sci" % n, T(0.00002))
        c.add("fl_%s_2d_nan_inf" % n, T([[1., NAN, 3.], [-INF, 5., 6.5]]))
        c.add("fl_%s_3d_nan_inf" % n,
              T([[[NAN, 1.], [2., INF]], [[-0., -1e-3], [4., -INF]]]))
        c.add("fl_%s_4d_sci" % n, (torch.arange(16.).reshape(2, 2, 2, 2) * 1e-3 + 1e-3).to(dt))
        c.add("fl_%s_negative_nan_bits" % n,
              bits_tensor({F16: [0xfe00], BF16: [0xffc0], F32: [0xffc00000],
                           F64: [0xfff8000000000000]}[dt] * 2, dt))
    # Float16 / bfloat16 values that are not exactly representable print their true value.
    for dt in [F16, BF16]:
        n = short(dt)
        c.add("inexact_%s_tenths" % n, torch.tensor([0.1, 0.2, 0.3, 0.7], dtype=dt))
        c.add("inexact_%s_thirds" % n, torch.tensor([1 / 3, 2 / 3, 10 / 3], dtype=dt))
        c.add("inexact_%s_pi_e" % n, torch.tensor([math.pi, math.e, -math.pi * 100], dtype=dt))
        c.add("inexact_%s_large" % n, torch.tensor([1000.1, 2049., 4097., 12345.], dtype=dt))
        c.add("inexact_%s_small" % n, torch.tensor([1e-3, 3e-3, 7e-3], dtype=dt))
        c.add("inexact_%s_random" % n, (torch.randn(12, generator=g) * 50).to(dt))
    c.add("f16_limits", torch.tensor([65504., -65504., 6.1035e-05, 5.96e-08], dtype=F16))
    c.add("f16_subnormals", torch.tensor([5.96e-08, 1e-6, 3e-5], dtype=F16))
    c.add("f16_overflow_inf", torch.tensor([70000., 1.], dtype=F16))
    c.add("bf16_limits", torch.tensor([3.3895e38, -1e38, 1e-38], dtype=BF16))
    c.add("bf16_int_mode_large", torch.tensor([256., 257., 1e8], dtype=BF16))
    c.add("f32_limits", torch.tensor([3.4028235e38, 1.17549435e-38, 1.4e-45], dtype=F32))
    c.add("f32_1e8_boundary", torch.tensor([1e8, 1.], dtype=F32))
    c.add("f32_above_1e8", torch.tensor([100000008., 1.], dtype=F32))
    c.add("f32_min_1e-4_boundary", torch.tensor([0.00011, 0.1], dtype=F32))
    c.add("f64_limits", torch.tensor([1.7976931348623157e308, 2.2250738585072014e-308], dtype=F64))
    c.add("f64_denormal", torch.tensor([5e-324, 1.], dtype=F64))
    c.add("f64_big_int_mode", torch.tensor([99999999., -1.], dtype=F64))
    c.add("f64_1e-4_fixed", torch.tensor([0.0001, 0.1], dtype=F64))
    c.add("f64_2pow53", torch.tensor([2.**53, 1.], dtype=F64))
    # Exact binary ties at the fourth decimal: Python and printf round half to even.
    c.add("ties_fixed_f32", torch.tensor([0.03125, 0.09375, 1.03125, 2.34375, 0.15625]))
    c.add("ties_fixed_f64", torch.tensor([0.03125, 0.09375, 1.03125, 2.34375, 0.15625], dtype=F64))
    c.add("ties_sci_f64", torch.tensor([1.03125, 1e-5, 2.34375], dtype=F64))
    c.add("ties_int_mode_half", torch.tensor([0.5, 1.5, 2.5, 3.5], dtype=F64).round())


def add_random_floats(c, g):
    """Random values across magnitudes, shapes and dtypes."""
    scales = [1e-7, 1e-5, 1e-3, 1e-1, 1., 10., 1e3, 1e5, 1e7, 1e9, 1e15, 1e30]
    shapes = [(5,), (13,), (3, 7), (2, 3, 5), (25,), (4, 9), (2, 2, 2, 4)]
    i = 0
    for dt in FLOAT_DTYPES:
        for scale in scales:
            shape = shapes[i % len(shapes)]
            i += 1
            t = (torch.randn(*shape, generator=g, dtype=F64) * scale).to(dt)
            c.add("rand_%s_%g_%s" % (short(dt), scale, "x".join(map(str, shape))), t)
    # Mixed magnitudes in one tensor (forces sci mode), with and without specials.
    for dt in FLOAT_DTYPES:
        t = torch.randn(12, generator=g, dtype=F64) * torch.tensor([10.] * 12) ** torch.randint(
            -6, 6, (12,), generator=g)
        c.add("rand_%s_mixed" % short(dt), t.to(dt))
        t2 = t.clone()
        t2[3], t2[7] = NAN, -INF
        c.add("rand_%s_mixed_specials" % short(dt), t2.to(dt).reshape(3, 4))
    for k in range(6):
        t = torch.randn(k + 3, generator=g) * 100
        c.add("rand_round_f32_%d" % k, t.round() / 4)


def add_random_ints(c, g):
    ranges = {U8: (0, 256), I8: (-128, 128), I16: (-32768, 32768), I32: (-2**31, 2**31),
              I64: (-2**62, 2**62)}
    for dt, (lo, hi) in ranges.items():
        for k, shape in enumerate([(6,), (4, 5), (3, 2, 4), (30,)]):
            t = torch.randint(lo, hi, shape, generator=g, dtype=I64).to(dt)
            c.add("randint_%s_%d" % (short(dt), k), t)
    c.add("int64_extremes", torch.tensor([-2**63, 2**63 - 1, -1, 0]))
    c.add("int64_scalar_min", torch.tensor(-2**63))
    c.add("int64_2d_mixed_width", torch.tensor([[1, -2**40], [7, 0]]))


def add_wrapping(c):
    """Line wrapping and where the dtype suffix lands, across the 80-column boundary."""
    for n in range(8, 40, 3):
        c.add("wrap_int16_arange%d" % n, torch.arange(n, dtype=I16))
    for n in [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 27, 28, 29]:
        c.add("wrap_float64_%d" % n, torch.arange(n, dtype=F64) / 3)
    for n in [7, 8, 9, 10, 11]:
        c.add("wrap_float16_%d" % n, (torch.arange(n, dtype=F64) / 7).to(F16))
    for n in [12, 13, 14]:
        c.add("wrap_uint8_2d_%d" % n, torch.arange(3 * n).reshape(3, n).to(U8))
    c.add("wrap_int64_wide", torch.tensor([2**62 + i for i in range(6)]))
    c.add("wrap_int32_wide_2d", torch.tensor([[2**31 - 1 - i for i in range(9)]] * 2, dtype=I32))
    c.add("wrap_sci_float64", torch.tensor([1e-10 * (i + 1) for i in range(12)], dtype=F64))
    c.add("wrap_bfloat16_summary", torch.arange(1001).to(BF16) * 3)
    c.add("wrap_float64_summary", torch.arange(1001, dtype=F64) * 1.5)
    c.add("wrap_deep_4d_float64", torch.arange(2 * 2 * 2 * 12, dtype=F64).reshape(2, 2, 2, 12) / 9)
    c.add("wrap_wide_cols_1x1", torch.tensor([[123456789012345]]))
    c.add("wrap_one_per_line", torch.tensor([2**62, -2**62, 2**61, 5]).reshape(1, 4))


def add_summaries(c, g):
    """Summarization (numel > 1000) in 1 to 4 dims; width from the shown elements only."""
    c.add("sum_1d_float32_random", torch.randn(5000, generator=g))
    c.add("sum_2d_float32_random", torch.randn(100, 100, generator=g))
    c.add("sum_2x1001", torch.arange(2002).reshape(2, 1001))
    c.add("sum_3d_int16", torch.arange(2000, dtype=I16).reshape(10, 10, 20))
    c.add("sum_3d_mixed", torch.arange(1050).reshape(7, 5, 30))
    c.add("sum_4d_7x7x7x7", torch.arange(7 ** 4).reshape(7, 7, 7, 7))
    c.add("sum_4d_float64", (torch.arange(8 * 8 * 4 * 5, dtype=F64) / 7).reshape(8, 8, 4, 5))
    c.add("sum_5d_uint8", torch.arange(3 * 7 * 2 * 7 * 2).reshape(3, 7, 2, 7, 2).to(U8))
    c.add("sum_3d_1001x1x1", torch.arange(1001.).reshape(1001, 1, 1))
    hidden = torch.ones(2000)
    hidden[1000] = 1e10
    hidden[1001] = NAN
    c.add("sum_hidden_outlier", hidden)
    shown = torch.ones(2000)
    shown[1] = NAN
    shown[-1] = 1e-7
    c.add("sum_shown_specials", shown)
    c.add("sum_3d_nan_inf", torch.where(torch.arange(1331) % 5 == 0, torch.tensor(NAN),
                                        torch.arange(1331.) / 11).reshape(11, 11, 11))
    c.add("sum_float16_2d", (torch.randn(50, 30, generator=g) * 100).to(F16))
    c.add("sum_bfloat16_3d", (torch.randn(9, 9, 15, generator=g)).to(BF16))
    c.add("sum_int8_2d", torch.arange(1100).reshape(11, 100).to(I8))
    c.add("sum_bool_3d", (torch.arange(1100) % 3 == 0).reshape(10, 10, 11))
    c.add("sum_exact_1001_2d", torch.arange(1001).reshape(7, 143))
    c.add("sum_not_1000_2d", torch.arange(1000).reshape(10, 100))
    c.add("sum_int64_extremes", torch.cat([torch.tensor([-2**63]), torch.arange(1000),
                                           torch.tensor([2**63 - 1])]))


def add_odd_shapes(c):
    c.add("shape_1x1", torch.tensor([[5]]))
    c.add("shape_1x1x1x1_float", torch.ones(1, 1, 1, 1) * 2.5)
    c.add("shape_5x1", torch.arange(5).reshape(5, 1))
    c.add("shape_1x5", torch.arange(5).reshape(1, 5))
    c.add("shape_2x1x3", torch.arange(6.).reshape(2, 1, 3))
    c.add("shape_6d", torch.arange(64).reshape(2, 2, 2, 2, 2, 2))
    c.add("shape_empty_3d_int8", torch.empty(3, 0, 0, dtype=I8))
    c.add("shape_empty_0x0_float64", torch.empty(0, 0, dtype=F64))
    c.add("shape_empty_2x3x0_bfloat16", torch.empty(2, 3, 0, dtype=BF16))
    c.add("shape_empty_bigdims", torch.empty(0, 1000000, 1000000))


def repr_cases():
    g = torch.Generator().manual_seed(20240601)
    c = ReprCases()
    add_reference_examples(c)
    add_per_dtype(c, g)
    add_float_rules(c, g)
    add_random_floats(c, g)
    add_random_ints(c, g)
    add_wrapping(c)
    add_summaries(c, g)
    add_odd_shapes(c)
    return c


# --------------------------------------------------------------------------------------------
# conversion cases
# --------------------------------------------------------------------------------------------

FLOAT_SOURCE_VALUES = [
    0., -0., 1., -1., 0.5, -0.5, 1.5, -1.5, 2.5, -2.7, 0.1, 1 / 3, 100.7, -100.7,
    127., 127.9, 128., -128., -128.9, -129., 255., 255.5, 256., 300., -300., 32767., 32768.,
    -32768., -32769., 65504., 65519., 65520., 70001.7, -70001.7, 1e10, -1e10, 2**31 - 0.5,
    2.**31, -2.**31, -2.**31 - 1, -2.**31 - 0.5, 3000000007., -3000000007., 4294967301.,
    2.**53 + 2, 2.**63, -2.**63, 2.**63 - 1024, 1e19, 1e20, -1e20, 1e38, 3.4e38, -3.4e38,
    1e300, 1e-5, 1e-8, 6e-8, 3e-8, 2.**-25, 2.**-24 * 1.5, 1e-40, 5e-324, -5e-324,
    1 + 2**-11, 1 + 2**-11 + 2**-40, 1 + 2**-8, 1 + 2**-8 + 2**-40, 1 + 3 * 2**-9,
    0.03125, 6.1e-5, 3.3961776e38, INF, -INF, NAN, -NAN, 7., NAN,
]

INT_SOURCE_VALUES = [
    0, 1, -1, 2, 7, 127, 128, -128, -129, 255, 256, 300, -300, 32767, 32768, -32768, -32769,
    65504, 65519, 65520, 65535, 65536, -65520, -70000, 2**24 + 1, 2**24 + 3, 2**31 - 1, 2**31,
    -2**31, -2**31 - 1, 2**32 + 5, 2**53 + 1, 2**62 + 2**38 + 1, 2**30 + 2**22 + 1,
    2**30 + 2**22, 2**63 - 1, -2**63, 1000000007, -7, 16777217, 33554435, 257, 259,
]

# NaN payloads and signs, appended raw so each source dtype has some in its last elements.
NAN_BITS = {
    F16: [0x7e00, 0xfe00, 0x7c01, 0x7d23, 0xfe01],
    BF16: [0x7fc0, 0xffc0, 0x7f81, 0x7fa3, 0xffc1],
    F32: [0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00001, 0xffbfffff, 0x7fc12345],
    F64: [0x7ff8000000000000, 0xfff8000000000000, 0x7ff0000000000001, 0x7ff8000000000001,
          0xfff7ffffffffffff, 0x7ff4000020000000],
}


def conversion_source(dtype):
    if dtype == BOOL:
        return torch.tensor([True, False, False, True, True, False, True], dtype=BOOL)
    if dtype in INT_DTYPES:
        return torch.tensor(INT_SOURCE_VALUES, dtype=I64).to(dtype)
    body = torch.tensor(FLOAT_SOURCE_VALUES, dtype=F64).to(dtype)
    nans = bits_tensor(NAN_BITS[dtype], dtype)
    return torch.cat([nans, body, nans])


def convert_lines():
    out = []

    def emit(name, src, dst_dtype):
        dst = src.to(dst_dtype)
        out.append("case " + name)
        out.append("from " + short(src.dtype))
        out.append("to " + short(dst_dtype))
        out.append("count %d" % src.numel())
        out.extend(hex_lines("data", raw_bytes(src)))
        out.extend(hex_lines("expect", raw_bytes(dst)))
        out.append("end")

    for src_dtype in ALL_DTYPES:
        src = conversion_source(src_dtype)
        for dst_dtype in ALL_DTYPES:
            emit("%s_to_%s" % (short(src_dtype), short(dst_dtype)), src, dst_dtype)
    # torch's float64 -> bfloat16 NaN bits depend on the element's position (vector blocks of
    # 16 vs the scalar tail), so check several lengths.
    for count in [1, 15, 16, 17, 40, 64]:
        src = torch.full((count,), NAN, dtype=F64)
        src[::3] = -NAN
        emit("float64_to_bfloat16_nan_layout_%d" % count, src, BF16)
    emit("float32_to_bfloat16_nan_layout_37", torch.full((37,), -NAN, dtype=F32), BF16)
    return out


def write(path, header, lines):
    with open(path, "w") as f:
        f.write(header)
        f.write("\n".join(lines))
        f.write("\n")


def main():
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    capability = [line.split(":")[-1].strip() for line in torch.__config__.show().split("\n")
                  if "CPU capability" in line]
    header = ("# Generated by scripts/gen_tensor_golden.py with torch %s (CPU capability %s); "
              "do not edit.\n" % (torch.__version__, capability[0] if capability else "unknown"))
    c = repr_cases()
    write(os.path.join(GOLDEN_DIR, "tensor_repr.txt"), header, c.lines())
    conv = convert_lines()
    write(os.path.join(GOLDEN_DIR, "tensor_convert.txt"), header, conv)
    print("%d repr cases, %d conversion cases" % (len(c.cases),
                                                  sum(1 for l in conv if l.startswith("case "))),
          file=sys.stderr)


if __name__ == "__main__":
    main()
