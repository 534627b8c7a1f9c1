// Observability end to end with real processes on loopback: a server and executors running the
// llama.cpp runner on the test model, scraped by a real Prometheus (Debian `prometheus`) and
// watched by a real browser (headless Chromium), while a job runs. What must be seen while the
// job runs is seen for sure: the test holds one of its tasks (testing/lease_holder.h) until it
// has, instead of hoping the job lasts longer than a scrape interval.

#include <curl/curl.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "cli/sample_prompts.h"
#include "common/json_util.h"
#include "cli/credentials.h"
#include "testing/http_get.h"
#include "testing/lease_holder.h"
#include "testing/process_pool.h"
#include "testing/read_file.h"

namespace minions::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::Gt;

const std::string kBin = MINIONS_TEST_BIN_DIR;
const std::string kModel = std::string(MINIONS_TEST_MODELS_DIR) + "/text.gguf";
const std::string kSource = MINIONS_SOURCE_DIR;
const std::string kArtifacts = MINIONS_TEST_ARTIFACTS_DIR;

std::string TempDir(const std::string& name) {
  return (fs::temp_directory_path() / absl::StrCat("minions-obs-", getpid(), "-", name)).string();
}

// A job of `records` sample prompts (two of them malformed), `shard_size` records per task.
absl::StatusOr<v1::Job> SubmitSample(ProcessPool& pool, int records, int64_t shard_size) {
  cli::SamplePromptOptions sample;
  sample.records = records;
  sample.max_tokens = 16;
  std::string input;
  for (const auto& line : cli::SamplePromptLines(sample)) input += line + "\n";
  v1::SubmitJobRequest request;
  request.set_input(input);
  request.set_model(kModel);
  request.set_shard_size(shard_size);
  request.set_team("research");
  return cli::JobsClient(pool.connection()).Submit(request);
}

