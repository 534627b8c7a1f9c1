#include "openai/openai_api.h"

#include <algorithm>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "identity/token.h"
#include "model/identity.h"
#include "openai/batch_input_check.h"
#include "openai/multipart_reader.h"
#include "server/duplicate_ids.h"
#include "server/keys.h"

namespace minions::openai {
namespace {

constexpr char kJson[] = "application/json";
constexpr char kFilePrefix[] = "file-";
constexpr char kOutputSuffix[] = "-output";
constexpr char kErrorsSuffix[] = "-errors";
const std::set<std::string> kEndpoints = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"};

Json Unix(absl::Time t) { return absl::ToUnixSeconds(t); }
Json Unix(const std::optional<absl::Time>& t) { return t ? Json(absl::ToUnixSeconds(*t)) : Json(nullptr); }

Json ErrorBody(const std::string& message, const std::string& type, const Json& param, const Json& code) {
  return Json{{"error", {{"message", message}, {"type", type}, {"param", param}, {"code", code}}}};
}

HttpResponse ErrorResponse(int status, const std::string& message, const std::string& type = "invalid_request_error",
                           const Json& param = nullptr, const Json& code = nullptr) {
  return HttpResponse{status, kJson, DumpJson(ErrorBody(message, type, param, code)) + "\n", {}};
}

// A status from below, as OpenAI would say it.
HttpResponse StatusResponse(const absl::Status& status, const HttpRequest& request, const Json& param = nullptr) {
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return ErrorResponse(400, message, "invalid_request_error", param);
    case absl::StatusCode::kNotFound:
      return ErrorResponse(404, message, "invalid_request_error", param);
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      return ErrorResponse(409, message, "invalid_request_error", param);
    case absl::StatusCode::kUnauthenticated:
      return ErrorResponse(401, message, "invalid_request_error", nullptr, "invalid_api_key");
    case absl::StatusCode::kPermissionDenied:
      return ErrorResponse(403, message, "permission_error", param);
    case absl::StatusCode::kResourceExhausted:
      return ErrorResponse(429, message, "rate_limit_exceeded", nullptr, "rate_limit_exceeded");
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return ErrorResponse(503, message, "server_error");
    default:
      MINIONS_LOG(Warning) << "OpenAI API " << request.method << " " << request.path << ": " << status;
      return ErrorResponse(500, "The server had an error while processing your request.", "server_error");
  }
}

// Whether a request moves a file's bytes or validates one (a stream of its own), rather than a
// small JSON body and answer (served on a worker, holding no stream slot).
bool IsBulk(const HttpRequest& request) {
  const std::string& path = request.path;
  if (request.method == "POST") return path == "/v1/files" || path == "/v1/batches";
  return (request.method == "GET" || request.method == "HEAD") && absl::StartsWith(path, "/v1/files/") &&
         absl::EndsWith(path, "/content");
}

// An uploaded file's id: "file-" and 24 hex digits.
bool IsUploadId(const std::string& id) {
  if (id.size() != 29 || !absl::StartsWith(id, kFilePrefix)) return false;
  for (char c : id.substr(5)) {
    if (!absl::ascii_isxdigit(c) || absl::ascii_isupper(c)) return false;
  }
  return true;
}

// A batch's output or error file id: "file-JOB-output", "file-JOB-errors".
bool IsResultId(const std::string& id) {
  return absl::StartsWith(id, kFilePrefix) && (absl::EndsWith(id, kOutputSuffix) || absl::EndsWith(id, kErrorsSuffix));
}

// A job id as the stores make them ("job-" and [a-z0-9-]): anything else is no job.
bool IsJobId(const std::string& id) {
  if (id.size() < 5 || id.size() > 80 || !absl::StartsWith(id, "job-")) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_') return false;
  }
  return true;
}

// "24h" (what OpenAI accepts), or, on Minions, any whole number of s, m or h from 1 s to 7 days.
std::optional<absl::Duration> ParseWindow(const std::string& text) {
  if (text.size() < 2 || text.size() > 8) return std::nullopt;
  int64_t n = 0;
  if (!absl::SimpleAtoi(text.substr(0, text.size() - 1), &n) || n <= 0) return std::nullopt;
  absl::Duration d;
  switch (text.back()) {
    case 's': d = absl::Seconds(n); break;
    case 'm': d = absl::Minutes(n); break;
    case 'h': d = absl::Hours(n); break;
    default: return std::nullopt;
  }
  if (d > absl::Hours(24 * 7)) return std::nullopt;
  return d;
}

std::string WindowText(absl::Duration d) {
  if (d % absl::Hours(1) == absl::ZeroDuration()) return absl::StrCat(absl::ToInt64Hours(d), "h");
  if (d % absl::Minutes(1) == absl::ZeroDuration()) return absl::StrCat(absl::ToInt64Minutes(d), "m");
  return absl::StrCat(absl::ToInt64Seconds(d), "s");
}

}  // namespace

// One request: who asks, and the stream to answer on.
struct OpenAiApi::Call {
  const HttpRequest& request;
  HttpStream& stream;
  Caller caller;
  std::string team;  // whose files and batches (an admin's: the default team's)

  void Reply(int status, const Json& body) {
    (void)stream.Respond(HttpResponse{status, kJson, DumpJson(body) + "\n", {}});
  }
  void Fail(const HttpResponse& response) {
    if (stream.head_written()) return;  // too late: the connection closes short of its length
    (void)stream.Respond(response);
  }
  void Fail(int status, const std::string& message, const std::string& type = "invalid_request_error",
            const Json& param = nullptr, const Json& code = nullptr) {
    Fail(ErrorResponse(status, message, type, param, code));
  }
  // A status from below, as OpenAI would say it.
  void Fail(const absl::Status& status, const Json& param = nullptr) { Fail(StatusResponse(status, request, param)); }

