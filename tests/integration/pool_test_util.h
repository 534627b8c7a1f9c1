#pragma once
// Helpers shared by the suites that drive a ProcessPool of real processes (integration/, chaos/):
// backend selection, submitting, fetching and comparing results. The including target defines
// MINIONS_TEST_BIN_DIR, MINIONS_TEST_MODELS_DIR, MINIONS_TEST_POSTGRES_URL and MINIONS_TEST_S3_DIR.

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_util.h"
#include "testing/process_pool.h"

namespace minions::testing {

inline const std::string kBin = MINIONS_TEST_BIN_DIR;
inline const std::string kModel = std::string(MINIONS_TEST_MODELS_DIR) + "/text.gguf";

inline std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Runs a suite of tests taking a backend name (UseBackend) on both backends, named Embedded and
// PostgresS3 in the test names.
#define MINIONS_INSTANTIATE_ON_BOTH_BACKENDS(suite)                                                    \
  INSTANTIATE_TEST_SUITE_P(Backends, suite, ::testing::Values("embedded", "postgres-s3"),               \
                           [](const ::testing::TestParamInfo<std::string>& info) {                     \
                             return info.param == "embedded" ? std::string("Embedded")                  \
                                                             : std::string("PostgresS3");               \
                           })

// Runs `sp` to its end, its standard input closed and its standard output appended to `*out`
// (when given): whether it started and exited 0 within `timeout`.
inline bool RunsToSuccess(const Subprocess::Options& sp, absl::Duration timeout, std::string* out = nullptr) {
  auto process = Subprocess::Start(sp);
  if (!process.ok()) return false;
  (*process)->CloseStdin();
  for (auto line = (*process)->ReadLine(); line.ok(); line = (*process)->ReadLine()) {
    if (out != nullptr) absl::StrAppend(out, *line, "\n");
  }
  auto exit = (*process)->Wait(timeout);
  return exit.ok() && exit->exited && exit->code == 0;
}

// Points the pool at `backend`: "embedded" (SQLite + a directory, the default) or "postgres-s3"
// (a fresh schema in the fixture's PostgreSQL, a fresh prefix in the fixture's S3 server).
inline void UseBackend(ProcessPool& pool, const std::string& backend, const std::string& name) {
  if (backend == "embedded") return;
  std::string schema = absl::StrCat("it_", name, "_", getpid());
  std::string base = MINIONS_TEST_POSTGRES_URL;
  Subprocess::Options sp;
  sp.argv = {"psql", base, "-q", "-v", "ON_ERROR_STOP=1", "-c", "CREATE SCHEMA " + schema};
  sp.stderr_path = pool.dir() + "/logs/psql.log";
  ASSERT_TRUE(RunsToSuccess(sp, absl::Seconds(30)))
      << "cannot create a schema in the test PostgreSQL (" << base << "); see " << sp.stderr_path;
  std::string endpoint = ReadFirstLine(std::string(MINIONS_TEST_S3_DIR) + "/endpoint");
  ASSERT_FALSE(endpoint.empty()) << "the test S3 server is not running (fixture s3rver_start)";
  pool.SetBackend({"--database", base + "?options=-csearch_path%3D" + schema, "--objects",
                   "s3://minions-test/" + schema},
                  {"AWS_ACCESS_KEY_ID=S3RVER", "AWS_SECRET_ACCESS_KEY=S3RVER", "AWS_ENDPOINT_URL=" + endpoint,
                   "AWS_REGION=us-east-1"});
}

inline std::string TempDir(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("minions-it-" + std::to_string(getpid()) + "-" + name)).string();
}

