#include "server/job_splitter.h"

#include <random>
#include <string>
#include <vector>

#include "blob/local/local_blob_store.h"
#include "runner/batch_record.h"
#include "server_test_util.h"

namespace minions::testing {
namespace {

// `n` valid request lines r0..r{n-1}, each ending in '\n'.
std::string Records(int n, int first = 0) {
  std::string out;
  for (int i = first; i < first + n; ++i) absl::StrAppend(&out, RequestLine(absl::StrCat("r", i)), "\n");
  return out;
}

// Feeds `input` in chunks whose sizes `next_size` chooses.
template <typename NextSize>
absl::StatusOr<SplitResult> SplitChunked(std::string_view input, int64_t shard_size, NextSize next_size) {
  InputSplitter splitter(shard_size);
  size_t at = 0;
  while (at < input.size()) {
    size_t n = std::min(input.size() - at, static_cast<size_t>(next_size()));
    splitter.Feed(input.substr(at, n));
    at += n;
  }
  return splitter.Finish();
}

absl::StatusOr<SplitResult> SplitWhole(std::string_view input, int64_t shard_size) {
  InputSplitter splitter(shard_size);
  splitter.Feed(input);
  return splitter.Finish();
}

// The invariants every split holds: tasks are numbered in order, their byte ranges are contiguous,
// newline-aligned and cover the input exactly, and each range holds exactly its task's records.
void ExpectCoversInput(const std::string& input, const SplitResult& result, int64_t shard_size) {
  ASSERT_FALSE(result.tasks.empty());
  std::string joined;
  int64_t next_record = 0;
  int64_t expected_begin = 0;
  for (size_t i = 0; i < result.tasks.size(); ++i) {
    const Task& task = result.tasks[i];
    SCOPED_TRACE(absl::StrCat("task ", i));
    EXPECT_EQ(task.index, static_cast<int64_t>(i));
    EXPECT_EQ(task.byte_begin, expected_begin);
    ASSERT_LE(task.byte_begin, task.byte_end);
    ASSERT_LE(task.byte_end, static_cast<int64_t>(input.size()));
    std::string range = input.substr(task.byte_begin, task.byte_end - task.byte_begin);
    // Newline-aligned: a range ends at a '\n' unless it is the end of the input.
    if (task.byte_end < static_cast<int64_t>(input.size())) {
      ASSERT_FALSE(range.empty());
      EXPECT_EQ(range.back(), '\n');
    }
    EXPECT_EQ(task.first_record, next_record);
    EXPECT_EQ(static_cast<int64_t>(SplitRecordLines(range).size()), task.n_records) << range;
    EXPECT_GT(task.n_records, 0);
    EXPECT_LE(task.n_records, shard_size);
    if (i + 1 < result.tasks.size()) {
      EXPECT_EQ(task.n_records, shard_size);  // only the last is short
    }
    next_record += task.n_records;
    expected_begin = task.byte_end;
    joined += range;
  }
  EXPECT_EQ(next_record, result.total_records);
  EXPECT_EQ(joined, input);
}

std::vector<int64_t> RecordsPerTask(const SplitResult& result) {
  std::vector<int64_t> out;
  for (const Task& t : result.tasks) out.push_back(t.n_records);
  return out;
}

void ExpectSameSplit(const SplitResult& a, const SplitResult& b) {
  EXPECT_EQ(a.total_records, b.total_records);
  EXPECT_EQ(a.invalid_records, b.invalid_records);
  EXPECT_EQ(a.first_invalid, b.first_invalid);
  ASSERT_EQ(a.tasks.size(), b.tasks.size());
  for (size_t i = 0; i < a.tasks.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("task ", i));
    EXPECT_EQ(a.tasks[i].index, b.tasks[i].index);
    EXPECT_EQ(a.tasks[i].first_record, b.tasks[i].first_record);
    EXPECT_EQ(a.tasks[i].n_records, b.tasks[i].n_records);
    EXPECT_EQ(a.tasks[i].byte_begin, b.tasks[i].byte_begin);
    EXPECT_EQ(a.tasks[i].byte_end, b.tasks[i].byte_end);
  }
}

TEST(InputSplitter, TheRequestLinesOfTheseTestsAreValid) {
  EXPECT_TRUE(ParseRecordLine(RequestLine("x")).ok()) << ParseRecordLine(RequestLine("x")).error_message;
}

TEST(InputSplitter, ShardSizeThatDividesTheInputMakesFullTasks) {
  std::string input = Records(6);
  ASSERT_OK_AND_ASSIGN(SplitResult result, SplitWhole(input, 3));
  EXPECT_EQ(result.total_records, 6);
  EXPECT_EQ(result.invalid_records, 0);
  EXPECT_EQ(result.first_invalid, "");
  EXPECT_THAT(RecordsPerTask(result), ::testing::ElementsAre(3, 3));
  EXPECT_EQ(result.tasks[1].first_record, 3);
  ExpectCoversInput(input, result, 3);
  // The first task ends exactly after the third line.
  EXPECT_EQ(result.tasks[0].byte_end, static_cast<int64_t>(Records(3).size()));
}

TEST(InputSplitter, RemainderGoesToAShortLastTask) {
  std::string input = Records(7);
  ASSERT_OK_AND_ASSIGN(SplitResult result, SplitWhole(input, 3));
  EXPECT_EQ(result.total_records, 7);
  EXPECT_THAT(RecordsPerTask(result), ::testing::ElementsAre(3, 3, 1));
  EXPECT_EQ(result.tasks[2].first_record, 6);
  ExpectCoversInput(input, result, 3);
}

TEST(InputSplitter, ShardBiggerThanTheInputMakesOneTask) {
  std::string input = Records(5);
  ASSERT_OK_AND_ASSIGN(SplitResult result, SplitWhole(input, 100));
  ASSERT_EQ(result.tasks.size(), 1u);
  EXPECT_EQ(result.tasks[0].n_records, 5);
  EXPECT_EQ(result.tasks[0].byte_begin, 0);
  EXPECT_EQ(result.tasks[0].byte_end, static_cast<int64_t>(input.size()));
  ExpectCoversInput(input, result, 100);
}

TEST(InputSplitter, ShardOfOneRecordPerTask) {
  std::string input = Records(4);
  ASSERT_OK_AND_ASSIGN(SplitResult result, SplitWhole(input, 1));
  EXPECT_THAT(RecordsPerTask(result), ::testing::ElementsAre(1, 1, 1, 1));
  ExpectCoversInput(input, result, 1);
}

TEST(InputSplitter, BlankLinesAreNotRecordsButStayInsideRanges) {
  std::string input = absl::StrCat("\n",                              // leading blank line
                                   RequestLine("a"), "\n",            //
                                   "\r\n",                            // CRLF blank
                                   RequestLine("b"), "\r\n",          // a record ending in CRLF
                                   "   \t \n",                        // whitespace only
                                   RequestLine("c"), "\n",            //
                                   "\n\n",                            // between shards
                                   RequestLine("d"), "\n");
  ASSERT_OK_AND_ASSIGN(SplitResult result, SplitWhole(input, 2));
  EXPECT_EQ(result.total_records, 4);
  EXPECT_EQ(result.invalid_records, 0) << result.first_invalid;
  EXPECT_THAT(RecordsPerTask(result), ::testing::ElementsAre(2, 2));
  ExpectCoversInput(input, result, 2);
  // The leading blank line belongs to the first task; the blank line after "b" to the second.
  EXPECT_EQ(result.tasks[0].byte_begin, 0);
  EXPECT_EQ(input.substr(result.tasks[1].byte_begin, 6), "   \t \n");
}

TEST(InputSplitter, TrailingBlankLinesAfterAFullShardStayInTheLastRange) {
  // The last record closes a task exactly; blank lines follow it. They are no records (no new
  // task), but the ranges still cover every byte of the input.
  for (const std::string tail : {"\n", "\n\n", "\r\n  \n", "  ", "\n\t"}) {
    SCOPED_TRACE(::testing::PrintToString(tail));
    std::string input = Records(4) + tail;
    ASSERT_OK_AND_ASSIGN(SplitResult result, SplitWhole(input, 2));
    EXPECT_EQ(result.total_records, 4);
    EXPECT_THAT(RecordsPerTask(result), ::testing::ElementsAre(2, 2));
    ExpectCoversInput(input, result, 2);
  }
}

TEST(InputSplitter, LastLineWithoutNewlineIsARecord) {
  std::string input = Records(4) + RequestLine("last");
  ASSERT_OK_AND_ASSIGN(SplitResult result, SplitWhole(input, 2));
  EXPECT_EQ(result.total_records, 5);
  EXPECT_THAT(RecordsPerTask(result), ::testing::ElementsAre(2, 2, 1));
  EXPECT_EQ(result.tasks.back().byte_end, static_cast<int64_t>(input.size()));
  ExpectCoversInput(input, result, 2);

  // Exactly at a shard boundary too.
  std::string even = Records(3) + RequestLine("last");
  ASSERT_OK_AND_ASSIGN(SplitResult even_result, SplitWhole(even, 2));
  EXPECT_THAT(RecordsPerTask(even_result), ::testing::ElementsAre(2, 2));
  ExpectCoversInput(even, even_result, 2);
}

TEST(InputSplitter, ChunkBoundariesAnywhereGiveTheSameSplit) {
  std::string input = absl::StrCat("\n", Records(5), "not json\n", "\r\n", Records(6, 5), "  \n",
                                   R"({"custom_id":"bad","method":"GET"})", "\n", Records(3, 11),
                                   RequestLine("tail"));
  for (int64_t shard : {1, 2, 3, 7, 100}) {
    SCOPED_TRACE(absl::StrCat("shard ", shard));
    ASSERT_OK_AND_ASSIGN(SplitResult whole, SplitWhole(input, shard));
    ExpectCoversInput(input, whole, shard);
    EXPECT_EQ(whole.total_records, 17);
    EXPECT_EQ(whole.invalid_records, 2);

    ASSERT_OK_AND_ASSIGN(SplitResult bytewise, SplitChunked(input, shard, [] { return 1; }));
    ExpectSameSplit(whole, bytewise);

    std::mt19937 rng(static_cast<unsigned>(shard));
    for (int round = 0; round < 20; ++round) {
      std::uniform_int_distribution<int> size(1, round % 2 == 0 ? 8 : 300);
      ASSERT_OK_AND_ASSIGN(SplitResult random, SplitChunked(input, shard, [&] { return size(rng); }));
      ExpectSameSplit(whole, random);
    }
  }
}

TEST(InputSplitter, InvalidLinesAreRecordsCountedAndTheFirstIsNamed) {
  // Line numbers count every line, blank ones included, as an editor shows them.
  std::string input = absl::StrCat(RequestLine("a"), "\n", "\n", "not json at all\n", RequestLine("b"), "\n",
                                   R"({"custom_id":"c"})", "\n");
  ASSERT_OK_AND_ASSIGN(SplitResult result, SplitWhole(input, 10));
  EXPECT_EQ(result.total_records, 4);
  EXPECT_EQ(result.invalid_records, 2);
  EXPECT_THAT(result.first_invalid, StartsWith("line 3: "));
  EXPECT_GT(result.first_invalid.size(), std::string("line 3: ").size());  // with a reason
  ASSERT_EQ(result.tasks.size(), 1u);
  EXPECT_EQ(result.tasks[0].n_records, 4);  // bad lines stay in their task
  ExpectCoversInput(input, result, 10);
}

TEST(InputSplitter, TwoRecordsWithOneCustomIdAreRefusedNamingTheirLines) {
  // Line 4 repeats line 1's id; line 6 repeats line 3's. Blank lines count, as an editor shows them.
  std::string input = absl::StrCat(RequestLine("a"), "\n", RequestLine("b"), "\n", RequestLine("c"), "\n",
                                   RequestLine("a"), "\n\n", RequestLine("c"), "\n");
  auto result = SplitWhole(input, 10);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("custom_id 'a' on line 4 is already on line 1"));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("1 more line repeats an earlier custom_id: line 6"));
  // Fed in pieces of any size, the same refusal.
  int size = 1;
  auto chunked = SplitChunked(input, 10, [&] { return size++ % 7 + 1; });
  EXPECT_EQ(chunked.status(), result.status());
  // An invalid line's id counts too (its error line would carry it), an overlong id does not.
  std::string bad = absl::StrCat(RequestLine("a"), "\n", R"({"custom_id":"a"})", "\n");
  EXPECT_THAT(std::string(SplitWhole(bad, 10).status().message()), HasSubstr("on line 2 is already on line 1"));
  const std::string long_id(600, 'x');
  std::string overlong = absl::StrCat(RequestLine(long_id), "\n", RequestLine(long_id + "y"), "\n", RequestLine("z"), "\n");
  EXPECT_TRUE(SplitWhole(overlong, 10).ok());
}

