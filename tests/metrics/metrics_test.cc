// The Prometheus registry and its text format: names, escaping, histograms, collectors.

#include "metrics/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "testing/prometheus_text.h"

namespace minions::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsTest, ACounterRendersWithHelpTypeAndValue) {
  Registry registry;
  Counter* c = registry.AddCounter("minions_things_total", "Things done.");
  c->Increment();
  c->Increment(2.5);
  c->Increment(-7);  // a counter never goes down
  EXPECT_EQ(registry.Render(),
            "# HELP minions_things_total Things done.\n"
            "# TYPE minions_things_total counter\n"
            "minions_things_total 3.5\n");
}

TEST(MetricsTest, LabelValuesAndHelpAreEscaped) {
  Registry registry;
  auto* family = registry.AddGaugeFamily("minions_weird", "Help with a \\ backslash\nand a newline.", {"team"});
  family->With({"a \"quoted\" \\ team\nline2"})->Set(1);
  std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# HELP minions_weird Help with a \\\\ backslash\\nand a newline.\n"));
  EXPECT_THAT(text, HasSubstr("minions_weird{team=\"a \\\"quoted\\\" \\\\ team\\nline2\"} 1\n"));
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithSumCountAndInf) {
  Registry registry;
  Histogram* h = registry.AddHistogram("minions_wait_seconds", "Waits.", {0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 3.0, 100.0}) h->Observe(v);
  auto samples = minions::testing::ParsePrometheusSamples(registry.Render());
  EXPECT_EQ(samples["minions_wait_seconds_bucket{le=\"0.1\"}"], 2);  // le is inclusive
  EXPECT_EQ(samples["minions_wait_seconds_bucket{le=\"1\"}"], 3);
  EXPECT_EQ(samples["minions_wait_seconds_bucket{le=\"10\"}"], 4);
  EXPECT_EQ(samples.count("minions_wait_seconds_bucket{le=\"+Inf\"}"), 1u);
  EXPECT_EQ(samples["minions_wait_seconds_bucket{le=\"+Inf\"}"], 5);
  EXPECT_EQ(samples["minions_wait_seconds_count"], 5);
  EXPECT_DOUBLE_EQ(samples["minions_wait_seconds_sum"], 103.65);
  EXPECT_THAT(registry.Render(), HasSubstr("# TYPE minions_wait_seconds histogram\n"));
}

TEST(MetricsTest, LabelledHistogramsPutLeLast) {
  Registry registry;
  auto* family = registry.AddHistogramFamily("minions_d_seconds", "D.", {"team"}, {1});
  family->With({"ml"})->Observe(0.5);
  std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("minions_d_seconds_bucket{team=\"ml\",le=\"1\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("minions_d_seconds_sum{team=\"ml\"} 0.5\n"));
}

TEST(MetricsTest, ValuesAreWrittenTheWayPrometheusReadsThem) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(42), "42");
  EXPECT_EQ(FormatValue(-3), "-3");
  EXPECT_EQ(FormatValue(0.05), "0.05");
  EXPECT_EQ(FormatValue(1e300), "1e+300");
  EXPECT_EQ(FormatValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatValue(0.0 / 0.0), "NaN");
  EXPECT_EQ(std::stod(FormatValue(0.1 + 0.2)), 0.1 + 0.2);  // round-trips
}

TEST(MetricsTest, NamesFollowPrometheusRules) {
  EXPECT_TRUE(IsValidMetricName("minions_jobs"));
  EXPECT_TRUE(IsValidMetricName("a:b_c9"));
  EXPECT_FALSE(IsValidMetricName("9lives"));
  EXPECT_FALSE(IsValidMetricName("has-dash"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_TRUE(IsValidLabelName("team"));
  EXPECT_FALSE(IsValidLabelName("__reserved"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
}

TEST(MetricsDeathTest, ConventionsAreEnforcedAtRegistration) {
  EXPECT_DEATH({ Registry r; r.AddCounter("minions_things", "no _total"); }, "must end in _total");
  EXPECT_DEATH({ Registry r; r.AddGauge("minions_things_total", "a gauge"); }, "only counters end in _total");
  EXPECT_DEATH({ Registry r; r.AddGaugeFamily("minions_x", "x", {"le"}); }, "invalid label name");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddGauge("minions_x", "x");
        r.AddGauge("minions_x", "x");
      },
      "registered twice");
}

TEST(MetricsTest, CollectorsAddFamiliesAtScrapeTime) {
  Registry registry;
  int scrapes = 0;
  registry.AddCollector([&](std::vector<FamilySnapshot>* out) {
    ++scrapes;
    out->push_back({"minions_now", "Computed.", MetricType::kGauge, {{"minions_now", {{"k", "v"}}, double(scrapes)}}});
  });
  EXPECT_THAT(registry.Render(), HasSubstr("minions_now{k=\"v\"} 1\n"));
  EXPECT_THAT(registry.Render(), HasSubstr("minions_now{k=\"v\"} 2\n"));
}

TEST(MetricsTest, ConcurrentIncrementsAreAllCounted) {
  Registry registry;
  Counter* c = registry.AddCounter("minions_n_total", "n");
  auto* family = registry.AddCounterFamily("minions_m_total", "m", {"k"});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c->Increment();
        family->With({std::to_string(i % 3)})->Increment();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->value(), 40000);
  auto samples = minions::testing::ParsePrometheusSamples(registry.Render());
  EXPECT_EQ(samples["minions_m_total{k=\"0\"}"] + samples["minions_m_total{k=\"1\"}"] + samples["minions_m_total{k=\"2\"}"],
            40000);
  EXPECT_THAT(registry.Render(), Not(HasSubstr("minions_m_total{k=\"3\"}")));
}

}  // namespace
}  // namespace minions::metrics