inline std::string WriteInput(const std::string& dir, const std::vector<std::string>& lines) {
  std::filesystem::create_directories(dir);
  std::string path = dir + "/input.jsonl";
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
  return path;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Submits the JSONL file at `input` with the test model through `client`.
inline absl::StatusOr<v1::Job> Submit(cli::JobsClient& client, const std::string& input, int64_t shard_size,
                                      const std::string& options = "", int max_attempts = 0) {
  v1::SubmitJobRequest request;
  request.set_input(ReadFile(input));
  request.set_model(kModel);
  request.set_shard_size(shard_size);
  request.set_runner_options_json(options);
  request.set_max_attempts(max_attempts);
  return client.Submit(request);
}

// The same through the pool's first server.
inline absl::StatusOr<v1::Job> Submit(ProcessPool& pool, const std::string& input, int64_t shard_size,
                                      const std::string& options = "", int max_attempts = 0) {
  cli::JobsClient client(pool.connection());
  return Submit(client, input, shard_size, options, max_attempts);
}

inline bool IsFinished(const v1::Job& job) {
  return job.state() == "completed" || job.state() == "failed" || job.state() == "cancelled";
}

inline v1::Job SubmitAndWait(ProcessPool& pool, const std::string& input, int64_t shard_size,
                             const std::string& options, absl::Duration timeout) {
  cli::JobsClient client(pool.connection());
  auto job = Submit(pool, input, shard_size, options);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return {};
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto now = client.Get(job->id());
    if (now.ok() && IsFinished(*now)) return *now;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ADD_FAILURE() << "job " << job->id() << " did not finish in time; logs in " << pool.dir() << "/logs";
  return *client.Get(job->id());
}

inline std::vector<Json> Lines(const std::string& text) {
  std::vector<Json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto parsed = ParseJson(line);
    EXPECT_TRUE(parsed.ok()) << line;
    if (parsed.ok()) out.push_back(*parsed);
  }
  return out;
}

inline std::string FetchResults(cli::JobsClient& client, const std::string& job_id, bool errors) {
  std::string all;
  auto s = client.Results(job_id, errors, [&](const std::string& c) { all += c; });
  EXPECT_TRUE(s.ok()) << s;
  return all;
}

inline std::string FetchResults(ProcessPool& pool, const std::string& job_id, bool errors) {
  cli::JobsClient client(pool.connection());
  return FetchResults(client, job_id, errors);
}

// The parts of an output line that must not depend on where or when it ran. Generated text must
// be identical; embedding vectors agree to rounding (mean pooling sums over however many tokens
// share the batch), so they are compared separately and removed here.
inline Json Normalised(Json line, std::vector<std::vector<float>>* embeddings = nullptr) {
  if (line.contains("response") && line["response"].is_object() && line["response"].contains("body")) {
    Json& body = line["response"]["body"];
    body.erase("created");
    if (body.contains("data") && body["data"].is_array()) {
      for (auto& item : body["data"]) {
        if (embeddings) embeddings->push_back(item["embedding"].get<std::vector<float>>());
        item.erase("embedding");
      }
    }
  }
  return line;
}

inline double Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    dot += double(a[i]) * b[i];
    na += double(a[i]) * a[i];
    nb += double(b[i]) * b[i];
  }
  return dot / std::sqrt(na * nb);
}

// "a, b, c and 12 more": a list short enough for a failure message.
inline std::string FirstFew(const std::vector<std::string>& items, size_t n = 20) {
  std::vector<std::string> head(items.begin(), items.begin() + std::min(n, items.size()));
  std::string out = absl::StrJoin(head, ", ");
  if (items.size() > n) absl::StrAppend(&out, " and ", items.size() - n, " more");
  return out;
}

// Every custom_id of `lines` exactly once across output and errors. One failure names the
// missing, duplicated and unexpected custom_ids (a few of each), not one failure per record.
inline void ExpectEachRecordOnce(const std::vector<std::string>& lines, const std::vector<Json>& output,
                                 const std::vector<Json>& errors) {
  std::map<std::string, int> seen;
  int nulls = 0;
  for (const auto* file : {&output, &errors}) {
    for (const auto& l : *file) {
      if (l["custom_id"].is_string()) {
        ++seen[l["custom_id"].get<std::string>()];
      } else {
        ++nulls;  // a line too broken to name its record
      }
    }
  }
  int expected_nulls = 0;
  std::vector<std::string> missing, duplicated, unexpected;
  for (const auto& line : lines) {
    auto parsed = ParseJson(line);
    if (!parsed.ok() || !parsed->contains("custom_id")) {
      ++expected_nulls;
      continue;
    }
    std::string id = (*parsed)["custom_id"].get<std::string>();
    auto it = seen.find(id);
    if (it == seen.end()) {
      missing.push_back(id);
      continue;
    }
    if (it->second > 1) duplicated.push_back(absl::StrCat(id, " x", it->second));
    seen.erase(it);
  }
  for (const auto& [id, n] : seen) unexpected.push_back(id);
  EXPECT_TRUE(missing.empty()) << missing.size() << " custom_ids missing: " << FirstFew(missing);
  EXPECT_TRUE(duplicated.empty()) << duplicated.size() << " custom_ids more than once: " << FirstFew(duplicated);
  EXPECT_TRUE(unexpected.empty()) << unexpected.size() << " unexpected custom_ids: " << FirstFew(unexpected);
  EXPECT_EQ(nulls, expected_nulls) << "lines without a custom_id";
}

