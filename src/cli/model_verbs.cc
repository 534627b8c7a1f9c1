#include "cli/model_verbs.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/output.h"
#include "common/sha256.h"
#include "rpc/rpc.h"

namespace minions::cli {
namespace {

std::string Parameters(int64_t n) {
  if (n >= 1'000'000'000) return absl::StrFormat("%.1fB", static_cast<double>(n) / 1e9);
  if (n >= 1'000'000) return absl::StrFormat("%.0fM", static_cast<double>(n) / 1e6);
  return absl::StrCat(n);
}

// "1.2 GiB, llama 3.2B, Q4_K_M": what the header said, the parts it did not say left out (no
// dangling ", " for a model without a quantization or an architecture).
std::string PushedFacts(const v1::Model& m) {
  std::vector<std::string> parts = {HumanBytes(m.size_bytes())};
  std::string shape = m.architecture();
  if (m.parameters() > 0) shape = absl::StrCat(shape, shape.empty() ? "" : " ", Parameters(m.parameters()), " parameters");
  if (!shape.empty()) parts.push_back(shape);
  if (!m.quantization().empty()) parts.push_back(m.quantization());
  return absl::StrJoin(parts, ", ");
}

std::string ShortDigest(const std::string& digest) { return digest.substr(0, std::min<size_t>(digest.size(), 19)); }

}  // namespace

std::string HumanBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.1f GB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.0f MB", b / (1 << 20));
  if (bytes >= 1024) return absl::StrFormat("%.0f KB", b / 1024);
  return absl::StrCat(bytes, " B");
}

ModelsClient::ModelsClient(const Connection& connection) : client_(connection) {}

absl::StatusOr<v1::Model> ModelsClient::Push(
    const std::string& path, const std::string& name, const std::string& team,
    const std::function<void(const std::string&, int64_t, int64_t)>& progress) {
  if (!client_.open().ok()) return client_.open();
  errno = 0;
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file || std::filesystem::is_directory(path)) return CannotRead(path, errno);
  const int64_t size = static_cast<int64_t>(file.tellg());
  absl::StatusOr<std::string> digest =
      Sha256File(path, [&](int64_t done) { if (progress) progress("hashing", done, size); });
  if (!digest.ok()) return digest.status();

  v1::StartModelPushRequest start;
  start.set_team(team);
  start.set_name(name);
  start.set_digest(*digest);
  start.set_size_bytes(size);
  absl::StatusOr<v1::StartModelPushResponse> start_answer =
      client_.Call(&v1::Models::Stub::StartModelPush, start, v1::StartModelPushResponse(), absl::Minutes(10));
  if (!start_answer.ok()) return start_answer.status();
  const v1::StartModelPushResponse& started = *start_answer;
  if (started.done()) return started.model();

  const int64_t part_size = started.part_size();
  if (part_size <= 0) return absl::InternalError("the server gave no part size");
  std::set<int> present(started.parts_present().begin(), started.parts_present().end());
  const int n_parts = static_cast<int>((size + part_size - 1) / part_size);
  std::string buffer;
  for (int part = 1; part <= n_parts; ++part) {
    const int64_t offset = (part - 1) * part_size;
    const int64_t length = std::min(part_size, size - offset);
    if (present.count(part) == 0) {
      buffer.resize(static_cast<size_t>(length));
      file.seekg(offset);
      if (!file.read(buffer.data(), length)) return absl::DataLossError(absl::StrCat(path, " changed while pushing it"));
      v1::UploadModelPartRequest upload;
      upload.set_team(team);
      upload.set_digest(*digest);
      upload.set_size_bytes(size);
      upload.set_part_number(part);
      upload.set_data(buffer);
      absl::StatusOr<v1::UploadModelPartResponse> uploaded =
          client_.Call(&v1::Models::Stub::UploadModelPart, upload, v1::UploadModelPartResponse(), absl::Minutes(10));
      if (!uploaded.ok()) {
        const absl::Status& status = uploaded.status();
        return absl::Status(status.code(), absl::StrCat(status.message(), " (run the same push again: it resumes at part ",
                                                        part, ")"));
      }
    }
    if (progress) progress("sending", offset + length, size);
  }
  v1::FinishModelPushRequest finish;
  finish.set_team(team);
  finish.set_name(name);
  finish.set_digest(*digest);
  finish.set_size_bytes(size);
  return client_.Call(&v1::Models::Stub::FinishModelPush, finish, v1::Model(), absl::Minutes(30));
}

absl::StatusOr<std::vector<v1::Model>> ModelsClient::List(const std::string& team) {
  v1::ListModelsRequest request;
  request.set_team(team);
  auto reply = client_.Call(&v1::Models::Stub::ListModels, request, v1::ListModelsResponse());
  if (!reply.ok()) return reply.status();
  return std::vector<v1::Model>(reply->models().begin(), reply->models().end());
}

