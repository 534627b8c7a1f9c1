// JSON schemas as a record may carry them (response_format json_schema, llama.cpp's json_schema),
// through the runner's schema-to-grammar path (its own checks, then llama.cpp's converter): never a
// crash, a hang or a runaway allocation; an error is a message that names the problem. A grammar
// the converter writes names no token ids (the runner masks it through the token forest, exact
// only for grammars that match text: grammar_mask.h).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runner/llama/record_sampler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;  // a schema is part of a 4 MiB record; bigger adds nothing here
  std::string schema(reinterpret_cast<const char*>(data), size);
  auto grammar = minions::llama_runner::SchemaToGrammar(schema);
  if (grammar.ok() && grammar->find("root") == std::string::npos) std::abort();
  if (grammar.ok() && !minions::llama_runner::GrammarMask::JudgesTextOnly(*grammar)) std::abort();
  if (!grammar.ok() && grammar.status().message().empty()) std::abort();
  return 0;
}
