// Model config JSON: strict parsing (required fields, unknown keys, integer types and ranges)
// with messages that name the source and the field as the JSON spells it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "meshtrain/model/config.h"
#include "temp_dir.h"

using namespace meshtrain;
using nlohmann::json;

namespace {

json tiny_json() {
  return {{"n_layer", 4}, {"n_embd", 128}, {"n_head", 4}, {"vocab_size", 256}, {"block_size", 64}};
}

// The message of the std::invalid_argument that from_json throws (fails the test if none).
std::string refusal(const json& j, const std::string& source = "model config") {
  try {
    model::GPTConfig::from_json(j, source);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << j.dump();
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(ConfigJson, NamedConfigsRoundTrip) {
  for (const std::string& name : model::gpt_config_names()) {
    model::GPTConfig c = model::gpt_config(name);
    model::GPTConfig back = model::GPTConfig::from_json(c.to_json());
    EXPECT_EQ(back.to_json(), c.to_json()) << name;
  }
}

TEST(ConfigJson, OptionalFieldsTakeTheirDefaults) {
  model::GPTConfig c = model::GPTConfig::from_json(tiny_json());
  EXPECT_EQ(c.batch, 12);
  EXPECT_EQ(c.seq, 64);
  json short_block = tiny_json();
  short_block["block_size"] = 16;
  EXPECT_EQ(model::GPTConfig::from_json(short_block).seq, 16);  // min(64, block_size)
  json whole_float = tiny_json();
  whole_float["n_layer"] = 6.0;
  EXPECT_EQ(model::GPTConfig::from_json(whole_float).n_layer, 6);
}

TEST(ConfigJson, MissingFieldsAreNamed) {
  std::string m = refusal(json::object());
  for (const char* f : {"n_layer", "n_embd", "n_head", "vocab_size", "block_size"}) EXPECT_TRUE(contains(m, f)) << m;
  json j = tiny_json();
  j.erase("n_head");
  m = refusal(j);
  EXPECT_TRUE(contains(m, "missing")) << m;
  EXPECT_TRUE(contains(m, "n_head")) << m;
}

TEST(ConfigJson, UnknownKeyIsNamed) {
  json j = tiny_json();
  j["n_lyer"] = 4;
  EXPECT_TRUE(contains(refusal(j), "\"n_lyer\""));
}

TEST(ConfigJson, IntegerFieldsMustBeIntegers) {
  for (const json& v : {json(2.7), json("four"), json::array({4}), json(true), json(nullptr), json::object()}) {
    json j = tiny_json();
    j["n_layer"] = v;
    std::string m = refusal(j, "model config file x.json");
    EXPECT_TRUE(contains(m, "x.json")) << m;
    EXPECT_TRUE(contains(m, "\"n_layer\"")) << m;
    EXPECT_FALSE(contains(m, "type_error")) << m;
  }
}

TEST(ConfigJson, RangesAreStatedInFull) {
  const std::string max = "2147483647";
  for (const json& v : {json(1e30), json(2147483648LL), json(0), json(-3), json(18446744073709551615ULL)}) {
    json j = tiny_json();
    j["n_embd"] = v;
    std::string m = refusal(j);
    EXPECT_TRUE(contains(m, "\"n_embd\"")) << m;
    EXPECT_TRUE(contains(m, max)) << m;  // not only "at least 1"
  }
  json j = tiny_json();
  j["vocab_size"] = 1;
  EXPECT_TRUE(contains(refusal(j), "vocab_size"));
  j = tiny_json();
  j["n_layer"] = 2147483647;  // the largest accepted; memory is the trainer's check
  EXPECT_EQ(model::GPTConfig::from_json(j).n_layer, 2147483647);
}

TEST(ConfigJson, CrossFieldRulesNameTheJsonFields) {
  json j = tiny_json();
  j["seq"] = 128;  // longer than block_size 64
  std::string m = refusal(j);
  EXPECT_TRUE(contains(m, "\"seq\"")) << m;
  EXPECT_TRUE(contains(m, "block_size")) << m;
  EXPECT_FALSE(contains(m, "--seq")) << m;
  j = tiny_json();
  j["n_head"] = 3;
  m = refusal(j);
  EXPECT_TRUE(contains(m, "n_head")) << m;
  j = tiny_json();
  j["name"] = 7;
  EXPECT_TRUE(contains(refusal(j), "\"name\""));
  EXPECT_TRUE(contains(refusal(json::array({1, 2})), "object"));
}

TEST(ConfigFile, ProblemsNameTheFile) {
  meshtrain::testing::TempDir dir("config");
  auto refusal_of = [](const std::string& path) -> std::string {
    try {
      model::gpt_config_from_file(path);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    ADD_FAILURE() << "accepted " << path;
    return "";
  };
  const std::string malformed = dir.file("malformed.json");
  std::ofstream(malformed) << "{\"n_layer\": 4,\n  \"n_embd\" 128}";
  std::string m = refusal_of(malformed);
  EXPECT_TRUE(contains(m, malformed)) << m;
  EXPECT_TRUE(contains(m, "line 2")) << m;
  EXPECT_FALSE(contains(m, "json.exception")) << m;
  const std::string blank = dir.file("blank.json");
  std::ofstream(blank) << "  \n";
  EXPECT_TRUE(contains(refusal_of(blank), blank));
  EXPECT_TRUE(contains(refusal_of(dir.file("missing.json")), "missing.json"));
  EXPECT_TRUE(contains(refusal_of(dir.path().string()), "directory"));
  const std::string unknown = dir.file("unknown.json");
  json j = tiny_json();
  j["n_lyer"] = 4;
  std::ofstream(unknown) << j.dump();
  m = refusal_of(unknown);
  EXPECT_TRUE(contains(m, unknown)) << m;
  EXPECT_TRUE(contains(m, "n_lyer")) << m;
  const std::string good = dir.file("good.json");
  std::ofstream(good) << tiny_json().dump();
  EXPECT_EQ(model::gpt_config_from_file(good).n_embd, 128);
}

TEST(ConfigJson, SkipConnectionFields) {
  json j = tiny_json();
  j["skip_from"] = 0, j["skip_to"] = 3;
  model::GPTConfig c = model::GPTConfig::from_json(j);
  EXPECT_TRUE(c.has_skip());
  EXPECT_EQ(c.skip_from, 0);
  EXPECT_EQ(c.skip_to, 3);
  EXPECT_EQ(model::GPTConfig::from_json(c.to_json()).to_json(), c.to_json());
  EXPECT_FALSE(model::GPTConfig::from_json(tiny_json()).to_json().contains("skip_from")) << "absent: no skip";
  json one = tiny_json();
  one["skip_from"] = 0;
  EXPECT_TRUE(contains(refusal(one), "both skip_from and skip_to"));
  json adjacent = tiny_json();
  adjacent["skip_from"] = 1, adjacent["skip_to"] = 2;  // jumps over nothing
  EXPECT_TRUE(contains(refusal(adjacent), "skip_from + 1 < skip_to < n_layer"));
  json outside = tiny_json();
  outside["skip_from"] = 0, outside["skip_to"] = 4;
  EXPECT_TRUE(contains(refusal(outside), "skip_from + 1 < skip_to < n_layer"));
  json negative = tiny_json();
  negative["skip_from"] = -1, negative["skip_to"] = 2;
  EXPECT_TRUE(contains(refusal(negative), "\"skip_from\""));
}