v1::Job WaitForEnd(ProcessPool& pool, const std::string& job_id, absl::Duration timeout) {
  cli::JobsClient client(pool.connection());
  absl::Time deadline = absl::Now() + timeout;
  v1::Job job;
  while (absl::Now() < deadline) {
    auto now = client.Get(job_id);
    if (now.ok()) {
      job = *now;
      if (job.state() == "completed" || job.state() == "failed" || job.state() == "cancelled") return job;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  ADD_FAILURE() << "job " << job_id << " did not end; logs in " << pool.dir() << "/logs";
  return job;
}

// Each test's pool of processes in a fresh folder (dir_), allowed to run the test models; removed
// after a test that passed, kept for its logs after one that failed.
class Observability : public ::testing::Test {
 protected:
  void TearDown() override {
    pool_.reset();  // its processes stopped first
    if (!dir_.empty() && !HasFailure()) fs::remove_all(dir_);
  }
  // The test's pool, in TempDir(name) (a short name: the executors' sockets live below it).
  ProcessPool& NewPool(const std::string& name) {
    dir_ = TempDir(name);
    pool_ = std::make_unique<ProcessPool>(kBin + "/minions", dir_ + "/pool", 3000);
    pool_->AllowModels({MINIONS_TEST_MODELS_DIR});
    return *pool_;
  }
  // Starts the pool's server and makes the team "research", whose jobs the tests run.
  void StartServerAndTeam() {
    ASSERT_TRUE(pool_->StartServer().ok());
    ASSERT_TRUE(pool_->CreateTeam("research").ok());
  }

  // Starts tests/js/`script` under node with the dashboard's URL and then `args`, signed in with
  // `token`; its standard error goes to CheckLog(script).
  absl::StatusOr<std::unique_ptr<Subprocess>> StartCheck(const std::string& script,
                                                         const std::vector<std::string>& args,
                                                         const std::string& token) {
    Subprocess::Options sp;
    sp.argv = {"node", "--experimental-websocket", "--no-warnings", kSource + "/tests/js/" + script,
               absl::StrCat("http://", pool_->http_address(), "/")};
    sp.argv.insert(sp.argv.end(), args.begin(), args.end());
    sp.stderr_path = CheckLog(script);
    sp.extra_env = {"MINIONS_DASHBOARD_TOKEN=" + token};
    auto check = Subprocess::Start(sp);
    if (check.ok()) (*check)->CloseStdin();
    return check;
  }
  std::string CheckLog(const std::string& script) const {
    return dir_ + "/" + std::string(absl::StripSuffix(script, ".mjs")) + ".log";
  }
  // Runs `script` (StartCheck) to its end: the one JSON line it printed, in *seen. The test fails
  // unless it printed one and exited 0.
  void RunCheck(const std::string& script, const std::vector<std::string>& args, const std::string& token,
                Json* seen) {
    auto check = StartCheck(script, args, token);
    ASSERT_TRUE(check.ok()) << check.status();
    auto line = (*check)->ReadLine(absl::Minutes(3));
    ASSERT_TRUE(line.ok()) << ReadFile(CheckLog(script));
    auto parsed = ParseJson(*line);
    ASSERT_TRUE(parsed.ok()) << *line;
    *seen = *parsed;
    auto exit = (*check)->Wait(absl::Seconds(30));
    ASSERT_TRUE(exit.ok());
    EXPECT_TRUE(exit->exited && exit->code == 0) << exit->ToString();
  }

  std::string dir_;
  std::unique_ptr<ProcessPool> pool_;
};

// A real Prometheus with a temporary configuration and storage, scraping every second.
class PrometheusProcess {
 public:
  // `targets`: job name -> "host:port" addresses. `token_files`: job name -> a file holding the
  // bearer token Prometheus presents to that job's targets.
  static absl::StatusOr<std::unique_ptr<PrometheusProcess>> Start(
      const std::string& dir, const std::map<std::string, std::vector<std::string>>& targets,
      const std::map<std::string, std::string>& token_files = {}) {
    fs::create_directories(dir + "/data");
    std::string config =
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n";
    for (const auto& [job, addresses] : targets) {
      absl::StrAppend(&config, "  - job_name: ", job, "\n");
      if (auto token = token_files.find(job); token != token_files.end()) {
        absl::StrAppend(&config, "    authorization:\n      type: Bearer\n      credentials_file: ", token->second,
                        "\n");
      }
      absl::StrAppend(&config, "    static_configs:\n      - targets: [");
      for (size_t i = 0; i < addresses.size(); ++i) absl::StrAppend(&config, i ? ", " : "", "'", addresses[i], "'");
      absl::StrAppend(&config, "]\n");
    }
    std::ofstream(dir + "/prometheus.yml") << config;
    auto p = std::unique_ptr<PrometheusProcess>(new PrometheusProcess);
    p->address_ = absl::StrCat("127.0.0.1:", PickFreePort());
    Subprocess::Options sp;
    sp.argv = {"prometheus", "--config.file=" + dir + "/prometheus.yml", "--storage.tsdb.path=" + dir + "/data",
               "--web.listen-address=" + p->address_, "--log.level=warn"};
    sp.stderr_path = dir + "/prometheus.log";
    auto process = Subprocess::Start(sp);
    if (!process.ok()) return process.status();
    p->process_ = std::move(*process);
    p->process_->CloseStdin();
    for (int i = 0; i < 300; ++i) {
      if (HttpGet(absl::StrCat("http://", p->address_, "/-/ready"), 1000).status == 200) return p;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return absl::DeadlineExceededError("prometheus did not become ready; see " + dir + "/prometheus.log");
  }
  ~PrometheusProcess() {
    process_->Signal(SIGTERM);
    if (!process_->Wait(absl::Seconds(10)).ok()) process_->Signal(SIGKILL);
  }

  // The instant query API: {"status": ..., "data": {"resultType": ..., "result": [...]}}.
  Json Query(const std::string& promql) {
    char* escaped = curl_easy_escape(nullptr, promql.c_str(), static_cast<int>(promql.size()));
    std::string url = absl::StrCat("http://", address_, "/api/v1/query?query=", escaped);
    curl_free(escaped);
    HttpReply reply = HttpGet(url);
    auto json = ParseJson(reply.body);
    return json.ok() ? *json : Json{{"status", "unreachable"}, {"error", reply.body}};
  }
  // The single value of a query whose result is one sample; nullopt when it has none (yet).
  std::optional<double> Value(const std::string& promql) {
    Json r = Query(promql);
    const Json& result = r["data"]["result"];
    if (r["status"] != "success" || !result.is_array() || result.size() != 1) return std::nullopt;
    return std::stod(result[0]["value"][1].get<std::string>());
  }
  // Polls until `promql` has one value satisfying `ok`; returns the last value seen.
  std::optional<double> WaitFor(const std::string& promql, const std::function<bool(double)>& ok,
                                absl::Duration timeout = absl::Seconds(30)) {
    absl::Time deadline = absl::Now() + timeout;
    std::optional<double> v;
    while (absl::Now() < deadline) {
      v = Value(promql);
      if (v && ok(*v)) return v;
      absl::SleepFor(absl::Milliseconds(250));
    }
    return v;
  }

 private:
  PrometheusProcess() = default;
  std::string address_;
  std::unique_ptr<Subprocess> process_;
};

// Every PromQL expression in the provisioned Grafana dashboards.
std::vector<std::string> GrafanaQueries() {
  std::vector<std::string> exprs;
  std::function<void(const Json&)> walk = [&](const Json& node) {
    if (node.is_object()) {
      if (node.contains("expr") && node["expr"].is_string()) exprs.push_back(node["expr"].get<std::string>());
      for (const auto& [key, value] : node.items()) {
        if (key == "templating") continue;  // variables are checked apart: they hold label_values()
        walk(value);
      }
    } else if (node.is_array()) {
      for (const auto& item : node) walk(item);
    }
  };
  for (const auto& entry : fs::directory_iterator(kSource + "/deploy/grafana/dashboards")) {
    if (entry.path().extension() != ".json") continue;
    auto dashboard = ParseJson(ReadFile(entry.path().string()));
    EXPECT_TRUE(dashboard.ok()) << entry.path() << ": " << dashboard.status();
    if (dashboard.ok()) walk(*dashboard);
  }
  return exprs;
}

TEST_F(Observability, PrometheusScrapesAJobAndEveryGrafanaQueryUsesRealSeries) {
  ProcessPool& pool = NewPool("prometheus");
  ASSERT_NO_FATAL_FAILURE(StartServerAndTeam());
  std::vector<std::string> executor_metrics;
  for (int i = 0; i < 2; ++i) executor_metrics.push_back(absl::StrCat("127.0.0.1:", PickFreePort()));
  // Prometheus scrapes the server with a monitor token (the executors' ports are loopback-only).
  auto monitor = pool.IssueToken("monitor", "", "prometheus");
  ASSERT_TRUE(monitor.ok()) << monitor.status();
  const std::string monitor_file = dir_ + "/monitor-token";
  ASSERT_TRUE(cli::WriteTokenFile(monitor_file, *monitor).ok());
  const std::vector<std::string> bearer = {"Authorization: Bearer " + *monitor};
  auto prometheus = PrometheusProcess::Start(
      dir_ + "/prometheus", {{"minions-server", {pool.http_address()}}, {"minions-executor", executor_metrics}},
      {{"minions-server", monitor_file}});
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();
  PrometheusProcess& prom = **prometheus;
  ASSERT_EQ(prom.WaitFor("up{job=\"minions-server\"}", [](double v) { return v == 1; }), 1.0);

  // The job first, held (one of its tasks is the test's) and with no executor yet: Prometheus
  // sees the team's record counter at zero before any record is done, so rate() has a start.
  auto job = SubmitSample(pool, 120, 10);  // 12 tasks
  ASSERT_TRUE(job.ok()) << job.status();
  LeaseHolder holder(pool.connection());
  ASSERT_TRUE(holder.Hold().ok());
  ASSERT_EQ(prom.WaitFor("sum(minions_records_succeeded_total{team=\"research\"})", [](double v) { return v == 0; }),
            0.0);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(pool.StartExecutor(absl::StrCat("e", i + 1), 1, "", "", {"--metrics-listen", executor_metrics[i]}).ok());
  }
  ASSERT_EQ(prom.WaitFor("sum(up{job=\"minions-executor\"})", [](double v) { return v == 2; }), 2.0);
  // While it runs (it cannot end while held), Prometheus sees it running, and the executors working.
  EXPECT_EQ(prom.WaitFor("minions_jobs{state=\"running\"}", [](double v) { return v == 1; }), 1.0);
  EXPECT_THAT(prom.WaitFor(absl::StrCat("minions_job_records{job_id=\"", job->id(), "\",kind=\"total\"}"),
                           [](double v) { return v > 0; }),
              ::testing::Optional(120.0));
  EXPECT_THAT(prom.WaitFor(absl::StrCat("minions_job_records_per_second{job_id=\"", job->id(), "\"}"),
                           [](double v) { return v > 0; }),
              ::testing::Optional(Gt(0.0)));
  // A scrape while the job runs: the per-job series exist only until the job ends.
  std::string scraped = HttpGet("http://" + pool.http_address() + "/metrics", 10000, bearer).body;
  ASSERT_TRUE(holder.Release().ok());
  v1::Job done = WaitForEnd(pool, job->id(), absl::Minutes(5));
  ASSERT_EQ(done.state(), "completed") << done.error();

  // After the job: counters add up to what the job did.
  EXPECT_EQ(prom.WaitFor("sum(minions_records_succeeded_total{team=\"research\"})", [](double v) { return v == 118; }),
            118.0);
  EXPECT_EQ(prom.WaitFor("sum(minions_records_failed_total{team=\"research\"})", [](double v) { return v == 2; }), 2.0);
  EXPECT_THAT(prom.Value("sum(minions_leases_granted_total)"), ::testing::Optional(::testing::Ge(12.0)));
  EXPECT_THAT(prom.WaitFor("sum(minions_task_duration_seconds_count)", [](double v) { return v >= 12; }),
              ::testing::Optional(::testing::Ge(12.0)));
  EXPECT_EQ(prom.WaitFor("sum(minions_task_queue_wait_seconds_count)", [](double v) { return v == 12; }), 12.0);
  // Tasks took some time (how much is the benchmarks' business, not a test's).
  EXPECT_THAT(prom.Value("sum(minions_task_duration_seconds_sum)"), ::testing::Optional(Gt(0.0)));
  EXPECT_THAT(prom.Value("sum(minions_harvested_device_seconds_total{team=\"research\",device=\"cpu\"})"),
              ::testing::Optional(Gt(0.0)));
  // Records per second: the rate of the counter was above zero at some point of the job (a minute's
  // window holds the zero Prometheus saw before the job started and a later count). Waited for: the
  // subquery is evaluated at 5 s steps, so a job that ran within the last step shows only at the next.
  EXPECT_THAT(prom.WaitFor("max_over_time(sum(rate(minions_records_succeeded_total{team=\"research\"}[1m]))[15m:5s])",
                           [](double v) { return v > 0; }),
              ::testing::Optional(Gt(0.0)));
  EXPECT_EQ(prom.WaitFor("minions_jobs{state=\"completed\"}", [](double v) { return v == 1; }), 1.0);
  EXPECT_EQ(prom.Value("minions_jobs{state=\"running\"}"), 0.0);
  // The two executors, and the test's lease holder (until the watchdog finds it silent).
  EXPECT_EQ(prom.Value("sum(minions_executors{state=~\"available|busy\"})"), 3.0);
  EXPECT_EQ(prom.Value("minions_store_up"), 1.0);
  // The executors' own metrics: one state each, a runner with a model in memory.
  EXPECT_EQ(prom.WaitFor("sum(minions_executor_state)", [](double v) { return v == 2; }), 2.0);
  EXPECT_EQ(prom.WaitFor("count(minions_executor_runner_memory_bytes > 1e6)", [](double v) { return v == 2; }), 2.0);
  // (A scrape of the executors after their last completion: they are scraped apart from the server.)
  EXPECT_EQ(prom.WaitFor("sum(minions_executor_tasks_completed_total)", [](double v) { return v == 12; }), 12.0);

  // Grafana: every query parses and runs in Prometheus, and names only series a scrape has.
  scraped += HttpGet("http://" + pool.http_address() + "/metrics", 10000, bearer).body;
  for (const auto& e : executor_metrics) scraped += HttpGet("http://" + e + "/metrics").body;
  std::vector<std::string> queries = GrafanaQueries();
  EXPECT_GE(queries.size(), 15u) << "the dashboards hold fewer queries than expected";
  std::regex name_re("minions_[a-z0-9_]+");
  for (const std::string& expr : queries) {
    std::string promql = absl::StrReplaceAll(
        expr, {{"$__rate_interval", "5s"}, {"$__interval", "5s"}, {"$__range", "5m"}, {"$job_id", job->id()},
               {"$team", "research"}, {"$instance", ".*"}});
    Json result = prom.Query(promql);
    EXPECT_EQ(result["status"], "success") << expr << "\n" << DumpJson(result);
    for (auto it = std::sregex_iterator(expr.begin(), expr.end(), name_re); it != std::sregex_iterator(); ++it) {
      std::string name = it->str();
      bool present = scraped.find("\n" + name + "{") != std::string::npos ||
                     scraped.find("\n" + name + " ") != std::string::npos;
      EXPECT_TRUE(present) << "Grafana query uses " << name << ", which no scrape has: " << expr;
    }
  }
  // Variables (label_values(...)) too: every series named anywhere in a dashboard.
  for (const auto& entry : fs::directory_iterator(kSource + "/deploy/grafana/dashboards")) {
    std::string text = ReadFile(entry.path().string());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), name_re); it != std::sregex_iterator(); ++it) {
      std::string name = it->str();
      EXPECT_TRUE(scraped.find("\n" + name + "{") != std::string::npos ||
                  scraped.find("\n" + name + " ") != std::string::npos)
          << entry.path().filename() << " names " << name << ", which no scrape has";
    }
  }
}

