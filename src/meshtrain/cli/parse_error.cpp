// The parser's refusals (CLI11's ParseError) as the program's one sentence: shared by main()
// and the in-process runner (cli/in_process.h), so that the Python module raises exactly what
// the program prints.
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/cli/commands.h"

namespace meshtrain::cli {

namespace {

// The words after "...: " in a parser message, split at spaces.
std::vector<std::string> listed(const std::string& m) {
  std::vector<std::string> out;
  const auto colon = m.find(": ");
  if (colon == std::string::npos) return out;
  std::string rest = m.substr(colon + 2), w;
  for (char c : rest + " ") {
    if (c == ' ') {
      if (!w.empty()) out.push_back(w);
      w.clear();
    } else {
      w += c;
    }
  }
  return out;
}

}  // namespace

// The subcommand being parsed when the parser refused ("train", "checkpoint convert"; "" for
// the program itself) and its App.
std::pair<std::string, const CLI::App*> parsed_command(const CLI::App& app) {
  const CLI::App* cur = &app;
  std::string path;
  while (!cur->get_subcommands().empty()) {
    cur = cur->get_subcommands().front();
    path += (path.empty() ? "" : " ") + cur->get_name();
  }
  return {path, cur};
}

// The parser's refusal as the project's one sentence: what is wrong and what to change.
std::string describe_parse_error(const CLI::ParseError& e, const CLI::App& app) {
  const auto [cmd, sub] = parsed_command(app);
  const std::string full = cmd.empty() ? "meshtrain" : "meshtrain " + cmd;
  const std::string help = "see `" + full + " --help`";
  const std::string m = e.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    // The words that look like flags are what to name; values left over (CLI11 lists them too,
    // in no fixed order) only when there is no flag among them.
    std::vector<std::string> flags, words;
    for (const std::string& x : listed(m)) (x.rfind("-", 0) == 0 ? flags : words).push_back(x);
    std::string list;
    for (const std::string& x : flags) list += (list.empty() ? "" : ", ") + x;
    if (cmd == "launch" && !flags.empty())
      return "launch reads its own options, then the job after `--`: give `meshtrain launch [options] -- train "
             "ARGS...` (" + list + (flags.size() == 1 ? " is not an option" : " are not options") + " of launch)";
    if (flags.empty())
      return "`" + full + "` takes no argument '" + (words.empty() ? std::string() : words.front()) + "' there; " + help;
    return list + (flags.size() == 1 ? " is not an option" : " are not options") + " of `" + full + "`; " + help +
           " for the ones it takes";
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) {
    const std::string flag = m.substr(0, m.find(':'));
    const auto got = m.find("required but received ");
    if (got != std::string::npos)
      return flag + " is given " + m.substr(got + 22) + " times; give it once";
    return flag + " needs a value; give one or leave the flag out (" + help + ")";
  }
  if (dynamic_cast<const CLI::ConversionError*>(&e)) {
    // "Could not convert: --lr = abc"
    const auto colon = m.find(": "), eq = m.find(" = ");
    if (colon != std::string::npos && eq != std::string::npos && eq > colon) {
      const std::string flag = m.substr(colon + 2, eq - colon - 2), value = m.substr(eq + 3);
      std::string want = "a value it takes";
      if (const CLI::Option* o = sub->get_option_no_throw(flag)) {
        const std::string type = o->get_type_name();
        if (type == "FLOAT") want = "a number";
        else if (type == "INT" || type == "UINT") want = "a whole number";
      }
      return flag + ": '" + value + "' is not " + want + "; " + help;
    }
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e)) {
    if (m.find("subcommand is required") != std::string::npos) {
      std::string names;
      for (const CLI::App* s : sub->get_subcommands([](const CLI::App*) { return true; }))
        names += (names.empty() ? "" : ", ") + s->get_name();
      return "`" + full + "` needs a subcommand: one of " + names + "; " + help;
    }
    const auto is = m.find(" is required");
    if (is != std::string::npos)
      return "`" + full + "` needs " + m.substr(0, is) + "; " + help;
  }
  // A value a check refused: the check's own sentence says what to give.
  if (dynamic_cast<const CLI::ValidationError*>(&e)) return m;
  std::string out = m;
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out + "; " + help;
}

}  // namespace meshtrain::cli
