// The one strict reading of every JSON file meshtrain reads (model configs, cluster and machine
// files, metrics lines on resume, a checkpoint's index.json and safetensors headers, traces).
//
// parse_json_strict refuses, each with one sentence that names the file and what to change:
//   - an empty text, and a syntax error (with its line and column);
//   - a key given twice in one object, at any depth ("gives the field \"scale\" more than once
//     in the top-level object", "... in layers[3]"): the last value would win silently;
//   - a number beyond the range of a double (1e999, -1e999), naming the field's path.
// The JSON library's own exception text never reaches the message.
//
// read_text_file reads a whole regular file, refusing a missing file, a directory and anything
// that is not a regular file (a FIFO would block the read) before opening it.
//
// Every refusal throws JsonError (a std::invalid_argument, so the CLI exits 2). Its problem()
// is the sentence's middle ("is not valid JSON: syntax error at line 3, column 5"), for callers
// that word the refusal their own way (a corrupt checkpoint).
//
// Limits: integers are not range-checked here (the readers know each field's range); a number
// too small for a double (1e-999) reads as 0, as strtod gives it.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace meshtrain::io {

class JsonError : public std::invalid_argument {
 public:
  JsonError(const std::string& source, std::string problem, const std::string& fix)
      : std::invalid_argument(source + " " + problem + (fix.empty() ? "" : "; " + fix)), problem_(std::move(problem)) {}
  const std::string& problem() const { return problem_; }

 private:
  std::string problem_;
};

// `source` names the file in messages ("model config file m.json", or just the path); `hint`
// ends the refusal of an empty or malformed text (what the file must hold, how to get one);
// it may be empty where the caller words the refusal itself from problem().
nlohmann::json parse_json_strict(std::string_view text, const std::string& source, const std::string& hint);

// The bytes of the regular file `path`; `hint` ends the refusal ("give --config a JSON file").
std::string read_text_file(const std::string& path, const std::string& source, const std::string& hint);

// read_text_file then parse_json_strict, one hint for both.
nlohmann::json read_json_file_strict(const std::string& path, const std::string& source, const std::string& hint);

}  // namespace meshtrain::io
