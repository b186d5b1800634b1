// Reader for the golden files written by scripts/gen_tensor_golden.py (format described there).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <shmdist/tensor.hpp>

namespace golden {

struct Case {
  std::string name;
  int line = 0;                               // where "case" appeared, for failure messages
  std::map<std::string, std::string> fields;  // dtype, from, to, count, ...
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> data;
  std::vector<unsigned char> expect;
  std::string repr;  // the expected lines joined with '\n'
};

// Reads every case of SHMDIST_GOLDEN_DIR/<file>; throws std::runtime_error on a malformed file.
std::vector<Case> read_cases(const std::string& file);

// "float16" -> kFloat16 (the names after "torch.").
shmdist::DType dtype_named(const std::string& name);

std::string hex(const void* bytes, std::size_t count);

}  // namespace golden
