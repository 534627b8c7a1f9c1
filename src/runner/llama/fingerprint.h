#pragma once
// The system_fingerprint of the engine's answers (OpenAI's field): which build of Minions and of
// llama.cpp served them, with which model. It is derived, not measured, so that a record answered
// again by another attempt or another executor carries the same one.

#include <string>

struct llama_model;

namespace minions::llama_runner {

// "fp_" and 16 hex digits over Minions' version, llama.cpp's commit and build number, and the
// model's name, architecture, parameter count and size.
std::string SystemFingerprint(const llama_model* model);

}  // namespace minions::llama_runner
