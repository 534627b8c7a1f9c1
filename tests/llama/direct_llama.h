#pragma once
// DirectModel: a model and one context through llama.cpp's plain API, one prompt at a time: the
// reference the engine tests compare LlamaEngine with. Deliberately shares no code with the
// engine. Owns the model and the context; one thread.

#include <functional>
#include <string>
#include <vector>

#include "llama.h"

namespace minions::llama_runner {

class DirectModel {
 public:
  // Loads `path` and makes a context of llama.cpp's default parameters as `configure` sets them
  // (it sees the loaded model). !ok() when either fails.
  DirectModel(const std::string& path,
              const std::function<void(llama_model*, llama_context_params&)>& configure) {
    model_ = llama_model_load_from_file(path.c_str(), llama_model_default_params());
    if (!model_) return;
    llama_context_params cp = llama_context_default_params();
    configure(model_, cp);
    ctx_ = llama_init_from_model(model_, cp);
  }
  ~DirectModel() {
    if (ctx_) llama_free(ctx_);
    if (model_) llama_model_free(model_);
  }
  DirectModel(const DirectModel&) = delete;
  DirectModel& operator=(const DirectModel&) = delete;

  bool ok() const { return ctx_ != nullptr; }
  const llama_vocab* vocab() const { return llama_model_get_vocab(model_); }

  std::vector<llama_token> Tokenize(const std::string& text, bool parse_special) const {
    std::vector<llama_token> tokens(text.size() + 8);
    int n = llama_tokenize(vocab(), text.data(), (int)text.size(), tokens.data(), (int)tokens.size(), true, parse_special);
    tokens.resize(n);
    return tokens;
  }

 protected:
  llama_model* model_ = nullptr;
  llama_context* ctx_ = nullptr;
};

}  // namespace minions::llama_runner
