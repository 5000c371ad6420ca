// The strict JSON reading (io/json.h): a SAX handler that builds the document as the library's
// own parser does, tracking the path of the value being read so that a duplicate key or an
// overflowing number is refused by name.
#include "meshtrain/io/json.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

namespace meshtrain::io {

namespace {

using json = nlohmann::json;

// ---- the handler ----

class StrictSax final : public nlohmann::json_sax<json> {
 public:
  // Why the parse stopped, if it did.
  enum class Stop { none, syntax, duplicate, overflow };
  Stop stop = Stop::none;
  std::string what;      // the duplicate key, or the overflowing number's text
  std::string where;     // the object holding the duplicate, or the number's path
  std::size_t byte = 0;  // the syntax error's position, as the library counts it

  json take() { return std::move(root_); }

  bool null() override { return insert(json(nullptr)); }
  bool boolean(bool v) override { return insert(json(v)); }
  bool number_integer(number_integer_t v) override { return insert(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return insert(json(v)); }
  bool number_float(number_float_t v, const string_t& text) override {
    if (!std::isfinite(v)) return overflowing(text);  // the library refuses these first: a guard
    return insert(json(v));
  }
  bool string(string_t& v) override { return insert(json(std::move(v))); }
  bool binary(binary_t& v) override { return insert(json::binary(std::move(v))); }

  bool start_object(std::size_t) override { return open(json::object()); }
  bool key(string_t& k) override {
    Frame& f = open_.back();
    if (!f.keys.insert(k).second) {
      stop = Stop::duplicate;
      what = k;
      where = f.path.empty() ? "the top-level object" : f.path;
      return false;
    }
    f.key = k;
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_array() override { return close(); }

  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& e) override {
    if (e.id == 406) return overflowing(last_token);  // the library's "number overflow"
    stop = Stop::syntax;
    byte = position;
    return false;
  }

 private:
  struct Frame {
    json* value;                 // an open object or array
    std::string path;            // "" at the top level, else "gemm[2]", "config.model"
    std::set<std::string> keys;  // an object's keys so far
    std::string key;             // an object's key whose value comes next
  };
  json root_;
  std::vector<Frame> open_;

  // The path of the value about to be read ("" for the document itself).
  std::string next_path() const {
    if (open_.empty()) return "";
    const Frame& f = open_.back();
    if (f.value->is_array()) return f.path + "[" + std::to_string(f.value->size()) + "]";
    return f.path.empty() ? f.key : f.path + "." + f.key;
  }
  // Places `v` where the next value goes and returns it. An open child's slot stays where it
  // is: its parent grows only after the child closes.
  json* place(json v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Frame& f = open_.back();
    if (f.value->is_array()) {
      f.value->push_back(std::move(v));
      return &f.value->back();
    }
    json& slot = (*f.value)[f.key];
    slot = std::move(v);
    return &slot;
  }
  bool insert(json v) {
    place(std::move(v));
    return true;
  }
  bool open(json empty) {
    std::string path = next_path();
    json* slot = place(std::move(empty));
    open_.push_back(Frame{slot, std::move(path), {}, {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }
  bool overflowing(const std::string& text) {
    stop = Stop::overflow;
    what = text.size() > 40 ? text.substr(0, 37) + "..." : text;
    where = next_path();
    return false;
  }
};

// "line L, column C" of the byte the library stopped at (it counts from 1, past the byte).
std::string line_and_column(std::string_view text, std::size_t byte) {
  const std::size_t at = std::min<std::size_t>(byte == 0 ? 0 : byte - 1, text.size());
  const std::size_t line = 1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
  const std::size_t nl = text.rfind('\n', at == 0 ? 0 : at - 1);
  const std::size_t column = nl == std::string_view::npos || at == 0 ? at + 1 : at - nl;
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

}  // namespace

// ---- parse and read ----

nlohmann::json parse_json_strict(std::string_view text, const std::string& source, const std::string& hint) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
    throw JsonError(source, "is not valid JSON: it is empty", hint);
  StrictSax sax;
  const char* begin = text.data();
  if (json::sax_parse(begin, begin + text.size(), &sax)) return sax.take();
  switch (sax.stop) {
    case StrictSax::Stop::duplicate:
      throw JsonError(source, "gives the field \"" + sax.what + "\" more than once in " + sax.where,
                      "keep one value for it");
    case StrictSax::Stop::overflow:
      throw JsonError(source,
                      "gives " + (sax.where.empty() ? std::string("its value") : sax.where) + " as " + sax.what +
                          ", a number beyond the range of a double (about 1.8e308)",
                      "give a finite number");
    case StrictSax::Stop::syntax:
    case StrictSax::Stop::none:
      break;
  }
  throw JsonError(source, "is not valid JSON: syntax error at " + line_and_column(text, sax.byte), hint);
}

std::string read_text_file(const std::string& path, const std::string& source, const std::string& hint) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) throw JsonError(source, "does not exist", hint);
    throw JsonError(source, std::string("cannot be read (") + std::strerror(err) + ")", hint);
  }
  if (S_ISDIR(st.st_mode)) throw JsonError(source, "is a directory", hint);
  if (!S_ISREG(st.st_mode)) throw JsonError(source, "is not a regular file (a pipe, socket or device)", hint);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw JsonError(source, std::string("cannot be opened (") + std::strerror(errno) + ")", hint);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw JsonError(source, "cannot be read (an I/O error)", hint);
  return text;
}

nlohmann::json read_json_file_strict(const std::string& path, const std::string& source, const std::string& hint) {
  return parse_json_strict(read_text_file(path, source, hint), source, hint);
}

}  // namespace meshtrain::io
