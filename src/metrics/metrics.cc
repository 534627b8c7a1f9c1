#include "metrics/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"

namespace minions::metrics {
namespace {

// Registration errors are bugs in the program, found the first time it starts: abort loudly.
[[noreturn]] void Die(const std::string& why) {
  fprintf(stderr, "metrics: %s\n", why.c_str());
  std::abort();
}

void EscapeInto(std::string_view text, bool quote, std::string* out) {
  for (char c : text) {
    if (c == '\\') {
      *out += "\\\\";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (quote && c == '"') {
      *out += "\\\"";
    } else {
      *out += c;
    }
  }
}

constexpr const char* kTypeNames[] = {"counter", "gauge", "histogram"};
static_assert(std::size(kTypeNames) == static_cast<size_t>(MetricType::kHistogram) + 1);

std::string_view TypeName(MetricType type) { return NameIn(kTypeNames, type, "untyped"); }

std::vector<std::pair<std::string, std::string>> Zip(const std::vector<std::string>& names,
                                                     const std::vector<std::string>& values) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < names.size(); ++i) out.emplace_back(names[i], values[i]);
  return out;
}

}  // namespace

bool IsValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool IsValidLabelName(std::string_view name) {
  if (name.empty() || name.find(':') != std::string_view::npos || name.substr(0, 2) == "__") return false;
  return IsValidMetricName(name);
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integers (counts, bytes) exactly; others with enough digits to round-trip.
  if (value == std::floor(value) && std::fabs(value) < 1e15) return absl::StrCat(static_cast<int64_t>(value));
  // The shortest form that reads back as the same double (0.05, not 0.050000000000000003).
  char buf[32];
  for (int precision = 15; precision <= 17; ++precision) {
    snprintf(buf, sizeof(buf), "%.*g", precision, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  return buf;
}

std::string EncodeText(const std::vector<FamilySnapshot>& families) {
  std::string out;
  for (const FamilySnapshot& f : families) {
    out += "# HELP ";
    out += f.name;
    out += ' ';
    EscapeInto(f.help, /*quote=*/false, &out);
    out += "\n# TYPE ";
    out += f.name;
    out += ' ';
    out += TypeName(f.type);
    out += '\n';
    for (const Sample& s : f.samples) {
      out += s.name;
      if (!s.labels.empty()) {
        out += '{';
        for (size_t i = 0; i < s.labels.size(); ++i) {
          if (i) out += ',';
          out += s.labels[i].first;
          out += "=\"";
          EscapeInto(s.labels[i].second, /*quote=*/true, &out);
          out += '"';
        }
        out += '}';
      }
      out += ' ';
      out += FormatValue(s.value);
      out += '\n';
    }
  }
  return out;
}

void Counter::Increment(double by) {
  if (!(by >= 0)) return;
  value_.fetch_add(by, std::memory_order_relaxed);
}

void Gauge::Add(double by) { value_.fetch_add(by, std::memory_order_relaxed); }

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  for (size_t i = 1; i < bounds_.size(); ++i) {
    if (!(bounds_[i] > bounds_[i - 1])) Die("histogram bucket bounds must ascend");
  }
}

void Histogram::Observe(double value) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  absl::MutexLock lock(&mu_);
  counts_[bucket] += 1;
  sum_ += value;
  count_ += 1;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  absl::MutexLock lock(&mu_);
  uint64_t running = 0;
  for (uint64_t c : counts_) {
    running += c;
    s.cumulative.push_back(running);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  for (int i = 0; i < count; ++i, start *= factor) out.push_back(start);
  return out;
}

Registry::Entry& Registry::Add(const std::string& name, const std::string& help, MetricType type,
                               const std::vector<std::string>& label_names) {
  if (!IsValidMetricName(name)) Die(absl::StrCat("invalid metric name '", name, "'"));
  bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
  if (type == MetricType::kCounter && !total) Die(absl::StrCat("counter '", name, "' must end in _total"));
  if (type != MetricType::kCounter && total) Die(absl::StrCat("only counters end in _total: '", name, "'"));
  for (const auto& label : label_names) {
    if (!IsValidLabelName(label) || label == "le") Die(absl::StrCat("invalid label name '", label, "' on ", name));
  }
  absl::MutexLock lock(&mu_);
  for (const auto& e : entries_) {
    if (e->name == name) Die(absl::StrCat("metric '", name, "' registered twice"));
  }
  entries_.push_back(std::make_unique<Entry>(Entry{name, help, type, nullptr, nullptr, nullptr}));
  return *entries_.back();
}

Family<Counter>* Registry::AddCounterFamily(const std::string& name, const std::string& help,
                                            std::vector<std::string> label_names) {
  Entry& e = Add(name, help, MetricType::kCounter, label_names);
  e.counters = std::make_unique<Family<Counter>>(std::move(label_names), [] { return std::make_unique<Counter>(); });
  return e.counters.get();
}

Counter* Registry::AddCounter(const std::string& name, const std::string& help) {
  return AddCounterFamily(name, help, {})->With({});
}

Family<Gauge>* Registry::AddGaugeFamily(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names) {
  Entry& e = Add(name, help, MetricType::kGauge, label_names);
  e.gauges = std::make_unique<Family<Gauge>>(std::move(label_names), [] { return std::make_unique<Gauge>(); });
  return e.gauges.get();
}

Gauge* Registry::AddGauge(const std::string& name, const std::string& help) {
  return AddGaugeFamily(name, help, {})->With({});
}

Family<Histogram>* Registry::AddHistogramFamily(const std::string& name, const std::string& help,
                                                std::vector<std::string> label_names, std::vector<double> bounds) {
  Entry& e = Add(name, help, MetricType::kHistogram, label_names);
  e.histograms = std::make_unique<Family<Histogram>>(
      std::move(label_names), [bounds] { return std::make_unique<Histogram>(bounds); });
  return e.histograms.get();
}

Histogram* Registry::AddHistogram(const std::string& name, const std::string& help, std::vector<double> bounds) {
  return AddHistogramFamily(name, help, {}, std::move(bounds))->With({});
}

void Registry::AddCollector(Collector collector) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collector));
}