  // The request's JSON body (a small one); answers and returns nullopt when it is not one.
  std::optional<Json> JsonBody(int64_t max_bytes) {
    std::string body;
    char buffer[16384];
    while (true) {
      auto n = stream.ReadBody(buffer, sizeof(buffer));
      if (!n.ok()) {
        Fail(400, absl::StrCat("The request body could not be read: ", n.status().message()));
        return std::nullopt;
      }
      if (*n == 0) break;
      body.append(buffer, *n);
      if (static_cast<int64_t>(body.size()) > max_bytes) {
        Fail(413, absl::StrCat("The request body is larger than ", max_bytes, " bytes."));
        return std::nullopt;
      }
    }
    auto parsed = ParseJson(body);
    if (!parsed.ok() || !parsed->is_object()) {
      Fail(400,
           absl::StrCat("We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
                        "your HTTP library correctly. The OpenAI API expects a JSON payload",
                        parsed.ok() ? " object" : absl::StrCat(": ", parsed.status().message()), ".)"));
      return std::nullopt;
    }
    return *parsed;
  }
};

OpenAiApi::OpenAiApi(Deps deps, OpenAiApiOptions options)
    : deps_(deps), options_(options), finalizer_(deps.store, deps.blobs, deps.clock, deps.chunk_limits) {}

void OpenAiApi::Install(HttpServer* http) {
  http->HandleStream(
      "/v1/", [this](const HttpRequest& request, HttpStream& stream) { Serve(request, stream); },
      [this](const HttpRequest& request) { return Admit(request); });
}

absl::StatusOr<Caller> OpenAiApi::Authorize(const HttpRequest& request, HttpResponse* refusal) {
  std::string authorization = request.Header("authorization");
  std::string token;
  if (absl::StartsWithIgnoreCase(authorization, "bearer ")) token = std::string(absl::StripAsciiWhitespace(authorization.substr(7)));
  if (token.empty()) {
    *refusal = ErrorResponse(401,
                             "You didn't provide an API key. You need to provide your API key in an Authorization "
                             "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY): a Minions token of your "
                             "team.",
                             "invalid_request_error", nullptr, nullptr);
    return absl::UnauthenticatedError("no key");
  }
  const bool writes = request.method == "POST" || request.method == "DELETE";
  auto caller = deps_.auth->Authorize(token, writes ? Scope::kJobsWrite : Scope::kJobsRead);
  if (!caller.ok()) {
    *refusal = absl::IsUnauthenticated(caller.status())
                   ? ErrorResponse(401, absl::StrCat("Incorrect API key provided: ", caller.status().message()),
                                   "invalid_request_error", nullptr, "invalid_api_key")
                   : StatusResponse(caller.status(), request);
  }
  return caller;
}

HttpAdmission OpenAiApi::Admit(const HttpRequest& request) {
  HttpAdmission admission;
  auto caller = Authorize(request, &admission.refusal);
  if (!caller.ok()) {
    admission.kind = HttpAdmission::Kind::kRefuse;
    return admission;
  }
  admission.principal = absl::StrCat(caller->principal, "@", caller->team);
  admission.kind = IsBulk(request) ? HttpAdmission::Kind::kStream : HttpAdmission::Kind::kSmall;
  admission.max_body_bytes = static_cast<size_t>(options_.max_json_bytes);
  admission.admitted = *caller;
  return admission;
}

void OpenAiApi::Serve(const HttpRequest& request, HttpStream& stream) {
  Call call{request, stream, {}, ""};
  if (const Caller* admitted = std::any_cast<Caller>(&request.admitted)) {
    call.caller = *admitted;  // checked (and counted against the rate limit) by Admit
  } else {
    HttpResponse refusal;
    auto caller = Authorize(request, &refusal);
    if (!caller.ok()) return call.Fail(refusal);
    call.caller = *caller;
  }
  call.team = call.caller.team.empty() ? std::string(kDefaultTeam) : call.caller.team;
  Route(call);
}

void OpenAiApi::Route(Call& call) {
  const std::string& method = call.request.method;
  std::vector<std::string> parts = absl::StrSplit(call.request.path.substr(4), '/');  // after "/v1/"
  const bool get = method == "GET" || method == "HEAD";
  auto wrong_method = [&] {
    call.Fail(405, absl::StrCat("Invalid method for URL (", method, " ", call.request.path, ")."),
              "invalid_request_error", nullptr, "method_not_allowed");
  };
  auto good_id = [](const std::string& id) { return !id.empty() && id.size() <= 200; };
  if (parts[0] == "files" && parts.size() == 1) {
    if (get) return ListFiles(call);
    if (method == "POST") return CreateFile(call);
    return wrong_method();
  }
  if (parts[0] == "files" && parts.size() == 2 && good_id(parts[1])) {
    if (get) return GetFile(call, parts[1]);
    if (method == "DELETE") return DeleteFile(call, parts[1]);
    return wrong_method();
  }
  if (parts[0] == "files" && parts.size() == 3 && good_id(parts[1]) && parts[2] == "content") {
    if (get) return FileContent(call, parts[1]);
    return wrong_method();
  }
  if (parts[0] == "batches" && parts.size() == 1) {
    if (get) return ListBatches(call);
    if (method == "POST") return CreateBatch(call);
    return wrong_method();
  }
  if (parts[0] == "batches" && parts.size() == 2 && good_id(parts[1])) {
    if (get) return GetBatch(call, parts[1]);
    return wrong_method();
  }
  if (parts[0] == "batches" && parts.size() == 3 && good_id(parts[1]) && parts[2] == "cancel") {
    if (method == "POST") return CancelBatch(call, parts[1]);
    return wrong_method();
  }
  if (parts[0] == "models" && parts.size() == 1) {
    if (get) return ListModels(call);
    return wrong_method();
  }
  if (parts[0] == "models" && parts.size() == 2 && good_id(parts[1])) {
    if (get) return GetModel(call, parts[1]);
    return wrong_method();
  }
  call.Fail(404,
            absl::StrCat("Unknown request URL: ", method, " ", call.request.path.substr(0, 200),
                         ". Minions serves /v1/files, /v1/batches and /v1/models of the OpenAI API."),
            "invalid_request_error", nullptr, "unknown_url");
}

