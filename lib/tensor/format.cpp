// Tensor::to_string: PyTorch's repr(tensor), following torch/_tensor_str.py (1.13, unchanged in
// current releases for these dtypes): _str_intern, _tensor_str, _tensor_str_with_formatter,
// _vector_str, get_summarized_data and _add_suffixes. Names below mirror those functions so the
// two can be read side by side.
#include <algorithm>

#include <shmdist/tensor.hpp>

#include "tensor/format_number.hpp"

namespace shmdist {
namespace {

// torch.set_printoptions defaults.
constexpr std::int64_t kThreshold = 1000;
constexpr std::int64_t kEdgeItems = 3;
constexpr std::int64_t kLineWidth = 80;

struct Printout {
  const void* data;
  const std::vector<std::int64_t>& sizes;
  std::vector<std::size_t> strides;  // row-major, in elements
  bool summarize;
};

// The positions of one dimension that are printed: all, or the edge items around "...".
std::vector<std::int64_t> shown_positions(std::int64_t size, bool summarize) {
  std::vector<std::int64_t> positions;
  if (summarize && size > 2 * kEdgeItems) {
    for (std::int64_t i = 0; i < kEdgeItems; ++i) positions.push_back(i);
    for (std::int64_t i = size - kEdgeItems; i < size; ++i) positions.push_back(i);
  } else {
    for (std::int64_t i = 0; i < size; ++i) positions.push_back(i);
  }
  return positions;
}

// get_summarized_data: flat indices of every element the printout shows. The column width
// depends only on these.
void collect_shown(const Printout& p, std::size_t dim, std::size_t offset,
                   std::vector<std::size_t>& out) {
  if (dim == p.sizes.size()) {
    out.push_back(offset);
    return;
  }
  for (const std::int64_t i : shown_positions(p.sizes[dim], p.summarize))
    collect_shown(p, dim + 1, offset + static_cast<std::size_t>(i) * p.strides[dim], out);
}

// "[" + separator.join(parts) + "]". Built by appending: GCC 12 warns falsely (-Wrestrict) on
// `"literal" + std::string` temporaries.
std::string bracketed_join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string joined = "[";
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) joined += separator;
    joined += parts[i];
  }
  joined += ']';
  return joined;
}

// "," followed by `newlines` line breaks and `spaces` spaces.
std::string separator_text(std::size_t newlines, std::int64_t spaces) {
  std::string text = ",";
  text.append(newlines, '\n');
  text.append(static_cast<std::size_t>(spaces), ' ');
  return text;
}

// _vector_str: one innermost row, wrapped so that each line holds as many elements as fit in
// the line width at this indent (" ..." counts as an element).
std::string vector_str(const Printout& p, const detail::ElementFormatter& formatter,
                       std::size_t offset, std::int64_t indent) {
  const auto element_length = static_cast<std::int64_t>(formatter.width()) + 2;
  // Python floors a true division; for a negative numerator max() makes the rounding moot.
  const std::int64_t per_line = std::max<std::int64_t>(1, (kLineWidth - indent) / element_length);
  const std::int64_t size = p.sizes.back();
  std::vector<std::string> elements;
  for (const std::int64_t i : shown_positions(size, p.summarize)) {
    if (p.summarize && size > 2 * kEdgeItems && i == size - kEdgeItems) elements.push_back(" ...");
    elements.push_back(formatter.format(p.data, offset + static_cast<std::size_t>(i)));
  }
  std::vector<std::string> lines;
  const auto step = static_cast<std::size_t>(per_line);
  for (std::size_t start = 0; start < elements.size(); start += step) {
    std::string line;
    for (std::size_t i = start; i < std::min(elements.size(), start + step); ++i) {
      if (i > start) line += ", ";
      line += elements[i];
    }
    lines.push_back(std::move(line));
  }
  return bracketed_join(lines, separator_text(1, indent + 1));
}