absl::StatusOr<v1::Model> ModelsClient::Get(const std::string& team, const std::string& model) {
  v1::GetModelRequest request;
  request.set_team(team);
  request.set_model(model);
  return client_.Call(&v1::Models::Stub::GetModel, request, v1::Model());
}

absl::StatusOr<std::vector<v1::Model>> ModelsClient::Remove(const std::string& team, const std::string& model) {
  v1::RemoveModelRequest request;
  request.set_team(team);
  request.set_model(model);
  auto reply = client_.Call(&v1::Models::Stub::RemoveModel, request, v1::RemoveModelResponse());
  if (!reply.ok()) return reply.status();
  return std::vector<v1::Model>(reply->removed().begin(), reply->removed().end());
}

int PushModel(const Connection& connection, const ModelOptions& options) {
  ModelsClient client(connection);
  const bool tty = isatty(fileno(stderr)) != 0;
  absl::StatusOr<v1::Model> model =
      client.Push(options.path, options.name, options.team, [&](const std::string& phase, int64_t done, int64_t total) {
        if (tty && !options.json) {
          fprintf(stderr, "\r%s %s / %s   ", phase.c_str(), HumanBytes(done).c_str(), HumanBytes(total).c_str());
        }
      });
  if (tty && !options.json) fprintf(stderr, "\n");
  if (!model.ok()) return Fail(model.status());
  return PrintAnswer(*model, options.json, [](const v1::Model& m) {
    printf("%s@%s (%s) pushed for team %s\n", m.name().c_str(), m.digest().c_str(), PushedFacts(m).c_str(),
           m.team().c_str());
  });
}

int ListModels(const Connection& connection, const ModelOptions& options) {
  ModelsClient client(connection);
  absl::StatusOr<std::vector<v1::Model>> models = client.List(options.team);
  if (!models.ok()) return Fail(models.status());
  if (options.json) {
    PrintJsonArray(*models);
    return 0;
  }
  printf("%-10s %-24s %-20s %9s %-8s %7s %-7s %9s\n", "TEAM", "NAME", "DIGEST", "SIZE", "ARCH", "PARAMS", "QUANT",
         "NEEDS");
  for (const v1::Model& m : *models) {
    printf("%-10s %-24s %-20s %9s %-8s %7s %-7s %9s\n", m.team().c_str(), m.name().c_str(),
           ShortDigest(m.digest()).c_str(), HumanBytes(m.size_bytes()).c_str(), m.architecture().c_str(),
           Parameters(m.parameters()).c_str(), m.quantization().c_str(), HumanBytes(m.memory_bytes()).c_str());
  }
  return 0;
}

int ShowModel(const Connection& connection, const ModelOptions& options) {
  ModelsClient client(connection);
  absl::StatusOr<v1::Model> m = client.Get(options.team, options.name);
  if (!m.ok()) return Fail(m.status());
  if (options.json) {
    printf("%s\n", ToJson(*m).c_str());
    return 0;
  }
  printf("model          %s@%s (team %s)\n", m->name().c_str(), m->digest().c_str(), m->team().c_str());
  printf("size           %s (%lld bytes), %s\n", HumanBytes(m->size_bytes()).c_str(),
         static_cast<long long>(m->size_bytes()), m->format().c_str());
  printf("architecture   %s, %s parameters, %s\n", m->architecture().c_str(), Parameters(m->parameters()).c_str(),
         m->quantization().c_str());
  printf("shape          %lld layers, embedding %lld, %lld heads (%lld KV, dim %lld), vocabulary %lld\n",
         static_cast<long long>(m->layers()), static_cast<long long>(m->embedding_size()),
         static_cast<long long>(m->heads()), static_cast<long long>(m->kv_heads()),
         static_cast<long long>(m->head_dim()), static_cast<long long>(m->vocab_size()));
  printf("context        %lld tokens (training)\n", static_cast<long long>(m->context_length()));
  printf("a task needs   %s with the runner's defaults (8 sequences, up to 4096 tokens each)\n",
         HumanBytes(m->memory_bytes()).c_str());
  printf("pushed by      %s\n", m->created_by().c_str());
  return 0;
}

int RemoveModel(const Connection& connection, const ModelOptions& options) {
  ModelsClient client(connection);
  absl::StatusOr<std::vector<v1::Model>> removed = client.Remove(options.team, options.name);
  if (!removed.ok()) return Fail(removed.status());
  if (options.json) {
    PrintJsonArray(*removed);
    return 0;
  }
  for (const v1::Model& m : *removed) printf("removed %s@%s\n", m.name().c_str(), m.digest().c_str());
  return 0;
}

}  // namespace minions::cli
