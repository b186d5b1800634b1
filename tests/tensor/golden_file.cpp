#include "golden_file.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace golden {
namespace {

void append_hex(std::vector<unsigned char>& out, const std::string& text, int line) {
  if (text.size() % 2 != 0)
    throw std::runtime_error("odd hex length at line " + std::to_string(line));
  for (std::size_t i = 0; i < text.size(); i += 2)
    out.push_back(static_cast<unsigned char>(std::stoul(text.substr(i, 2), nullptr, 16)));
}

struct Reader {
  std::ifstream in;
  std::string path;
  int line_number = 0;

  bool next(std::string& line) {
    if (!std::getline(in, line)) return false;
    ++line_number;
    return true;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(path + ":" + std::to_string(line_number) + ": " + what);
  }
};

void read_repr_lines(Reader& r, Case& c, const std::string& count_text) {
  const int count = std::stoi(count_text);
  std::string line;
  for (int i = 0; i < count; ++i) {
    if (!r.next(line) || line.empty() || line[0] != '|') r.fail("expected a '|' repr line");
    if (i) c.repr += '\n';
    c.repr += line.substr(1);
  }
}

// Applies one "key value" line to the case being read.
void apply_field(Reader& r, Case& c, const std::string& key, const std::string& value) {
  if (key == "data") {
    append_hex(c.data, value, r.line_number);
  } else if (key == "expect") {
    append_hex(c.expect, value, r.line_number);
  } else if (key == "shape") {
    std::istringstream sizes(value);
    for (std::int64_t s; sizes >> s;) c.shape.push_back(s);
  } else if (key == "repr") {
    read_repr_lines(r, c, value);
  } else {
    c.fields[key] = value;
  }
}

}  // namespace

std::vector<Case> read_cases(const std::string& file) {
  Reader r{std::ifstream(std::string(SHMDIST_GOLDEN_DIR) + "/" + file), file};
  if (!r.in) throw std::runtime_error("cannot open golden file " + file);
  std::vector<Case> cases;
  Case* current = nullptr;
  for (std::string line; r.next(line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t space = line.find(' ');
    const std::string key = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (key == "case") {
      if (current) r.fail("case without end");
      cases.push_back(Case{value, r.line_number, {}, {}, {}, {}, {}});
      current = &cases.back();
    } else if (key == "end") {
      if (!current) r.fail("end without case");
      current = nullptr;
    } else if (!current) {
      r.fail("field outside a case");
    } else {
      apply_field(r, *current, key, value);
    }
  }
  if (current) r.fail("missing end");
  return cases;
}

shmdist::DType dtype_named(const std::string& name) {
  for (unsigned code = 0; code < shmdist::kNumDTypes; ++code) {
    const shmdist::DType d = shmdist::dtype_from_code(code);
    if (shmdist::dtype_name(d) == "torch." + name) return d;
  }
  throw std::runtime_error("unknown dtype name in golden file: " + name);
}

std::string hex(const void* bytes, std::size_t count) {
  static const char digits[] = "0123456789abcdef";
  std::string text;
  for (std::size_t i = 0; i < count; ++i) {
    const unsigned byte = static_cast<const unsigned char*>(bytes)[i];
    text += digits[byte >> 4];
    text += digits[byte & 15];
  }
  return text;
}

}  // namespace golden