// --- files ---

namespace {

Json FileObject(const Json& meta) {
  return Json{{"id", meta.value("id", "")},
              {"object", "file"},
              {"bytes", meta.value("bytes", int64_t{0})},
              {"created_at", meta.value("created_at", int64_t{0})},
              {"filename", meta.value("filename", "")},
              {"purpose", meta.value("purpose", "batch")},
              {"status", "processed"},
              {"status_details", nullptr}};
}

}  // namespace

void OpenAiApi::CreateFile(Call& call) {
  auto boundary = MultipartBoundary(call.request.Header("content-type"));
  if (!boundary.ok()) return call.Fail(400, std::string(boundary.status().message()));
  int64_t declared = 0;
  if (absl::SimpleAtoi(call.request.Header("content-length"), &declared) &&
      declared > options_.max_file_bytes + (64 << 10)) {
    return call.Fail(413, absl::StrCat("The file is too large: this server takes files of at most ",
                                       options_.max_file_bytes, " bytes."),
                     "invalid_request_error", "file");
  }
  // The team's room for files (Team::max_file_bytes): an upload that passes it is stopped as it
  // does, and nothing of it is kept; the store charges the whole file once it has arrived.
  auto team = deps_.store->GetTeam(call.team);
  if (!team.ok()) return call.Fail(team.status());
  const int64_t room = team->max_file_bytes > 0 ? std::max<int64_t>(team->max_file_bytes - team->file_bytes, 0)
                                                : std::numeric_limits<int64_t>::max();
  auto over_limit = [&](int64_t more, const std::string& why) {
    return call.Fail(429, why.empty() ? absl::StrCat("Team ", call.team, " keeps ", team->file_bytes,
                                                     " bytes of files; another ", more, " would pass its limit of ",
                                                     team->max_file_bytes, " (an admin raises it with `minions admin "
                                                     "team set ", call.team, " --max-file-bytes N`); delete files it "
                                                     "no longer needs.")
                                      : why,
                     "insufficient_quota", "file");
  };
  if (declared - (64 << 10) > room) return over_limit(declared, "");
  MultipartReader form(*boundary, [&](char* buffer, size_t size) { return call.stream.ReadBody(buffer, size); });
  const std::string id = absl::StrCat(token::NewId(kFilePrefix), token::NewId(""));  // 24 random hex digits
  const std::string key = keys::OpenAiFiles(call.team) + id;
  std::string purpose, filename;
  bool have_file = false;
  int64_t bytes = 0;
  bool too_large = false;
  bool over_quota = false;
  auto drop = [&] {
    if (have_file) (void)deps_.blobs->Delete(key);
  };
  while (true) {
    FormPart part;
    auto next = form.NextPart(&part);
    if (!next.ok()) {
      drop();
      return call.Fail(400, absl::StrCat("The multipart body is malformed: ", next.status().message()));
    }
    if (!*next) break;
    if (part.name == "file" && !have_file) {
      filename = part.filename.empty() ? "upload.jsonl" : part.filename.substr(0, 255);
      have_file = true;
      absl::Status put = deps_.blobs->PutStream(key, [&]() -> absl::StatusOr<std::string> {
        auto chunk = form.ReadChunk(1 << 20);
        if (!chunk.ok()) return chunk.status();
        bytes += static_cast<int64_t>(chunk->size());
        if (bytes > options_.max_file_bytes) {
          too_large = true;
          return absl::OutOfRangeError("too large");
        }
        if (bytes > room) {
          over_quota = true;
          return absl::OutOfRangeError("over the team's limit");
        }
        return chunk;
      });
      if (!put.ok()) {
        drop();
        if (over_quota) return over_limit(bytes, "");
        if (too_large) {
          return call.Fail(413, absl::StrCat("The file is too large: this server takes files of at most ",
                                             options_.max_file_bytes, " bytes."),
                           "invalid_request_error", "file");
        }
        if (absl::IsInvalidArgument(put)) {
          return call.Fail(400, absl::StrCat("The multipart body is malformed: ", put.message()));
        }
        if (absl::IsDataLoss(put) || absl::IsDeadlineExceeded(put) || absl::IsUnavailable(put)) {
          return call.Fail(400, absl::StrCat("The upload did not arrive whole: ", put.message()));
        }
        return call.Fail(put);
      }
    } else if (part.name == "purpose") {
      auto value = form.ReadAll(256);
      if (!value.ok()) {
        drop();
        return call.Fail(400, std::string(value.status().message()), "invalid_request_error", "purpose");
      }
      purpose = std::string(absl::StripAsciiWhitespace(*value));
    }  // other fields are read past
  }
  if (!have_file) return call.Fail(400, "Missing the 'file' field of the form.", "invalid_request_error", "file");
  if (purpose != "batch") {
    drop();
    return call.Fail(400,
                     absl::StrCat("'", purpose.substr(0, 40),
                                  "' is not a purpose this server takes: Minions runs batches; upload with purpose "
                                  "'batch'."),
                     "invalid_request_error", "purpose");
  }
  // Charged once whole: other uploads of the team may have taken its room meanwhile.
  if (auto charged = deps_.store->ChargeTeamBytes(call.team, TeamBytes::kFiles, bytes, /*enforce=*/true);
      !charged.ok()) {
    drop();
    if (absl::IsResourceExhausted(charged.status())) return over_limit(bytes, std::string(charged.status().message()));
    return call.Fail(charged.status());
  }
  auto uncharge = [&] { (void)deps_.store->ChargeTeamBytes(call.team, TeamBytes::kFiles, -bytes, /*enforce=*/false); };
  Json meta = {{"id", id},
               {"bytes", bytes},
               {"created_at", absl::ToUnixSeconds(deps_.clock->Now())},
               {"filename", filename},
               {"purpose", purpose},
               {"owner", call.caller.principal}};
  if (auto s = deps_.blobs->Put(key + ".json", DumpJson(meta)); !s.ok()) {
    drop();
    uncharge();
    return call.Fail(s);
  }
  MINIONS_LOG(Info) << "file " << id << " (" << bytes << " bytes) uploaded by " << call.caller.Describe();
  call.Reply(200, FileObject(meta));
}