TEST(DuplicateCustomIds, RemembersHashesNotIdsAndSummarisesTheFirstFew) {
  DuplicateCustomIds ids;
  EXPECT_EQ(ids.See("a", 1), 0);
  EXPECT_EQ(ids.See("b", 2), 0);
  EXPECT_EQ(ids.Refusal(), "");
  EXPECT_EQ(ids.See("a", 3), 1);
  for (int line = 4; line < 12; ++line) EXPECT_EQ(ids.See("b", line), 2);
  EXPECT_EQ(ids.count(), 9);
  EXPECT_EQ(ids.first().size(), DuplicateCustomIds::kKeptDuplicates);
  EXPECT_EQ(ids.Refusal(),
            "custom_id 'a' on line 3 is already on line 1 (8 more lines repeat an earlier custom_id: lines 4, 5, 6, 7, "
            "...); each record needs a custom_id of its own (its answer is found by it)");
  // A long id is shown cut short.
  DuplicateCustomIds long_ids;
  const std::string id(5000, 'q');
  long_ids.See(id, 1);
  EXPECT_EQ(long_ids.See(id, 2), 1);
  EXPECT_EQ(long_ids.first()[0].custom_id.size(), DuplicateCustomIds::kShownIdBytes);
}

TEST(InputSplitter, EmptyInputHasNoRecords) {
  auto result = SplitWhole("", 10);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("no records"));

  InputSplitter never_fed(10);
  EXPECT_EQ(never_fed.Finish().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InputSplitter, OnlyBlankLinesHaveNoRecords) {
  for (const std::string input : {"\n", "\n\n\n", "  \n\t\n\r\n", " \r\n \t "}) {
    SCOPED_TRACE(::testing::PrintToString(input));
    auto result = SplitChunked(input, 10, [] { return 1; });
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(result.status().message()), HasSubstr("no records"));
  }
}

