// The SVG swimlane writer, read back with libxml2: the picture must be well-formed XML, hold
// one block per compute action on the right lane with its micro-batch written on it, a legend
// entry per kind drawn (in the blocks' own colour), and a time axis whose ticks increase and
// map time to x linearly, consistently with the blocks.
#include <gtest/gtest.h>

#include <libxml/parser.h>
#include <libxml/tree.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/pipeline/passes.h"
#include "meshtrain/pipeline/schedule.h"
#include "meshtrain/pipeline/simulate.h"
#include "meshtrain/pipeline/svg.h"
#include "temp_dir.h"

namespace mp = meshtrain::pipeline;

namespace {

// ---- a small DOM over libxml2 ----

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string text;  // the element's own text nodes, concatenated
  std::vector<Element> children;

  std::string attr(const std::string& key) const {
    auto it = attrs.find(key);
    return it == attrs.end() ? std::string() : it->second;
  }
  double num(const std::string& key) const { return std::stod(attr(key)); }
  const Element* child(const std::string& tag) const {
    for (const Element& c : children)
      if (c.name == tag) return &c;
    return nullptr;
  }
};

Element convert(xmlNodePtr node) {
  Element e;
  e.name = reinterpret_cast<const char*>(node->name);
  for (xmlAttrPtr a = node->properties; a; a = a->next) {
    xmlChar* v = xmlNodeListGetString(node->doc, a->children, 1);
    e.attrs[reinterpret_cast<const char*>(a->name)] = v ? reinterpret_cast<const char*>(v) : "";
    xmlFree(v);
  }
  for (xmlNodePtr c = node->children; c; c = c->next) {
    if (c->type == XML_ELEMENT_NODE) e.children.push_back(convert(c));
    else if (c->type == XML_TEXT_NODE && c->content) e.text += reinterpret_cast<const char*>(c->content);
  }
  return e;
}

// Parses the SVG; fails the test (and returns an empty root) when it is not well-formed XML.
Element parse(const std::string& svg) {
  std::unique_ptr<xmlDoc, void (*)(xmlDocPtr)> doc(
      xmlReadMemory(svg.data(), static_cast<int>(svg.size()), "swimlane.svg", nullptr,
                    XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING),
      xmlFreeDoc);
  EXPECT_TRUE(doc != nullptr) << "not well-formed XML:\n" << svg;
  if (!doc) return {};
  return convert(xmlDocGetRootElement(doc.get()));
}

// Every element below `e` (depth first, document order) whose class attribute is `cls`.
void find_class(const Element& e, const std::string& cls, std::vector<const Element*>& out) {
  for (const Element& c : e.children) {
    if (c.attr("class") == cls) out.push_back(&c);
    find_class(c, cls, out);
  }
}
std::vector<const Element*> by_class(const Element& root, const std::string& cls) {
  std::vector<const Element*> out;
  find_class(root, cls, out);
  return out;
}

struct Case {
  const char* name;
  mp::ScheduleShape shape;
};

std::string label(const Case& c) {
  return std::string(c.name) + " pp=" + std::to_string(c.shape.pp) + " m=" + std::to_string(c.shape.microbatches) +
         " v=" + std::to_string(c.shape.chunks);
}

}  // namespace