void OpenAiApi::ListFiles(Call& call) {
  const std::string purpose = call.request.Param("purpose");
  std::string order = call.request.Param("order");
  if (order.empty()) order = "desc";
  if (order != "asc" && order != "desc") return call.Fail(400, "order must be 'asc' or 'desc'.", "invalid_request_error", "order");
  int64_t limit = 10000;
  if (std::string l = call.request.Param("limit"); !l.empty() && (!absl::SimpleAtoi(l, &limit) || limit < 1 || limit > 10000)) {
    return call.Fail(400, "limit must be a whole number from 1 to 10000.", "invalid_request_error", "limit");
  }
  const std::string after = call.request.Param("after");
  auto listed = deps_.blobs->List(keys::OpenAiFiles(call.team));
  if (!listed.ok()) return call.Fail(listed.status());
  std::vector<Json> files;
  for (const std::string& key : *listed) {
    if (!absl::EndsWith(key, ".json")) continue;
    auto text = deps_.blobs->Get(key);
    if (!text.ok()) continue;  // deleted meanwhile
    auto meta = ParseJson(*text);
    if (!meta.ok() || !meta->is_object()) continue;
    if (!purpose.empty() && meta->value("purpose", "") != purpose) continue;
    files.push_back(FileObject(*meta));
  }
  std::sort(files.begin(), files.end(), [&](const Json& a, const Json& b) {
    auto ka = std::make_pair(a["created_at"].get<int64_t>(), a["id"].get<std::string>());
    auto kb = std::make_pair(b["created_at"].get<int64_t>(), b["id"].get<std::string>());
    return order == "asc" ? ka < kb : kb < ka;
  });
  size_t first = 0;
  if (!after.empty()) {
    while (first < files.size() && files[first]["id"] != after) ++first;
    first = first < files.size() ? first + 1 : files.size();
  }
  Json data = Json::array();
  for (size_t i = first; i < files.size() && static_cast<int64_t>(data.size()) < limit; ++i) data.push_back(files[i]);
  const bool has_more = first + data.size() < files.size();
  call.Reply(200, Json{{"object", "list"},
                       {"data", data},
                       {"first_id", data.empty() ? Json(nullptr) : data.front()["id"]},
                       {"last_id", data.empty() ? Json(nullptr) : data.back()["id"]},
                       {"has_more", has_more}});
}

absl::StatusOr<OpenAiApi::ResultFile> OpenAiApi::FindResultFile(Call& call, const std::string& id) {
  auto not_found = absl::NotFoundError(absl::StrCat("No such File object: ", id));
  std::string rest = id.substr(std::string(kFilePrefix).size());
  const bool errors = absl::EndsWith(rest, kErrorsSuffix);
  const size_t suffix = errors ? std::string(kErrorsSuffix).size() : std::string(kOutputSuffix).size();
  // "file-output" ends as a result id does but names no job ("output" is shorter than "-output").
  if (rest.size() <= suffix) return not_found;
  rest.resize(rest.size() - suffix);
  if (!IsJobId(rest)) return not_found;
  auto job = deps_.store->GetJob(rest);
  if (absl::IsNotFound(job.status())) return not_found;
  if (!job.ok()) return job.status();
  if (!call.caller.SeesTeam(job->spec.team)) return not_found;
  // Only a file the batch names exists (an error file only when there are error lines).
  auto batch = BatchObject(*job);
  if (!batch.ok()) return batch.status();
  if ((*batch)[errors ? "error_file_id" : "output_file_id"] != id) return not_found;
  // A cancelled job's partial results lie where MergeCancelled put them; a finished job's row names its own.
  const bool cancelled = job->state == JobState::kCancelled;
  std::string key = errors ? (cancelled ? keys::CancelledJobErrors(rest) : job->errors_key)
                           : (cancelled ? keys::CancelledJobOutput(rest) : job->output_key);
  return ResultFile{*std::move(job), errors, std::move(key)};
}

void OpenAiApi::GetFile(Call& call, const std::string& id) {
  if (IsResultId(id)) {
    auto file = FindResultFile(call, id);
    if (!file.ok()) return call.Fail(file.status(), "file_id");
    auto size = deps_.blobs->Size(file->key);
    if (!size.ok()) return call.Fail(size.status());
    const Job& job = file->job;
    return call.Reply(200, FileObject(Json{{"id", id},
                                           {"bytes", *size},
                                           {"created_at", absl::ToUnixSeconds(job.finished_at.value_or(job.updated_at))},
                                           {"filename", file->errors ? "batch_errors.jsonl" : "batch_output.jsonl"},
                                           {"purpose", "batch_output"}}));
  }
  if (!IsUploadId(id)) return call.Fail(404, absl::StrCat("No such File object: ", id), "invalid_request_error", "file_id");
  auto text = deps_.blobs->Get(keys::OpenAiFiles(call.team) + id + ".json");
  if (absl::IsNotFound(text.status())) {
    return call.Fail(404, absl::StrCat("No such File object: ", id), "invalid_request_error", "file_id");
  }
  if (!text.ok()) return call.Fail(text.status());
  auto meta = ParseJson(*text);
  if (!meta.ok()) return call.Fail(absl::InternalError("a file's record is unreadable"));
  call.Reply(200, FileObject(*meta));
}

