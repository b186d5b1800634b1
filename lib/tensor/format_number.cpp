// Number text exactly as Python formats the doubles torch's printer hands it.
//
// glibc's printf and Python's float formatting both round the exact binary value to nearest,
// ties to even, and both print at least two exponent digits, so "%.4f", "%.4e" and "%.0f"
// agree with "{:.4f}", "{:.4e}" and "{:.0f}" for finite values. They differ on NaN (glibc
// prints "-nan" for a NaN with the sign bit set; Python always prints "nan"), so non-finite
// values never reach printf.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tensor/element_io.hpp"
#include "tensor/format_number.hpp"

namespace shmdist::detail {
namespace {

constexpr double kSciMaxRatio = 1000.0;  // max/min above this: scientific
constexpr double kSciAbove = 1.0e8;      // a magnitude above this: scientific
constexpr double kSciBelow = 1.0e-4;     // non-integers smaller than this: scientific

std::string nonfinite_text(double v) {
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

// Python's format(v, spec) for spec "{:.4f}" (kFixed), "{:.4e}" (kSci) or "{:.0f}" (kWhole).
enum class Style { kFixed, kSci, kWhole };

std::string python_format(double v, Style style) {
  if (!std::isfinite(v)) return nonfinite_text(v);
  // Enough for "%.4f" of the largest double (309 digits + sign + point + 4 decimals).
  char buffer[400];
  int length = 0;
  switch (style) {
    case Style::kFixed: length = std::snprintf(buffer, sizeof buffer, "%.4f", v); break;
    case Style::kSci: length = std::snprintf(buffer, sizeof buffer, "%.4e", v); break;
    case Style::kWhole: length = std::snprintf(buffer, sizeof buffer, "%.0f", v); break;
  }
  return std::string(buffer, static_cast<std::size_t>(std::max(length, 0)));
}

}  // namespace

ElementFormatter::ElementFormatter(DType dtype, const void* data,
                                   const std::vector<std::size_t>& shown)
    : dtype_(dtype), floating_(is_floating_point(dtype)) {
  if (!floating_) {
    for (const std::size_t index : shown)
      max_width_ = std::max(max_width_, format(data, index).size());
    return;
  }
  std::vector<double> nonzero_finite;
  for (const std::size_t index : shown) {
    const double v = load_as_double(data, dtype_, index);
    if (std::isfinite(v) && v != 0) nonzero_finite.push_back(v);
  }
  // Only zeros, NaN and infinities: torch keeps int mode and width 1.
  if (!nonzero_finite.empty()) choose_float_style(nonzero_finite);
}

void ElementFormatter::choose_float_style(const std::vector<double>& nonzero_finite) {
  double min_abs = std::fabs(nonzero_finite.front());
  double max_abs = min_abs;
  for (const double v : nonzero_finite) {
    min_abs = std::min(min_abs, std::fabs(v));
    max_abs = std::max(max_abs, std::fabs(v));
    int_mode_ = int_mode_ && v == std::ceil(v);
  }
  const bool wide_range = max_abs / min_abs > kSciMaxRatio || max_abs > kSciAbove;
  sci_mode_ = int_mode_ ? wide_range : wide_range || min_abs < kSciBelow;
  // In int mode the width counts the trailing '.' that format() appends.
  const Style style = sci_mode_ ? Style::kSci : int_mode_ ? Style::kWhole : Style::kFixed;
  const std::size_t extra = (!sci_mode_ && int_mode_) ? 1 : 0;
  for (const double v : nonzero_finite)
    max_width_ = std::max(max_width_, python_format(v, style).size() + extra);
}

std::string ElementFormatter::format(const void* data, std::size_t index) const {
  std::string text;
  if (dtype_ == DType::Bool) {
    text = load_as_int64(data, dtype_, index) ? "True" : "False";
  } else if (!floating_) {
    text = std::to_string(load_as_int64(data, dtype_, index));
  } else {
    const double v = load_as_double(data, dtype_, index);
    if (sci_mode_) {
      text = python_format(v, Style::kSci);
    } else if (int_mode_) {
      text = python_format(v, Style::kWhole);
      if (std::isfinite(v)) text += '.';
    } else {
      text = python_format(v, Style::kFixed);
    }
  }
  if (text.size() < max_width_) text.insert(0, max_width_ - text.size(), ' ');
  return text;
}

}  // namespace shmdist::detail
