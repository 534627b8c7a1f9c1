#pragma once
// Prometheus metrics for one process: counters, gauges and histograms, with or without labels,
// and collectors that compute samples at scrape time (gauges read from the store). Registry
// renders them all in the Prometheus text exposition format (version 0.0.4).
//
// Conventions enforced at registration (a violation is a programming error and aborts at start):
// names match [a-zA-Z_:][a-zA-Z0-9_:]*, counters end in `_total`, and label names are valid and
// never `le` (reserved for histogram buckets). Values are in base units (seconds, bytes).
//
// Ownership: the Registry owns every metric it hands out; pointers stay valid for its lifetime.
// Threads: everything is thread-safe. Increment/Set/Observe are lock-free (counters, gauges) or
// take a short per-histogram lock; Render may run while other threads update.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace minions::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// One sample line: `name{labels} value`. `name` is the full sample name (a histogram's samples end
// in _bucket, _sum and _count).
struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

// Everything rendered under one `# HELP` / `# TYPE` header.
struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<Sample> samples;
};

// The text format: HELP (escaped), TYPE, then the samples with escaped label values.
std::string EncodeText(const std::vector<FamilySnapshot>& families);
// A sample value as Prometheus writes it: integers without exponent, +Inf, -Inf, NaN.
std::string FormatValue(double value);
bool IsValidMetricName(std::string_view name);
bool IsValidLabelName(std::string_view name);

class Counter {
 public:
  // `by` must be >= 0 (a counter only goes up); negative increments are ignored.
  void Increment(double by = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double by);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: the upper bounds of the buckets, ascending; +Inf is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket (not cumulative), last is +Inf
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

// Buckets for durations from `start` seconds, each `factor` times the last.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// A metric with labels: one child per distinct tuple of label values, made on first use.
template <typename M>
class Family {
 public:
  Family(std::vector<std::string> label_names, std::function<std::unique_ptr<M>()> make)
      : label_names_(std::move(label_names)), make_(std::move(make)) {}
  // The child for these values (as many as label names; missing ones are empty).
  M* With(std::vector<std::string> values) {
    values.resize(label_names_.size());
    absl::MutexLock lock(&mu_);
    auto& child = children_[values];
    if (!child) child = make_();
    return child.get();
  }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Calls `f(values, metric)` for every child, in label order.
  void ForEach(const std::function<void(const std::vector<std::string>&, const M&)>& f) const {
    absl::MutexLock lock(&mu_);
    for (const auto& [values, child] : children_) f(values, *child);
  }

 private:
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<M>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<M>> children_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  Counter* AddCounter(const std::string& name, const std::string& help);
  Family<Counter>* AddCounterFamily(const std::string& name, const std::string& help,
                                    std::vector<std::string> label_names);
  Gauge* AddGauge(const std::string& name, const std::string& help);
  Family<Gauge>* AddGaugeFamily(const std::string& name, const std::string& help,
                                std::vector<std::string> label_names);
  Histogram* AddHistogram(const std::string& name, const std::string& help, std::vector<double> bounds);
  Family<Histogram>* AddHistogramFamily(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names, std::vector<double> bounds);

  // A collector appends families computed at scrape time (e.g. gauges read from a database).
  // It runs on the scraping thread, once per Render.
  using Collector = std::function<void(std::vector<FamilySnapshot>* out)>;
  void AddCollector(Collector collector);

  std::vector<FamilySnapshot> Collect() const;
  std::string Render() const { return EncodeText(Collect()); }

 private:
  struct Entry {
    std::string name;
    std::string help;
    MetricType type;
    std::unique_ptr<Family<Counter>> counters;
    std::unique_ptr<Family<Gauge>> gauges;
    std::unique_ptr<Family<Histogram>> histograms;
  };
  Entry& Add(const std::string& name, const std::string& help, MetricType type,
             const std::vector<std::string>& label_names);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);  // registration order
  std::vector<Collector> collectors_ ABSL_GUARDED_BY(mu_);
};

// The content type of EncodeText's output.
inline constexpr const char* kTextContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace minions::metrics