void OpenAiApi::FileContent(Call& call, const std::string& id) {
  std::string key;
  if (IsResultId(id)) {
    auto file = FindResultFile(call, id);
    if (!file.ok()) return call.Fail(file.status(), "file_id");
    key = file->key;
  } else if (IsUploadId(id)) {
    key = keys::OpenAiFiles(call.team) + id;
  } else {
    return call.Fail(404, absl::StrCat("No such File object: ", id), "invalid_request_error", "file_id");
  }
  auto size = deps_.blobs->Size(key);
  if (absl::IsNotFound(size.status())) {
    return call.Fail(404, absl::StrCat("No such File object: ", id), "invalid_request_error", "file_id");
  }
  if (!size.ok()) return call.Fail(size.status());
  if (auto s = call.stream.WriteHead(200, "application/octet-stream", *size); !s.ok()) return;
  int64_t sent = 0;
  auto read = deps_.blobs->Read(key, [&](std::string_view chunk) {
    sent += static_cast<int64_t>(chunk.size());
    return sent <= *size && call.stream.Write(chunk).ok();
  });
  // A failure after the head can only cut the response short; the client sees a short body.
  if (!read.ok()) MINIONS_LOG(Warning) << "OpenAI API: download of " << id << " broke off: " << read;
}

void OpenAiApi::DeleteFile(Call& call, const std::string& id) {
  if (IsResultId(id)) {
    return call.Fail(400, "A batch's output and error files go with the batch; they cannot be deleted on their own.",
                     "invalid_request_error", "file_id");
  }
  if (!IsUploadId(id)) return call.Fail(404, absl::StrCat("No such File object: ", id), "invalid_request_error", "file_id");
  const std::string key = keys::OpenAiFiles(call.team) + id;
  auto exists = deps_.blobs->Size(key + ".json");
  if (absl::IsNotFound(exists.status())) {
    return call.Fail(404, absl::StrCat("No such File object: ", id), "invalid_request_error", "file_id");
  }
  if (!exists.ok()) return call.Fail(exists.status());
  // A batch that has not ended still reads its input.
  JobFilter filter;
  filter.team = call.team;
  filter.limit = static_cast<int>(options_.max_listed_jobs);
  auto jobs = deps_.store->ListJobs(filter);
  if (!jobs.ok()) return call.Fail(jobs.status());
  for (const Job& job : *jobs) {
    if (job.spec.input_key == key && !IsTerminal(job.state)) {
      return call.Fail(409, absl::StrCat("File ", id, " is the input of batch ", job.id,
                                         ", which has not ended; cancel it or wait for it first."),
                       "invalid_request_error", "file_id");
    }
  }
  // Its bytes, as its description says, are given back to the team's room for files.
  int64_t bytes = 0;
  if (auto meta = deps_.blobs->Get(key + ".json"); meta.ok()) {
    if (auto parsed = ParseJson(*meta); parsed.ok() && parsed->is_object()) bytes = parsed->value("bytes", int64_t{0});
  }
  if (auto s = deps_.blobs->Delete(key + ".json"); !s.ok()) return call.Fail(s);
  if (auto s = deps_.blobs->Delete(key); !s.ok()) return call.Fail(s);
  if (bytes > 0) (void)deps_.store->ChargeTeamBytes(call.team, TeamBytes::kFiles, -bytes, /*enforce=*/false);
  call.Reply(200, Json{{"id", id}, {"object", "file"}, {"deleted", true}});
}

// --- batches ---

