#pragma once
// The ModelStore contract (model_store_contract.cc): the MetadataStore contract's fixture with a
// helper for registry rows. A backend instantiates it next to the MetadataStore contract, with
// the same factories:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, ModelStoreContract, ::testing::Values(...));

#include "metadata_store_contract.h"

namespace minions {

class ModelStoreContract : public MetadataStoreContract {
 protected:
  static std::string Digest(char c) { return "sha256:" + std::string(64, c); }
  ModelRecord Model(const std::string& team, const std::string& name, char digest, int64_t size = 1000) {
    ModelRecord model;
    model.team = team;
    model.name = name;
    model.digest = Digest(digest);
    model.size_bytes = size;
    model.facts.architecture = "llama";
    model.facts.quantization = "Q4_K_M";
    model.facts.parameters = 1'234'567;
    model.facts.context_length = 4096;
    model.facts.layers = 16;
    model.facts.embedding_size = 2048;
    model.facts.heads = 32;
    model.facts.kv_heads = 8;
    model.facts.head_dim = 64;
    model.facts.vocab_size = 128256;
    model.blob_key = "models/" + team + "/sha256/" + std::string(64, digest);
    model.created_by = "alice";
    model.created_at = now_;
    return model;
  }
};

}  // namespace minions