// The same for job `job_id`'s results and errors as `client` fetches them.
inline void ExpectEachRecordOnce(const std::vector<std::string>& lines, cli::JobsClient& client,
                                 const std::string& job_id) {
  ExpectEachRecordOnce(lines, Lines(FetchResults(client, job_id, false)), Lines(FetchResults(client, job_id, true)));
}

// The same through the pool's first server.
inline void ExpectEachRecordOnce(const std::vector<std::string>& lines, ProcessPool& pool, const std::string& job_id) {
  cli::JobsClient client(pool.connection());
  ExpectEachRecordOnce(lines, client, job_id);
}

// The merged results of a job equal a reference run's, line by line (see Normalised); embeddings
// by cosine. One failure says how many lines differ and shows the first few. Returns the number of
// embeddings compared.
inline int ExpectSameResults(const std::vector<Json>& output, const std::vector<Json>& errors,
                             const std::vector<Json>& reference_output, const std::vector<Json>& reference_errors) {
  int embeddings = 0;
  for (bool error_file : {false, true}) {
    const auto& got = error_file ? errors : output;
    const auto& want = error_file ? reference_errors : reference_output;
    const char* what = error_file ? "error" : "output";
    EXPECT_EQ(got.size(), want.size()) << what << " lines";
    std::vector<std::string> differ;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
      std::vector<std::vector<float>> a, b;
      bool same = Normalised(got[i], &a) == Normalised(want[i], &b) && a.size() == b.size();
      for (size_t k = 0; same && k < a.size(); ++k, ++embeddings) same = Cosine(a[k], b[k]) > 1 - 1e-5;
      if (!same) {
        differ.push_back(differ.size() < 3 ? absl::StrCat("\n  line ", i, ": got  ", got[i].dump(),
                                                          "\n  line ", i, ": want ", want[i].dump())
                                           : absl::StrCat(i));
      }
    }
    EXPECT_TRUE(differ.empty()) << differ.size() << " " << what << " lines differ from the reference: "
                                << FirstFew(differ, 8);
  }
  return embeddings;
}

// Each test's pool of processes, in a fresh folder (dir_): removed after a test that passed, kept
// for its logs after one that failed. A TEST_P's parameter names its backend (NewPool).
class PoolTest : public ::testing::TestWithParam<std::string> {
 protected:
  void TearDown() override {
    pool_.reset();  // its processes stopped first
    if (!dir_.empty() && !HasFailure()) std::filesystem::remove_all(dir_);
  }

  // Makes pool_ in dir_ = TempDir(name), with leases of `lease_ttl_ms`, allowed to run the test
  // models. `schema` "": the embedded backend (a TEST); otherwise a TEST_P's pool is on the backend
  // its parameter names (UseBackend), its folder and PostgreSQL schema named after it; check
  // HasFatalFailure() after.
  ProcessPool& NewPool(const std::string& name, int lease_ttl_ms, const std::string& schema = "",
                       bool allow_models = true) {
    dir_ = TempDir(schema.empty() ? name : name + "-" + GetParam());
    pool_ = std::make_unique<ProcessPool>(kBin + "/minions", dir_ + "/pool", lease_ttl_ms);
    if (allow_models) pool_->AllowModels({MINIONS_TEST_MODELS_DIR});
    if (!schema.empty()) UseBackend(*pool_, GetParam(), schema);
    return *pool_;
  }

  std::string dir_;
  std::unique_ptr<ProcessPool> pool_;
};

// Runs `lines` (already in `input`) through one runner in one process, the fault-free reference:
// writes dir/local.jsonl and dir/local-errors.jsonl. `threads` 0: all cores.
inline void RunLocally(const std::string& input, const std::string& dir, int parallel = 8, int threads = 0) {
  Subprocess::Options sp;
  sp.argv = {kBin + "/minions", "local-run", input, "--model", kModel, "-o", dir + "/local.jsonl", "--errors",
             dir + "/local-errors.jsonl", "--parallel", std::to_string(parallel), "--no-progress"};
  if (threads > 0) sp.argv.insert(sp.argv.end(), {"--threads", std::to_string(threads)});
  sp.stderr_path = dir + "/local-run.log";
  ASSERT_TRUE(RunsToSuccess(sp, absl::Minutes(5))) << "local-run failed; see " << sp.stderr_path;
}

}  // namespace minions::testing