absl::StatusOr<Json> OpenAiApi::BatchObject(const Job& job) {
  Json side = Json::object();
  auto text = deps_.blobs->Get(keys::OpenAiBatch(job.spec.team, job.id));
  if (text.ok()) {
    auto parsed = ParseJson(*text);
    if (parsed.ok() && parsed->is_object()) side = *parsed;
  } else if (!absl::IsNotFound(text.status())) {
    return text.status();
  }
  std::string status;
  std::string output_key = job.output_key, errors_key = job.errors_key;
  switch (job.state) {
    case JobState::kValidating: status = "validating"; break;
    case JobState::kQueued:
    case JobState::kRunning: status = "in_progress"; break;
    case JobState::kFinalizing: status = "finalizing"; break;
    case JobState::kCompleted: status = "completed"; break;
    case JobState::kFailed: status = "failed"; break;
    case JobState::kExpired: status = "expired"; break;
    case JobState::kCancelled: {
      // Cancelling until its partial results are merged (here, on the first look after the
      // cancel: its tasks commit nothing more), then cancelled.
      if (!side.contains("cancelled_at")) {
        auto tokens = finalizer_.MergeCancelled(job.id);
        if (!tokens.ok()) return tokens.status();
        // The job's row keeps no tokens for a cancelled job; its batch keeps what the partial
        // output used.
        side["tokens"] = {{"prompt_tokens", tokens->prompt_tokens},
                          {"completion_tokens", tokens->completion_tokens},
                          {"reasoning_tokens", tokens->reasoning_tokens}};
        side["cancelled_at"] = absl::ToUnixSeconds(deps_.clock->Now());
        if (!side.contains("cancelling_at") && job.finished_at) side["cancelling_at"] = absl::ToUnixSeconds(*job.finished_at);
        if (auto s = deps_.blobs->Put(keys::OpenAiBatch(job.spec.team, job.id), DumpJson(side)); !s.ok()) return s;
      }
      status = "cancelled";
      output_key = keys::CancelledJobOutput(job.id);
      errors_key = keys::CancelledJobErrors(job.id);
      break;
    }
  }
  Json output_file = nullptr, error_file = nullptr;
  if (!output_key.empty()) output_file = absl::StrCat(kFilePrefix, job.id, kOutputSuffix);
  if (!errors_key.empty()) {
    auto size = deps_.blobs->Size(errors_key);
    if (size.ok() && *size > 0) error_file = absl::StrCat(kFilePrefix, job.id, kErrorsSuffix);
  }
  const bool validated = !side.contains("errors");
  const Json finished = Unix(job.finished_at);
  const absl::Duration window = job.spec.completion_window.value_or(absl::Hours(24));
  Json errors = nullptr;
  if (side.contains("errors")) errors = Json{{"object", "list"}, {"data", side["errors"]}};
  else if (job.state == JobState::kFailed && !job.error.empty()) {
    errors = Json{{"object", "list"},
                  {"data", Json::array({Json{{"code", "batch_failed"}, {"message", job.error}, {"param", nullptr},
                                             {"line", nullptr}}})}};
  }
  Json batch = {
      {"id", job.id},
      {"object", "batch"},
      {"endpoint", side.value("endpoint", "/v1/chat/completions")},
      {"model", side.value("model", job.spec.model)},
      {"errors", errors},
      {"input_file_id", side.contains("input_file_id") ? side["input_file_id"] : Json(nullptr)},
      {"completion_window", side.value("completion_window", WindowText(window))},
      {"status", status},
      {"output_file_id", output_file},
      {"error_file_id", error_file},
      {"created_at", Unix(job.created_at)},
      {"in_progress_at", validated && job.state != JobState::kValidating ? Unix(job.created_at) : Json(nullptr)},
      {"expires_at", Unix(job.created_at + window)},
      {"finalizing_at", (job.state == JobState::kFinalizing ? Unix(job.updated_at)
                         : (job.state == JobState::kCompleted || job.state == JobState::kExpired) ? finished
                                                                                                  : Json(nullptr))},
      {"completed_at", job.state == JobState::kCompleted ? finished : Json(nullptr)},
      {"failed_at", job.state == JobState::kFailed ? finished : Json(nullptr)},
      {"expired_at", job.state == JobState::kExpired ? finished : Json(nullptr)},
      {"cancelling_at", job.state == JobState::kCancelled ? side.value("cancelling_at", finished) : Json(nullptr)},
      {"cancelled_at", job.state == JobState::kCancelled ? side.value("cancelled_at", Json(nullptr)) : Json(nullptr)},
      {"request_counts", {{"total", job.counts.total}, {"completed", job.counts.completed}, {"failed", job.counts.failed}}},
      {"metadata", side.contains("metadata") ? side["metadata"] : Json(nullptr)},
  };
  // What the published answers say they used: Job::tokens once completed or expired, the merged
  // partial output's once cancelled (kept with the batch).
  std::optional<TokenUsage> used;
  if (job.state == JobState::kCompleted || job.state == JobState::kExpired) used = job.tokens;
  if (job.state == JobState::kCancelled && side.contains("tokens") && side["tokens"].is_object()) {
    const Json& kept = side["tokens"];
    auto count = [&](const char* name) {  // written by this server; still never trusted to be a number
      auto value = kept.find(name);
      // Signed as set here, unsigned as parsed back; never negative.
      if (value == kept.end() || !value->is_number_integer()) return int64_t{0};
      if (value->is_number_unsigned()) {
        return static_cast<int64_t>(std::min<uint64_t>(value->get<uint64_t>(), std::numeric_limits<int64_t>::max()));
      }
      return std::max<int64_t>(value->get<int64_t>(), 0);
    };
    // A batch cancelled and merged by an earlier release kept no reasoning total: 0.
    used = TokenUsage{count("prompt_tokens"), count("completion_tokens"), count("reasoning_tokens")};
  }
  if (used) {
    // In the Batch API's shape. cached_tokens is 0 by design (docs/openai-parameters.md, "Usage"):
    // cached tokens never reach an output line.
    batch["usage"] = {{"input_tokens", used->prompt_tokens},
                      {"input_tokens_details", {{"cached_tokens", 0}}},
                      {"output_tokens", used->completion_tokens},
                      {"output_tokens_details", {{"reasoning_tokens", used->reasoning_tokens}}},
                      {"total_tokens", used->total()}};
  }
  return batch;
}

void OpenAiApi::GetBatch(Call& call, const std::string& id) {
  auto not_found = [&] { call.Fail(404, absl::StrCat("No batch found with id '", id, "'."), "invalid_request_error"); };
  if (!IsJobId(id)) return not_found();
  auto job = deps_.store->GetJob(id);
  if (absl::IsNotFound(job.status()) || (job.ok() && !call.caller.SeesTeam(job->spec.team))) return not_found();
  if (!job.ok()) return call.Fail(job.status());
  auto batch = BatchObject(*job);
  if (!batch.ok()) return call.Fail(batch.status());
  call.Reply(200, *batch);
}