std::vector<FamilySnapshot> Registry::Collect() const {
  std::vector<FamilySnapshot> out;
  std::vector<Collector> collectors;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& e : entries_) {
      FamilySnapshot f{e->name, e->help, e->type, {}};
      if (e->counters) {
        e->counters->ForEach([&](const std::vector<std::string>& values, const Counter& c) {
          f.samples.push_back({e->name, Zip(e->counters->label_names(), values), c.value()});
        });
      } else if (e->gauges) {
        e->gauges->ForEach([&](const std::vector<std::string>& values, const Gauge& g) {
          f.samples.push_back({e->name, Zip(e->gauges->label_names(), values), g.value()});
        });
      } else if (e->histograms) {
        e->histograms->ForEach([&](const std::vector<std::string>& values, const Histogram& h) {
          auto labels = Zip(e->histograms->label_names(), values);
          Histogram::Snapshot s = h.snapshot();
          for (size_t i = 0; i < s.cumulative.size(); ++i) {
            auto with_le = labels;
            with_le.emplace_back("le", i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf");
            f.samples.push_back({e->name + "_bucket", std::move(with_le), static_cast<double>(s.cumulative[i])});
          }
          f.samples.push_back({e->name + "_sum", labels, s.sum});
          f.samples.push_back({e->name + "_count", labels, static_cast<double>(s.count)});
        });
      }
      out.push_back(std::move(f));
    }
    collectors = collectors_;
  }
  // Outside the lock: a collector may be slow (a database query).
  for (const auto& c : collectors) c(&out);
  return out;
}

}  // namespace minions::metrics