TEST(InputSplitter, BinaryGarbageIsRefused) {
  std::string garbage;
  std::mt19937 rng(7);
  for (int i = 0; i < 4096; ++i) garbage.push_back(static_cast<char>(rng() & 0xff));
  garbage.append("\x00\xff\xfe\n", 4);
  auto result = SplitWhole(garbage, 100);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("no line of the input is a valid request"));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("line 1: "));
}

TEST(InputSplitter, CsvIsRefused) {
  std::string csv = "custom_id,prompt\nr0,hello there\nr1,\"quoted, with comma\"\n";
  auto result = SplitChunked(csv, 1, [] { return 5; });
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("no line of the input is a valid request"));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("line 1: "));
}

TEST(InputSplitter, OneValidLineAmongGarbageIsAccepted) {
  std::string input = absl::StrCat("garbage\n", "more garbage\n", RequestLine("ok"), "\n");
  ASSERT_OK_AND_ASSIGN(SplitResult result, SplitWhole(input, 2));
  EXPECT_EQ(result.total_records, 3);
  EXPECT_EQ(result.invalid_records, 2);
  EXPECT_THAT(result.first_invalid, StartsWith("line 1: "));
  ExpectCoversInput(input, result, 2);
}

TEST(SplitInput, ReadsFromTheBlobStoreAcrossItsChunks) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto blobs, LocalBlobStore::Open(dir.path()));
  // Large enough to span several read chunks of the store.
  std::string input;
  for (int i = 0; i < 3000; ++i) {
    absl::StrAppend(&input, RequestLine(absl::StrCat("r", i), std::string(40 + i % 70, 'x')), "\n");
    if (i % 97 == 0) input += "\r\n";
  }
  ASSERT_OK(blobs->Put("inputs/big.jsonl", input));
  ASSERT_OK_AND_ASSIGN(SplitResult from_store, SplitInput(*blobs, "inputs/big.jsonl", 128));
  ASSERT_OK_AND_ASSIGN(SplitResult whole, SplitWhole(input, 128));
  ExpectSameSplit(whole, from_store);
  EXPECT_EQ(from_store.total_records, 3000);
  EXPECT_EQ(from_store.tasks.size(), 24u);  // 23 * 128 + 56
  ExpectCoversInput(input, from_store, 128);
}