void OpenAiApi::ListBatches(Call& call) {
  int64_t limit = 20;
  if (std::string l = call.request.Param("limit"); !l.empty() && (!absl::SimpleAtoi(l, &limit) || limit < 1 || limit > 100)) {
    return call.Fail(400, "limit must be a whole number from 1 to 100.", "invalid_request_error", "limit");
  }
  const std::string after = call.request.Param("after");
  JobFilter filter;
  filter.team = call.caller.IsAdmin() ? "" : call.team;
  filter.limit = static_cast<int>(options_.max_listed_jobs);
  auto jobs = deps_.store->ListJobs(filter);  // newest first, as OpenAI lists
  if (!jobs.ok()) return call.Fail(jobs.status());
  size_t first = 0;
  if (!after.empty()) {
    while (first < jobs->size() && (*jobs)[first].id != after) ++first;
    first = first < jobs->size() ? first + 1 : jobs->size();
  }
  Json data = Json::array();
  for (size_t i = first; i < jobs->size() && static_cast<int64_t>(data.size()) < limit; ++i) {
    auto batch = BatchObject((*jobs)[i]);
    if (!batch.ok()) return call.Fail(batch.status());
    data.push_back(*std::move(batch));
  }
  const bool has_more = first + data.size() < jobs->size();
  call.Reply(200, Json{{"object", "list"},
                       {"data", data},
                       {"first_id", data.empty() ? Json(nullptr) : data.front()["id"]},
                       {"last_id", data.empty() ? Json(nullptr) : data.back()["id"]},
                       {"has_more", has_more}});
}

void OpenAiApi::CancelBatch(Call& call, const std::string& id) {
  auto not_found = [&] { call.Fail(404, absl::StrCat("No batch found with id '", id, "'."), "invalid_request_error"); };
  if (!IsJobId(id)) return not_found();
  auto job = deps_.store->GetJob(id);
  if (absl::IsNotFound(job.status()) || (job.ok() && !call.caller.SeesTeam(job->spec.team))) return not_found();
  if (!job.ok()) return call.Fail(job.status());
  if (job->state == JobState::kCancelled) {
    auto batch = BatchObject(*job);
    if (!batch.ok()) return call.Fail(batch.status());
    return call.Reply(200, *batch);
  }
  auto cancelled = deps_.store->CancelJob(id, deps_.clock->Now());
  if (absl::IsFailedPrecondition(cancelled.status())) {
    return call.Fail(409, absl::StrCat("Cannot cancel a batch with status '", BatchObject(*job).value_or(Json::object()).value("status", "ended"), "'."),
                     "invalid_request_error");
  }
  if (!cancelled.ok()) return call.Fail(cancelled.status());
  MINIONS_LOG(Info) << "job=" << id << " cancelled through the OpenAI API by " << call.caller.Describe();
  // The answer says cancelling (as OpenAI's does); the partial results are merged on the next look.
  Json side = Json::object();
  if (auto text = deps_.blobs->Get(keys::OpenAiBatch(cancelled->spec.team, id)); text.ok()) {
    auto parsed = ParseJson(*text);
    if (parsed.ok() && parsed->is_object()) side = *parsed;
  }
  side["cancelling_at"] = absl::ToUnixSeconds(deps_.clock->Now());
  (void)deps_.blobs->Put(keys::OpenAiBatch(cancelled->spec.team, id), DumpJson(side));
  Job shown = *cancelled;
  shown.state = JobState::kRunning;  // rendered as in progress, then relabelled
  auto batch = BatchObject(shown);
  if (!batch.ok()) return call.Fail(batch.status());
  (*batch)["status"] = "cancelling";
  (*batch)["cancelling_at"] = side["cancelling_at"];
  call.Reply(200, *batch);
}

// What POST /v1/batches asks for, its fields checked.
struct OpenAiApi::BatchRequest {
  std::string input_file_id;
  std::string endpoint;
  std::string window_text;
  absl::Duration window;
  Json metadata = nullptr;
};

std::optional<OpenAiApi::BatchRequest> OpenAiApi::ReadBatchRequest(Call& call) {
  auto body = call.JsonBody(options_.max_json_bytes);
  if (!body) return std::nullopt;
  auto string_field = [&](const char* name) -> std::optional<std::string> {
    if (!body->contains(name) || !(*body)[name].is_string()) {
      call.Fail(400, absl::StrCat("Missing required parameter: '", name, "' (a string)."), "invalid_request_error",
                name, "missing_required_parameter");
      return std::nullopt;
    }
    return (*body)[name].get<std::string>();
  };
  BatchRequest batch;
  for (auto [name, field] : {std::pair{"input_file_id", &batch.input_file_id}, std::pair{"endpoint", &batch.endpoint},
                             std::pair{"completion_window", &batch.window_text}}) {
    auto value = string_field(name);
    if (!value) return std::nullopt;
    *field = std::move(*value);
  }
  if (!kEndpoints.count(batch.endpoint)) {
    call.Fail(400,
              absl::StrCat("Invalid endpoint '", batch.endpoint.substr(0, 80),
                           "': Minions runs /v1/chat/completions, /v1/completions and /v1/embeddings."),
              "invalid_request_error", "endpoint");
    return std::nullopt;
  }
  auto window = ParseWindow(batch.window_text);
  if (!window) {
    call.Fail(400,
              absl::StrCat("Invalid completion_window '", batch.window_text.substr(0, 20),
                           "': give '24h' (or, on Minions, a whole number of s, m or h up to 168h)."),
              "invalid_request_error", "completion_window");
    return std::nullopt;
  }
  batch.window = *window;
  if (body->contains("metadata") && !(*body)["metadata"].is_null()) {
    batch.metadata = (*body)["metadata"];
    const Json& metadata = batch.metadata;
    bool ok = metadata.is_object() && metadata.size() <= 16;
    if (ok) {
      for (const auto& [k, v] : metadata.items()) ok &= k.size() <= 64 && v.is_string() && v.get<std::string>().size() <= 512;
    }
    if (!ok) {
      call.Fail(400, "metadata must be an object of at most 16 string values (keys up to 64 characters, values "
                     "up to 512).",
                "invalid_request_error", "metadata");
      return std::nullopt;
    }
  }
  return batch;
}