// A simulated run of each schedule, drawn and read back.
TEST(PipelineSvg, SimulatedRunDrawsEveryActionWithLegendAndAxis) {
  for (const Case& c : {Case{"naive", {3, 2, 1}}, Case{"gpipe", {4, 8, 1}}, Case{"1f1b", {3, 5, 1}},
                        Case{"zb-h1", {3, 6, 1}}, Case{"interleaved", {2, 4, 2}}}) {
    SCOPED_TRACE(label(c));
    const mp::Schedule sched = mp::add_send_recv(mp::make_schedule(c.name, c.shape));
    const mp::Timeline t = mp::simulate(sched);
    ASSERT_FALSE(t.deadlock);
    const Element root = parse(mp::to_svg(mp::swimlane_of(sched, t, std::string("the ") + c.name + " title")));
    ASSERT_EQ(root.name, "svg");

    const auto titles = by_class(root, "title");
    ASSERT_EQ(titles.size(), 1u);
    EXPECT_EQ(titles[0]->text, std::string("the ") + c.name + " title");
    EXPECT_EQ(by_class(root, "lane-name").size(), static_cast<std::size_t>(c.shape.pp));

    // Per lane, the (kind, label) pairs drawn equal the schedule's compute actions.
    std::vector<std::multiset<std::pair<std::string, std::string>>> expected(c.shape.pp), drawn(c.shape.pp);
    std::set<std::string> kinds;
    for (int r = 0; r < c.shape.pp; ++r)
      for (const mp::Action& a : sched.ranks[r])
        if (mp::is_compute(a.kind)) {
          std::string text = std::to_string(a.microbatch);
          if (c.shape.chunks > 1) text += "c" + std::to_string(a.chunk);
          expected[r].insert({mp::to_string(a.kind), text});
          kinds.insert(mp::to_string(a.kind));
        }
    std::map<std::string, std::string> fill_of_kind;
    std::vector<std::vector<std::pair<double, double>>> spans(c.shape.pp);  // rect x, x + width per lane
    for (const Element* b : by_class(root, "block")) {
      const int lane = std::stoi(b->attr("data-lane"));
      ASSERT_GE(lane, 0);
      ASSERT_LT(lane, c.shape.pp);
      const Element* rect = b->child("rect");
      const Element* text = b->child("text");
      ASSERT_NE(rect, nullptr);
      ASSERT_NE(text, nullptr) << "a block without its label";
      drawn[lane].insert({b->attr("data-kind"), text->text});
      spans[lane].push_back({rect->num("x"), rect->num("x") + rect->num("width")});
      const std::string fill = rect->attr("fill");
      EXPECT_EQ(fill_of_kind.emplace(b->attr("data-kind"), fill).first->second, fill) << "blocks of kind " << b->attr("data-kind") << " in two colours";
    }
    for (int r = 0; r < c.shape.pp; ++r) {
      EXPECT_EQ(drawn[r], expected[r]) << "rank " << r;
      std::sort(spans[r].begin(), spans[r].end());
      for (std::size_t i = 1; i < spans[r].size(); ++i)
        EXPECT_LE(spans[r][i - 1].second, spans[r][i].first + 0.02) << "overlapping blocks on rank " << r;
    }
    std::set<std::string> fills;
    for (const auto& [kind, fill] : fill_of_kind) fills.insert(fill);
    EXPECT_EQ(fills.size(), fill_of_kind.size()) << "two kinds share a colour";

    // The legend names every kind drawn, and only those, in the blocks' colours.
    std::set<std::string> legend_kinds;
    for (const Element* e : by_class(root, "legend-entry")) {
      const std::string kind = e->attr("data-kind");
      legend_kinds.insert(kind);
      ASSERT_NE(e->child("rect"), nullptr);
      ASSERT_NE(e->child("text"), nullptr);
      EXPECT_EQ(e->child("rect")->attr("fill"), fill_of_kind[kind]) << kind;
      EXPECT_EQ(e->child("text")->text, kind + " " + mp::kind_name(kind));
      EXPECT_NE(mp::kind_name(kind), kind) << "a known kind without its name";
    }
    EXPECT_EQ(legend_kinds, kinds);

    // The axis: labelled ticks, increasing in value and in x, x linear in the value, reaching
    // past the step; the last action ends where the axis puts the makespan.
    std::vector<double> values, xs;
    for (const Element* e : by_class(root, "tick-label")) values.push_back(std::stod(e->text)), xs.push_back(e->num("x"));
    ASSERT_GE(values.size(), 2u);
    for (std::size_t i = 1; i < values.size(); ++i) {
      EXPECT_GT(values[i], values[i - 1]);
      EXPECT_GT(xs[i], xs[i - 1]);
    }
    EXPECT_EQ(values.front(), 0);
    EXPECT_GE(values.back(), t.makespan);
    const double scale = (xs.back() - xs.front()) / (values.back() - values.front());
    for (std::size_t i = 0; i < values.size(); ++i)
      EXPECT_NEAR(xs[i], xs.front() + (values[i] - values.front()) * scale, 0.02);
    double right = 0;
    for (const auto& lane : spans)
      for (const auto& s : lane) right = std::max(right, s.second);
    EXPECT_NEAR(right, xs.front() + t.makespan * scale, 0.05);
    ASSERT_EQ(by_class(root, "axis-caption").size(), 1u);
  }
}

