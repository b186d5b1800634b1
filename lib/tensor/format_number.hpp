// Element formatting for tensor printing: PyTorch's _Formatter (torch/_tensor_str.py).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <shmdist/tensor.hpp>

namespace shmdist::detail {

// Decides the number style (integer-valued `7.`, fixed `1.5000`, or scientific `1.0000e-05`)
// and the column width from the elements that will be shown, as torch does, then formats
// single elements padded to that width.
class ElementFormatter {
 public:
  // `shown` are flat indices into `data` of every element the printout will contain.
  ElementFormatter(DType dtype, const void* data, const std::vector<std::size_t>& shown);

  std::size_t width() const { return max_width_; }
  // The element at flat index `index`, left-padded to width() (never truncated).
  std::string format(const void* data, std::size_t index) const;

 private:
  void choose_float_style(const std::vector<double>& nonzero_finite);

  DType dtype_;
  bool floating_;
  bool int_mode_ = true;
  bool sci_mode_ = false;
  std::size_t max_width_ = 1;
};

}  // namespace shmdist::detail