TEST_F(Observability, TheDashboardInChromiumShowsARunningJobsProgress) {
  ProcessPool& pool = NewPool("chromium");
  ASSERT_NO_FATAL_FAILURE(StartServerAndTeam());
  // The browser signs in with a viewer token of the team, as a person would.
  auto viewer = pool.IssueToken("viewer", "research", "browser");
  ASSERT_TRUE(viewer.ok()) << viewer.status();
  fs::create_directories(kArtifacts);
  std::string screenshot = kArtifacts + "/dashboard.png";
  fs::remove(screenshot);

  auto browser = StartCheck("dashboard_check.mjs", {screenshot, "240"}, *viewer);
  ASSERT_TRUE(browser.ok()) << browser.status();
  auto next = [&]() -> Json {
    auto line = (*browser)->ReadLine(absl::Minutes(4));
    if (!line.ok()) return Json{{"event", "eof"}, {"why", ReadFile(CheckLog("dashboard_check.mjs"))}};
    auto json = ParseJson(*line);
    return json.ok() ? *json : Json{{"event", "garbage"}, {"line", *line}};
  };
  // The page is up before the job exists, so it sees the job from its first state.
  Json loaded = next();
  ASSERT_EQ(loaded["event"], "loaded") << DumpJson(loaded);
  // One task of it held by the test until the page has shown the job part-way: the job cannot
  // end before the page's once-a-second updates catch it.
  auto job = SubmitSample(pool, 240, 10);
  ASSERT_TRUE(job.ok()) << job.status();
  LeaseHolder holder(pool.connection());
  ASSERT_TRUE(holder.Hold().ok());
  for (const char* name : {"e1", "e2"}) ASSERT_TRUE(pool.StartExecutor(name).ok());

  Json event;
  std::vector<double> progress;
  bool held = true;
  while ((event = next())["event"] == "progress") {
    EXPECT_EQ(event["job"], job->id());
    progress.push_back(event["progress"].get<double>());
    if (held && progress.back() > 0 && progress.back() < 1) {
      ASSERT_TRUE(holder.Release().ok());
      held = false;
    }
  }
  ASSERT_EQ(event["event"], "done") << DumpJson(event);
  EXPECT_EQ(event["job"], job->id());
  EXPECT_EQ(event["tasks"], 24) << "the job's detail view lists its tasks";
  // The page showed the job part-way, then finished, never going backwards.
  ASSERT_GE(progress.size(), 2u);
  EXPECT_TRUE(std::any_of(progress.begin(), progress.end(), [](double p) { return p > 0 && p < 1; }))
      << "no intermediate progress seen";
  EXPECT_EQ(progress.back(), 1.0);
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  // The charts were drawn with data: all three, each with two points of history or more, the
  // job's rate among the series.
  EXPECT_EQ(event["charts"]["drawn"], 3) << DumpJson(event);
  EXPECT_GE(event["charts"]["points"].get<int>(), 2) << DumpJson(event);
  EXPECT_GE(event["charts"]["rate_series"].get<int>(), 1) << DumpJson(event);
  // Tokens per second: the team's generated and prompt series.
  EXPECT_EQ(event["charts"]["token_series"].get<int>(), 2) << DumpJson(event);
  // An executor's page lists its states over time and draws its records per second.
  EXPECT_GE(event["executor_page"]["states"].get<int>(), 1) << DumpJson(event);
  EXPECT_EQ(event["executor_page"]["chart"], true) << DumpJson(event);
  // The fleet table shows each machine's device (kind and name), usable memory and cached models
  // (a job of a model named by path leaves the caches empty): e1, e2 and the test's lease holder.
  ASSERT_EQ(event["fleet"].size(), 3u) << DumpJson(event);
  for (const Json& row : event["fleet"]) {
    EXPECT_THAT(row["device"].get<std::string>(), ::testing::MatchesRegex("(cpu|metal|cuda) .+")) << DumpJson(row);
    EXPECT_THAT(row["memory"].get<std::string>(), ::testing::MatchesRegex("[0-9]+\\.[0-9] GiB")) << DumpJson(row);
    EXPECT_EQ(row["models"], "none") << DumpJson(row);
  }
  auto exit = (*browser)->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->exited && exit->code == 0) << exit->ToString();
  // The screenshot is kept under the build directory for a person to look at.
  ASSERT_TRUE(fs::exists(screenshot));
  EXPECT_GT(fs::file_size(screenshot), 10000u);
  EXPECT_EQ(ReadFile(screenshot).substr(1, 3), "PNG");
}