// Kinds other than the pipeline's get palette colours after the known ones in the legend;
// text is escaped; boundaries are drawn; the axis begins at `start`.
TEST(PipelineSvg, OtherKindsEscapingBoundariesAndStart) {
  mp::Swimlane s;
  s.title = "a <measured> step & more";
  s.lanes = {"rank <0>", "rank 1"};
  s.start = 100;
  s.blocks = {{0, 100, 130, "optimizer", "opt", ""},
              {0, 130, 160, "F", "a&b", "tip 'quoted'"},
              {1, 110, 150, "allreduce", "ar", ""},
              {1, 150, 170, "B", "0", ""}};
  s.boundaries = {100, 170};
  const Element root = parse(mp::to_svg(s));
  ASSERT_EQ(root.name, "svg");
  EXPECT_EQ(by_class(root, "title")[0]->text, s.title);
  EXPECT_EQ(by_class(root, "lane-name")[0]->text, "rank <0>");
  std::vector<std::string> legend;
  for (const Element* e : by_class(root, "legend-entry")) legend.push_back(e->attr("data-kind"));
  EXPECT_EQ(legend, (std::vector<std::string>{"F", "B", "optimizer", "allreduce"}));
  std::multiset<std::string> labels;
  for (const Element* b : by_class(root, "block")) labels.insert(b->child("text")->text);
  EXPECT_EQ(labels, (std::multiset<std::string>{"opt", "a&b", "ar", "0"}));
  EXPECT_EQ(by_class(root, "boundary").size(), 2u);
  std::vector<double> ticks;
  for (const Element* e : by_class(root, "tick-label")) ticks.push_back(std::stod(e->text));
  ASSERT_GE(ticks.size(), 2u);
  EXPECT_GE(ticks.front(), 100);
  EXPECT_GE(ticks.back(), 170);
  EXPECT_TRUE(std::is_sorted(ticks.begin(), ticks.end()));
}

TEST(PipelineSvg, AxisTicksAreRoundIncreasingAndCoverTheRange) {
  for (auto [lo, hi] : std::vector<std::pair<double, double>>{
           {0, 33}, {0, 1}, {0.1, 0.37}, {120.5, 987.2}, {0, 1e6}, {5, 5}, {0, 7.5}, {-3, 4}}) {
    SCOPED_TRACE(std::to_string(lo) + " .. " + std::to_string(hi));
    const std::vector<double> t = mp::axis_ticks(lo, hi);
    ASSERT_GE(t.size(), 2u);
    EXPECT_LE(t.size(), 22u);
    const double step = t[1] - t[0];
    EXPECT_LE(t.front(), lo + 1e-9 * step);
    EXPECT_GE(t.back(), hi - 1e-9 * step);
    const double mant = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    EXPECT_TRUE(std::abs(mant - 1) < 1e-6 || std::abs(mant - 2) < 1e-6 || std::abs(mant - 5) < 1e-6) << step;
    for (std::size_t i = 1; i < t.size(); ++i) EXPECT_NEAR(t[i] - t[i - 1], step, 1e-9 * std::max(1.0, step));
  }
}

TEST(PipelineSvg, RefusesBlocksOutsideTheLanesOrBackwardsInTime) {
  mp::Swimlane s;
  s.lanes = {"rank 0"};
  s.blocks = {{1, 0, 1, "F", "0", ""}};
  EXPECT_THROW(mp::to_svg(s), std::invalid_argument);
  s.blocks = {{0, 2, 1, "F", "0", ""}};
  EXPECT_THROW(mp::to_svg(s), std::invalid_argument);
}

TEST(PipelineSvg, WritesTheFileOrNamesThePath) {
  meshtrain::testing::TempDir dir("svg");
  const mp::Schedule sched = mp::add_send_recv(mp::make_schedule("1f1b", {2, 3, 1}));
  const mp::Swimlane s = mp::swimlane_of(sched, mp::simulate(sched), "1f1b");
  const std::string path = dir.file("lane.svg");
  mp::write_svg(s, path);
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_EQ(text.str(), mp::to_svg(s));
  const std::string missing = dir.file("no/such/dir/lane.svg");
  try {
    mp::write_svg(s, missing);
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}