// _tensor_str_with_formatter for dim >= 1: nested blocks separated by (dims left - 1) blank
// lines, with "..." standing for the summarized middle.
std::string block_str(const Printout& p, const detail::ElementFormatter& formatter,
                      std::size_t dim, std::size_t offset, std::int64_t indent) {
  if (dim + 1 == p.sizes.size()) return vector_str(p, formatter, offset, indent);
  const std::int64_t size = p.sizes[dim];
  std::vector<std::string> slices;
  for (const std::int64_t i : shown_positions(size, p.summarize)) {
    if (p.summarize && size > 2 * kEdgeItems && i == size - kEdgeItems) slices.push_back("...");
    const std::size_t sub_offset = offset + static_cast<std::size_t>(i) * p.strides[dim];
    slices.push_back(block_str(p, formatter, dim + 1, sub_offset, indent + 1));
  }
  const std::size_t dims_left = p.sizes.size() - dim;
  return bracketed_join(slices, separator_text(dims_left - 1, indent + 1));
}

// _tensor_str for a non-empty tensor.
std::string body_str(const Tensor& t, std::int64_t indent) {
  Printout p{t.data_ptr(), t.sizes(), std::vector<std::size_t>(t.sizes().size()),
             t.numel() > kThreshold};
  std::size_t stride = 1;
  for (std::size_t d = p.sizes.size(); d-- > 0;) {
    p.strides[d] = stride;
    stride *= static_cast<std::size_t>(p.sizes[d]);
  }
  std::vector<std::size_t> shown;
  collect_shown(p, 0, 0, shown);
  const detail::ElementFormatter formatter(t.dtype(), p.data, shown);
  if (p.sizes.empty()) return formatter.format(p.data, 0);  // 0-d: _scalar_str
  return block_str(p, formatter, 0, 0, indent);
}

// Python's str(tuple(shape)): "(0, 3)", and "(0,)" for one dimension.
std::string tuple_text(const std::vector<std::int64_t>& sizes) {
  std::string text = "(";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(sizes[i]);
  }
  return text + (sizes.size() == 1 ? ",)" : ")");
}

// _add_suffixes: each suffix follows ", " on the last line, or wraps to its own line at the
// prefix's indent when it would pass the line width.
std::string add_suffixes(std::string text, const std::vector<std::string>& suffixes,
                         std::int64_t indent) {
  const std::size_t newline = text.rfind('\n');
  // len(s) - s.rfind("\n") + 1, with rfind giving -1 when there is no newline.
  auto last_line_len = static_cast<std::int64_t>(text.size()) -
                       (newline == std::string::npos ? -1 : static_cast<std::int64_t>(newline)) + 1;
  for (const std::string& suffix : suffixes) {
    const auto suffix_len = static_cast<std::int64_t>(suffix.size());
    if (last_line_len + suffix_len + 2 > kLineWidth) {
      text += ",\n";
      text.append(static_cast<std::size_t>(indent), ' ');
      text += suffix;
      last_line_len = indent + suffix_len;
    } else {
      text += ", ";
      text += suffix;
      last_line_len += suffix_len + 2;
    }
  }
  return text + ")";
}

}  // namespace

std::string Tensor::to_string() const {
  if (!defined()) return "[ Tensor (undefined) ]";  // what libtorch prints
  const std::string prefix = "tensor(";
  const auto indent = static_cast<std::int64_t>(prefix.size());
  std::vector<std::string> suffixes;
  const std::string dtype_suffix = "dtype=" + std::string(dtype_name(dtype_));
  if (numel_ == 0) {
    // Empty data cannot reveal the dtype, so everything but the default float prints it.
    if (sizes_.size() != 1) suffixes.push_back("size=" + tuple_text(sizes_));
    if (dtype_ != DType::Float32) suffixes.push_back(dtype_suffix);
    return add_suffixes(prefix + "[]", suffixes, indent);
  }
  if (dtype_ != DType::Float32 && dtype_ != DType::Int64 && dtype_ != DType::Bool)
    suffixes.push_back(dtype_suffix);
  return add_suffixes(prefix + body_str(*this, indent), suffixes, indent);
}

}  // namespace shmdist