// The dashboard's history is the server's, recorded every step whether or not anyone watches,
// and kept in the store across a restart: a browser opened only after a job has ended (and the
// server restarted) still draws the job's rate, and the curve ends when the job ended instead of
// running on. The job's page lists its failed records; a cancelled job looks cancelled.
TEST_F(Observability, TheDashboardInChromiumDrawsAFinishedJobsCurveEndingWhenItEnded) {
  ProcessPool& pool = NewPool("history");
  pool.AddServerArgs({"--history-step-s", "1"});
  ASSERT_NO_FATAL_FAILURE(StartServerAndTeam());
  auto viewer = pool.IssueToken("viewer", "research", "browser");
  ASSERT_TRUE(viewer.ok()) << viewer.status();
  ASSERT_TRUE(pool.StartExecutor("e1").ok());
  // 50 records, two of them bad (lines 18 and 43): two error lines.
  auto job = SubmitSample(pool, 50, 10);
  ASSERT_TRUE(job.ok()) << job.status();
  v1::Job ended = WaitForEnd(pool, job->id(), absl::Minutes(3));
  ASSERT_EQ(ended.state(), "completed");
  ASSERT_TRUE(pool.StopExecutor("e1").ok());
  // A job cancelled before anything ran.
  auto cancelled = SubmitSample(pool, 20, 10);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  ASSERT_TRUE(cli::JobsClient(pool.connection()).Cancel(cancelled->id()).ok());

  const std::vector<std::string> admin = {"Authorization: Bearer " + pool.connection().token};
  auto api = [&](const std::string& path) -> Json {
    HttpReply reply = HttpGet(absl::StrCat("http://", pool.http_address(), path), 10000, admin);
    auto json = ParseJson(reply.body);
    return reply.status == 200 && json.ok() ? *json : Json();
  };
  const double finished_at = api("/api/job?id=" + job->id())["job"]["finished_at"].get<double>();
  // Waits (no deadline asserted: the server records a point a second) until the stored history
  // reaches `t`.
  auto history_reaches = [&](double t) {
    for (int i = 0; i < 600; ++i) {
      Json h = api("/api/history");
      if (h.is_object() && !h["t"].empty() && h["t"].back().get<double>() >= t) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  };
  ASSERT_TRUE(history_reaches(finished_at + 3));
  // Restarted: what the browser shows below comes from the store, and reaches back before it.
  const double restarted_at = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  ASSERT_TRUE(pool.StopServer(SIGTERM).ok());
  ASSERT_TRUE(pool.StartServer().ok());
  ASSERT_TRUE(history_reaches(restarted_at + 2));

  fs::create_directories(kArtifacts);
  std::string screenshot = kArtifacts + "/dashboard-history.png";
  Json seen;
  ASSERT_NO_FATAL_FAILURE(RunCheck("dashboard_history_check.mjs", {job->id(), screenshot, "120"}, *viewer, &seen));

  // The chart as uPlot holds it: the job's rate where it ran, then nothing.
  const Json& t = seen["t"];
  const Json& rates = seen["rates"];
  ASSERT_EQ(t.size(), rates.size()) << DumpJson(seen);
  int last_drawn = -1;
  for (size_t i = 0; i < rates.size(); ++i) {
    if (!rates[i].is_null()) last_drawn = static_cast<int>(i);
  }
  ASSERT_GE(last_drawn, 0) << "the job's rate was never drawn: " << DumpJson(seen);
  EXPECT_GT(rates[last_drawn].get<double>(), 0);
  // Its last point lies within one step (1 s) of its end; every later one is empty.
  EXPECT_LE(t[last_drawn].get<double>(), finished_at + 1) << DumpJson(seen);
  ASSERT_GT(t.size(), static_cast<size_t>(last_drawn + 1)) << "no point after the job ended: " << DumpJson(seen);
  EXPECT_GE(t.back().get<double>(), finished_at + 3);
  // Recorded before the restart and shown after it.
  EXPECT_LT(t[0].get<double>(), restarted_at) << DumpJson(seen);

  // The jobs table: the completed job blue with its rate, the cancelled one cancelled.
  std::map<std::string, Json> rows;
  for (const Json& row : seen["rows"]) rows[row["job"].get<std::string>()] = row;
  ASSERT_TRUE(rows.count(job->id()) && rows.count(cancelled->id())) << DumpJson(seen);
  EXPECT_EQ(rows[job->id()]["state"], "completed");
  EXPECT_EQ(rows[job->id()]["bar"], "bar");
  EXPECT_EQ(rows[job->id()]["eta"], "done");
  EXPECT_EQ(rows[cancelled->id()]["state"], "cancelled");
  EXPECT_EQ(rows[cancelled->id()]["bar"], "bar bar-cancelled");
  EXPECT_EQ(rows[cancelled->id()]["rate"], "-");
  EXPECT_EQ(rows[cancelled->id()]["eta"], "cancelled");
  // The job's page: its two failed records with their messages, and how to get them all.
  EXPECT_EQ(seen["record_errors"]["failed"], 2) << DumpJson(seen);
  ASSERT_EQ(seen["record_errors"]["lines"].size(), 2u) << DumpJson(seen);
  for (const Json& text : seen["record_errors"]["lines"]) {
    EXPECT_THAT(text.get<std::string>(), ::testing::MatchesRegex(".+: .+")) << DumpJson(seen);
  }
  EXPECT_EQ(seen["record_errors"]["all"], "minions results " + job->id() + " --errors");
  EXPECT_THAT(seen["summary"].get<std::string>(), ::testing::HasSubstr("48 succeeded, 2 failed of 50"));
}

// Cancel and download from the job page, as a submitter of the job's team does it in a real
// browser: the job is cancelled part-way (one task held by the test, the rest finished), and the
// page's links give what finished and an error line for every record that never ran, the same
// as `minions results` gives: cancelling threw nothing away.
TEST_F(Observability, TheDashboardInChromiumCancelsAJobAndDownloadsWhatFinished) {
  ProcessPool& pool = NewPool("cancel");
  ASSERT_NO_FATAL_FAILURE(StartServerAndTeam());
  auto submitter = pool.IssueToken("submitter", "research", "browser");
  ASSERT_TRUE(submitter.ok()) << submitter.status();
  // 100 records in tasks of 10; the test holds one task, so the job cannot end by itself.
  auto job = SubmitSample(pool, 100, 10);
  ASSERT_TRUE(job.ok()) << job.status();
  LeaseHolder holder(pool.connection());
  ASSERT_TRUE(holder.Hold().ok());
  ASSERT_TRUE(pool.StartExecutor("e1").ok());
  cli::JobsClient client(pool.connection());
  // Waits (no deadline asserted: the other nine tasks run on the test model) for the rest.
  auto tasks_done = [&] {
    auto tasks = client.Tasks(job->id());
    int done = 0;
    for (const v1::Task& t : tasks.ok() ? *tasks : std::vector<v1::Task>{}) done += t.state() == "succeeded";
    return done;
  };
  for (int i = 0; i < 1800 && tasks_done() < 9; ++i) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_EQ(tasks_done(), 9) << "logs in " << pool.dir() << "/logs";

  Json seen;
  ASSERT_NO_FATAL_FAILURE(RunCheck("dashboard_cancel_check.mjs", {job->id(), "120"}, *submitter, &seen));

  // While it ran: a cancel button, nothing to download yet.
  EXPECT_EQ(seen["before"]["cancel"], true) << DumpJson(seen);
  EXPECT_EQ(seen["before"]["download"], false) << DumpJson(seen);
  EXPECT_THAT(seen["message"].get<std::string>(), ::testing::StartsWith("Cancelled")) << DumpJson(seen);
  EXPECT_THAT(seen["summary"].get<std::string>(), ::testing::HasSubstr("10 never ran of 100")) << DumpJson(seen);
  ASSERT_EQ(client.Get(job->id())->state(), "cancelled");
  // The files: every record exactly once; the held task's ten as never run.
  ASSERT_EQ(seen["output"]["status"], 200) << DumpJson(seen);
  ASSERT_EQ(seen["errors"]["status"], 200) << DumpJson(seen);
  EXPECT_THAT(seen["output"]["disposition"].get<std::string>(), ::testing::HasSubstr(job->id() + "-output.jsonl"));
  // Every custom_id once (a malformed input line has none: its error line says which line it was).
  std::set<std::string> ids;
  size_t without_id = 0;
  auto count = [&](const Json& id) { id.is_string() ? (void)ids.insert(id.get<std::string>()) : (void)++without_id; };
  for (const Json& id : seen["output"]["lines"]) count(id);
  int never_ran = 0;
  for (const Json& e : seen["errors"]["lines"]) {
    count(e["custom_id"]);
    never_ran += e["code"] == "batch_cancelled";
  }
  EXPECT_EQ(ids.size() + without_id, 100u) << DumpJson(seen);
  EXPECT_EQ(seen["output"]["lines"].size() + seen["errors"]["lines"].size(), 100u) << DumpJson(seen);
  EXPECT_EQ(never_ran, 10) << DumpJson(seen);
  EXPECT_GE(seen["output"]["lines"].size(), 88u) << "what finished was kept: " << DumpJson(seen);
  // The same lines as `minions results` gives.
  std::string cli_output;
  ASSERT_TRUE(client.Results(job->id(), false, [&](const std::string& chunk) { cli_output += chunk; }).ok());
  EXPECT_EQ(static_cast<size_t>(std::count(cli_output.begin(), cli_output.end(), '\n')), seen["output"]["lines"].size());
}

}  // namespace
}  // namespace minions::testing
