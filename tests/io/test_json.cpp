// The strict JSON reading (io/json.h): a valid text parses to the same document the library
// gives; a key given twice (at the top or nested), a number beyond a double, an empty text and
// a syntax error are each refused with one sentence naming the file, the field or the position,
// and the library's own text never shows; a missing file, a directory and a FIFO are refused
// before any read.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "meshtrain/io/json.h"
#include "temp_dir.h"

using meshtrain::io::JsonError;
using meshtrain::io::parse_json_strict;
using meshtrain::io::read_json_file_strict;
using nlohmann::json;

namespace {

// The message parse_json_strict gives for `text` (from "f.json", hint "fix it"), or "" when
// it accepts it.
std::string refusal(const std::string& text) {
  try {
    parse_json_strict(text, "f.json", "fix it");
  } catch (const JsonError& e) {
    EXPECT_EQ(std::string(e.what()).find("parse_error"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("[json.exception"), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

}  // namespace

TEST(StrictJson, AValidTextParsesAsTheLibraryParsesIt) {
  const std::string text = R"({"a": [1, -2, 3.5, {"b": null, "c": true}], "d": "x", "e": {"f": 18446744073709551615},
                               "g": 1e-999, "h": [], "i": {}})";
  EXPECT_EQ(parse_json_strict(text, "f.json", "fix it"), json::parse(text));
  EXPECT_EQ(parse_json_strict("[1, [2, [3]]]", "f.json", "fix it"), json::parse("[1, [2, [3]]]"));
  EXPECT_EQ(parse_json_strict("  7 \n", "f.json", "fix it"), json(7));
  // The same key in two objects is no duplicate.
  EXPECT_EQ(refusal(R"({"a": {"x": 1}, "b": {"x": 2}, "x": 3})"), "");
  EXPECT_EQ(refusal(R"([{"x": 1}, {"x": 2}])"), "");
}

TEST(StrictJson, RefusesAKeyGivenTwiceNamingTheKeyAndWhere) {
  EXPECT_EQ(refusal(R"({"scale": 4, "name": "resnet-small", "scale": 2})"),
            "f.json gives the field \"scale\" more than once in the top-level object; keep one value for it");
  EXPECT_EQ(refusal(R"({"layers": [{}, {}, {}, {"n": 1, "n": 1}]})"),
            "f.json gives the field \"n\" more than once in layers[3]; keep one value for it");
  EXPECT_EQ(refusal(R"({"a": {"b": {"c": 1, "c": 2}}})"),
            "f.json gives the field \"c\" more than once in a.b; keep one value for it");
  EXPECT_EQ(refusal(R"([{"x": 1, "x": 1}])"), "f.json gives the field \"x\" more than once in [0]; keep one value for it");
}

TEST(StrictJson, RefusesANumberBeyondADoubleNamingTheField) {
  EXPECT_EQ(refusal(R"({"device": {"gemm_tflops": 1e999}})"),
            "f.json gives device.gemm_tflops as 1e999, a number beyond the range of a double (about 1.8e308); "
            "give a finite number");
  EXPECT_NE(refusal(R"({"x": [0, -1e999]})").find("gives x[1] as -1e999"), std::string::npos)
      << refusal(R"({"x": [0, -1e999]})");
  EXPECT_NE(refusal("1e400").find("gives its value as 1e400"), std::string::npos) << refusal("1e400");
  // An integer too long for 64 bits is a double, and one too long for a double is refused.
  EXPECT_EQ(refusal(R"({"n": 123456789012345678901234567890})"), "");
  EXPECT_NE(refusal("{\"n\": 1" + std::string(400, '0') + "}").find("gives n as 1000"), std::string::npos);
}

TEST(StrictJson, RefusesAnEmptyTextAndASyntaxErrorWithItsPosition) {
  EXPECT_EQ(refusal(""), "f.json is not valid JSON: it is empty; fix it");
  EXPECT_EQ(refusal(" \n\t "), "f.json is not valid JSON: it is empty; fix it");
  EXPECT_EQ(refusal("{\n  \"a\": 1,\n  \"b\" 2\n}"), "f.json is not valid JSON: syntax error at line 3, column 7; fix it");
  EXPECT_EQ(refusal("{\"a\": 1"), "f.json is not valid JSON: syntax error at line 1, column 8; fix it");
  EXPECT_NE(refusal("{} x").find("syntax error at line 1, column 4"), std::string::npos) << refusal("{} x");
  // problem() is the middle of the sentence, for callers that word the refusal their own way.
  try {
    parse_json_strict("{,", "index.json", "");
    FAIL() << "accepted";
  } catch (const JsonError& e) {
    EXPECT_EQ(e.problem(), "is not valid JSON: syntax error at line 1, column 2");
  }
}

TEST(StrictJson, ReadingAFileRefusesWhatIsNoRegularFile) {
  meshtrain::testing::TempDir dir("json");
  auto message = [](const std::string& path) -> std::string {
    try {
      read_json_file_strict(path, "the file " + path, "give a JSON file");
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  std::ofstream(dir.file("ok.json")) << R"({"a": 1})";
  EXPECT_EQ(read_json_file_strict(dir.file("ok.json"), "ok.json", "give a JSON file"), json({{"a", 1}}));
  EXPECT_EQ(message(dir.file("none.json")), "the file " + dir.file("none.json") + " does not exist; give a JSON file");
  EXPECT_EQ(message(dir.path().string()), "the file " + dir.path().string() + " is a directory; give a JSON file");
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  EXPECT_EQ(message(dir.file("fifo")),
            "the file " + dir.file("fifo") + " is not a regular file (a pipe, socket or device); give a JSON file");
  std::ofstream(dir.file("dup.json")) << R"({"a": 1, "a": 2})";
  EXPECT_NE(message(dir.file("dup.json")).find("gives the field \"a\" more than once"), std::string::npos);
}