TEST(SplitInput, RefusesANonPositiveShardSizeAndAMissingObject) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto blobs, LocalBlobStore::Open(dir.path()));
  ASSERT_OK(blobs->Put("inputs/in.jsonl", Records(3)));
  EXPECT_EQ(SplitInput(*blobs, "inputs/in.jsonl", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitInput(*blobs, "inputs/in.jsonl", -5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitInput(*blobs, "inputs/missing.jsonl", 10).status().code(), absl::StatusCode::kNotFound);
}

// The attack of issue 17: one 7 MB input at shard size 1 made 200,000 tasks. The splitter refuses
// it with the shard size that would fit, and holds no task list of that size meanwhile.
TEST(InputSplitter, MoreTasksThanAJobMayHaveAreRefusedWithAShardSizeThatFits) {
  std::string input;
  for (int i = 0; i < 200'000; ++i) absl::StrAppend(&input, R"({"custom_id":")", i, R"(","prompt":"p"})", "\n");
  auto split = SplitWhole(input, 1);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(split.status().message(), HasSubstr("200000 records at shard size 1 make 200000 tasks"));
  EXPECT_THAT(split.status().message(), HasSubstr("at most 10000"));
  EXPECT_THAT(split.status().message(), HasSubstr("--shard-size 20"));
  // The shard size it names does fit.
  auto fits = SplitWhole(input, 20);
  ASSERT_OK(fits);
  EXPECT_EQ(fits->tasks.size(), 10000u);
  EXPECT_EQ(fits->total_records, 200000);
}

TEST(InputSplitter, TheTaskCeilingCountsTheLastShortTask) {
  // 7 records at shard size 2 make 4 tasks: refused under a ceiling of 3, accepted under 4.
  InputSplitter three(2, 3);
  three.Feed(Records(7));
  EXPECT_THAT(three.Finish().status().message(), HasSubstr("make 4 tasks; a job may have at most 3"));
  InputSplitter four(2, 4);
  four.Feed(Records(7));
  ASSERT_OK_AND_ASSIGN(SplitResult result, four.Finish());
  EXPECT_EQ(result.tasks.size(), 4u);
}

TEST(InputSplitter, ANestedLineIsThatRecordsErrorAndTheOthersStay) {
  std::string nested = R"({"custom_id":"deep","prompt":)" + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}";
  std::string input = Records(2) + nested + "\n" + Records(2, 2);
  for (size_t piece : {size_t{7}, size_t{4096}, input.size()}) {
    auto split = SplitChunked(input, 2, [&] { return piece; });
    ASSERT_OK(split);
    EXPECT_EQ(split->total_records, 5);
    EXPECT_EQ(split->invalid_records, 1);
    EXPECT_THAT(split->first_invalid, HasSubstr("line 3: JSON nested deeper than 64"));
    ExpectCoversInput(input, *split, 2);
  }
}

TEST(InputSplitter, AnOverlongLineIsThatRecordsErrorInBoundedMemory) {
  // 9 MiB without a newline between two good records, fed in small pieces.
  std::string huge = R"({"custom_id":"huge","prompt":")" + std::string(9 << 20, 'x') + R"("})";
  std::string input = Records(1) + huge + "\n" + Records(1, 1);
  auto split = SplitChunked(input, 10, [] { return 65536; });
  ASSERT_OK(split);
  EXPECT_EQ(split->total_records, 3);
  EXPECT_EQ(split->invalid_records, 1);
  EXPECT_THAT(split->first_invalid, HasSubstr(absl::StrCat("line 2: the record is ", huge.size(), " bytes")));
  ExpectCoversInput(input, *split, 10);
  // A last line without '\n' too.
  auto last = SplitChunked(Records(1) + huge, 10, [] { return 65536; });
  ASSERT_OK(last);
  EXPECT_EQ(last->invalid_records, 1);
  // And a line of only blanks stays a blank line whatever its length.
  auto blanks = SplitChunked(Records(1) + std::string(5 << 20, ' ') + "\n" + Records(1, 1), 10, [] { return 4096; });
  ASSERT_OK(blanks);
  EXPECT_EQ(blanks->total_records, 2);
  EXPECT_EQ(blanks->invalid_records, 0);
  // But blanks with something after the kept prefix are a record (as the executor will see it).
  std::string tail_line = std::string(5 << 20, ' ') + "x";
  auto not_blank = SplitChunked(Records(1) + tail_line + "\n" + Records(1, 1), 10, [] { return 4096; });
  ASSERT_OK(not_blank);
  EXPECT_EQ(not_blank->total_records, 3);
  EXPECT_EQ(not_blank->invalid_records, 1);
  EXPECT_EQ(SplitRecordLines(Records(1) + tail_line + "\n" + Records(1, 1)).size(), 3u);
}

}  // namespace
}  // namespace minions::testing