absl::StatusOr<Job> OpenAiApi::SubmitBatch(Call& call, const BatchRequest& request, const std::string& input_key,
                                           BatchInputCheck& check) {
  std::string model_reference;
  if (check.errors().empty()) {
    auto resolved = deps_.models->Resolve(call.team, check.model());
    if (absl::IsNotFound(resolved.status())) {
      check.Error("model_not_found", std::string(resolved.status().message()), 1, "body.model");
    } else if (!resolved.ok()) {
      return resolved.status();
    } else {
      model_reference = resolved->reference;
    }
  }
  Json side = {{"endpoint", request.endpoint},
               {"input_file_id", request.input_file_id},
               {"completion_window", request.window_text},
               {"metadata", request.metadata},
               {"model", check.model()}};
  absl::StatusOr<Job> job;
  if (!check.errors().empty()) {
    // Refused at validation: still a job (failed), so the CLI and dashboard show it too.
    side["errors"] = check.errors();
    JobSpec spec;
    spec.model = check.model().empty() ? "(none)" : check.model();
    spec.input_key = input_key;
    spec.completion_window = request.window;
    job = deps_.jobs->SubmitRefused(
        call.caller, spec, absl::StrCat("validation failed: ", check.errors()[0]["message"].get<std::string>()));
  } else {
    v1::SubmitJobRequest submit;
    submit.set_team(call.caller.IsAdmin() ? call.team : "");
    submit.set_model(model_reference);
    submit.set_input_key(input_key);
    submit.set_completion_window_ms(absl::ToInt64Milliseconds(request.window));
    job = deps_.jobs->Submit(call.caller, submit, keys::OpenAiFiles(call.team));
  }
  if (!job.ok()) return job.status();
  RETURN_IF_ERROR(deps_.blobs->Put(keys::OpenAiBatch(call.team, job->id), DumpJson(side)));
  return job;
}

void OpenAiApi::CreateBatch(Call& call) {
  std::optional<BatchRequest> request = ReadBatchRequest(call);
  if (!request) return;

  // A retried create (same Idempotency-Key, same team) gets the batch the first one made.
  const std::string idempotency = call.request.Header("idempotency-key");
  // Gives the key back however the create ends (a local class may use the API's privates).
  struct KeyHold {
    OpenAiApi* api;
    std::string key;
    ~KeyHold() {
      if (!key.empty()) api->ReleaseIdempotencyKey(key);
    }
  } hold{this, ""};
  std::string idempotency_key;
  if (!idempotency.empty()) {
    if (idempotency.size() > 255) {
      return call.Fail(400, "Idempotency-Key is longer than 255 characters.", "invalid_request_error");
    }
    idempotency_key = keys::OpenAiIdempotency(call.team, token::Hash(idempotency));
    HoldIdempotencyKey(idempotency_key);
    hold.key = idempotency_key;
    auto earlier = deps_.blobs->Get(idempotency_key);
    if (earlier.ok()) {
      auto job = deps_.store->GetJob(*earlier);
      if (job.ok()) {
        auto batch = BatchObject(*job);
        if (!batch.ok()) return call.Fail(batch.status());
        return call.Reply(200, *batch);
      }
    }
  }

  const std::string& input_file_id = request->input_file_id;
  if (!IsUploadId(input_file_id)) {
    return call.Fail(400, absl::StrCat("Invalid input_file_id '", input_file_id.substr(0, 80), "': no such file."),
                     "invalid_request_error", "input_file_id");
  }
  const std::string input_key = keys::OpenAiFiles(call.team) + input_file_id;
  auto size = deps_.blobs->Size(input_key + ".json");
  if (!size.ok()) {
    return call.Fail(absl::IsNotFound(size.status())
                         ? absl::InvalidArgumentError(absl::StrCat("Invalid input_file_id '", input_file_id, "': no such file."))
                         : size.status(),
                     "input_file_id");
  }

  BatchInputCheck check(request->endpoint, options_.max_errors);
  absl::Status read = deps_.blobs->Read(input_key, [&](std::string_view chunk) { return check.Feed(chunk); });
  if (!read.ok()) return call.Fail(read);
  check.Finish();
  auto job = SubmitBatch(call, *request, input_key, check);
  if (!job.ok()) return call.Fail(job.status());
  if (!idempotency_key.empty()) (void)deps_.blobs->Put(idempotency_key, job->id);
  auto batch = BatchObject(*job);
  if (!batch.ok()) return call.Fail(batch.status());
  call.Reply(200, *batch);
}

void OpenAiApi::HoldIdempotencyKey(const std::string& key) {
  absl::MutexLock lock(&idempotency_mu_);
  while (creating_.contains(key)) idempotency_released_.Wait(&idempotency_mu_);
  creating_.insert(key);
}

void OpenAiApi::ReleaseIdempotencyKey(const std::string& key) {
  absl::MutexLock lock(&idempotency_mu_);
  creating_.erase(key);
  idempotency_released_.SignalAll();
}

// --- models ---

namespace {

Json ModelObject(const CatalogModel& m) {
  return Json{{"id", m.name}, {"object", "model"}, {"created", absl::ToUnixSeconds(m.created)}, {"owned_by", "minions"}};
}

}  // namespace

void OpenAiApi::ListModels(Call& call) {
  auto models = deps_.models->List(call.team);
  if (!models.ok()) return call.Fail(models.status());
  Json data = Json::array();
  for (const CatalogModel& m : *models) data.push_back(ModelObject(m));
  call.Reply(200, Json{{"object", "list"}, {"data", data}});
}

void OpenAiApi::GetModel(Call& call, const std::string& id) {
  auto model = deps_.models->Resolve(call.team, id);
  if (absl::IsNotFound(model.status())) {
    return call.Fail(404, std::string(model.status().message()), "invalid_request_error", "model", "model_not_found");
  }
  if (!model.ok()) return call.Fail(model.status());
  call.Reply(200, ModelObject(*model));
}

}  // namespace minions::openai
